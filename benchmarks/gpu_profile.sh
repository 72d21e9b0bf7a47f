#!/usr/bin/env bash
# Profile one CUDA GPU with `hexhelix profile --backend nccl` and store the profile under
# examples/profiles/ with the date and device in its name. Meant for one short call on a lent GPU
# machine (about 1-2 minutes on an H100/H200-class device; the script caps it at 170 s):
#
#   bash benchmarks/gpu_profile.sh            # Llama-2-7B shapes, seq 4096, TP 1,2,4,8
#   MODEL=tiny SEQ=256 bash benchmarks/gpu_profile.sh
#
# On one GPU there is no peer to communicate with: collectives and α/β are not measured (the
# profile keeps the documented link defaults and says so in meta.comm); the overlap of compute
# with communication is measured against a device-to-host copy on a side stream (a proxy, marked
# "copy stream" in meta.oef_measured). It then prints how the profile changes the cost model's
# prediction for the example plan against the documented defaults.
set -euo pipefail
cd "$(dirname "$0")/.."
MODEL="${MODEL:-llama2-7b}"
SEQ="${SEQ:-4096}"
TP="${TP:-1,2,4,8}"
NGPU="$(python -c 'import torch; print(torch.cuda.device_count())')"
if [ "$NGPU" -lt 1 ]; then echo "gpu_profile.sh: no CUDA device" >&2; exit 2; fi
DEV="$(python -c 'import torch; print(torch.cuda.get_device_name(0).replace("NVIDIA","").strip().replace(" ","-"))')"
OUT="examples/profiles/$(date -u +%Y-%m-%d)-${DEV}-nccl.json"
mkdir -p examples/profiles
NPROC=$(( NGPU < 2 ? 1 : (NGPU > 4 ? 4 : NGPU) ))
timeout 170 python -m hexhelix profile --backend nccl --nproc "$NPROC" --model "$MODEL" --seq-len "$SEQ" \
    --tp "$TP" --warmup 3 --repeats 7 --threads 0 --timeout 120 -o "$OUT"
echo "profile: $OUT"
# The difference the profile makes to a plan's predicted iteration time (a plan on 8 GPUs of the
# profiled type; only that type's rows of the profile apply).
python - "$OUT" <<'PY'
import sys
from hexhelix.ir.plan import Plan
from hexhelix.ir.profile import DEFAULT_PROFILE, load_profile
from hexhelix.solver.evaluate import evaluate
prof = load_profile(sys.argv[1])
gt = prof.meta["gpu_type"]
print(f"device {prof.device}: measured peak {prof.meta['measured_peak_tflops']:.0f} TFLOPS, "
      f"memory {prof.meta['measured_mem_GBps']:.0f} GB/s; efficiency vs datasheet "
      + ", ".join(f"{k} {v:.2f}" for k, v in prof.per_gpu_efficiency.get(gt, {}).items())
      + f"; layer overhead {prof.meta.get('overhead_folded', 1.0):.2f}x; reserve {prof.runtime_reserve_bytes / 2**30:.2f} GiB")
for k, v in sorted(prof.meta.get("oef_measured", {}).items()):
    print(f"  OEF {k}: {v['oef']:.2f}")
from hexhelix.ir.catalog import lookup_gpu
from hexhelix.ir.cluster import Cluster
from hexhelix.ir.model import PRESETS, TrainingConfig
from hexhelix.ir.plan import PipelinePlan, PlanProblem, StagePlan
if lookup_gpu(gt) is None:
    sys.exit(f"{gt} is not in the catalog; compare with a cluster file that defines it")
cl = Cluster.from_dict({"name": "one-node", "nodes": [{"name": "n0", "gpu": gt, "count": 8}]})
model = PRESETS[prof.meta["options"]["model"]] if prof.meta["options"]["model"] in PRESETS else PRESETS["llama2-7b"]
tr = TrainingConfig(global_batch=16, micro_batch=1, seq_len=int(prof.meta["options"]["seq_len"]))
L = model.layers
plan = Plan(problem=PlanProblem(cluster=cl, model=model, training=tr, schedule="1f1b"), pipelines=(
    PipelinePlan(micro_batches=16, stages=(StagePlan(node=0, gpus=(0, 1, 2, 3), layers=(0, L // 2)),
                                           StagePlan(node=0, gpus=(4, 5, 6, 7), layers=(L // 2, L)))),))
a, b = evaluate(plan, DEFAULT_PROFILE), evaluate(plan, prof)
print(f"plan 8x{gt}, 2 stages x TP4, {model.name}, seq {tr.seq_len}, 16 micro-batches: iteration "
      f"{a.iteration_time_s:.2f} s (MFU {a.mfu:.1%}) with the documented defaults, {b.iteration_time_s:.2f} s "
      f"(MFU {b.mfu:.1%}) with this profile ({b.iteration_time_s / a.iteration_time_s - 1:+.1%})")
PY
