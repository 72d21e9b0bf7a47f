"""Flags shared by several subcommands and the loaders behind them."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from hexhelix.ir.cluster import Cluster, load_cluster
from hexhelix.ir.errors import InvalidInputError
from hexhelix.ir.model import RECOMPUTE_MODES, ModelConfig, TrainingConfig, load_model
from hexhelix.ir.profile import Profile, load_profile

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def add_model_args(p: argparse.ArgumentParser, *, cluster: bool = True) -> None:
    """--model, --cluster and the training flags (--global-batch, --micro-batch, --seq-len, ...)."""
    p.add_argument("--model", required=True,
                   help="preset (llama2-7b, llama2-13b, llama-30b, llama2-70b, tiny) or a HF config.json path")
    if cluster:
        p.add_argument("--cluster", required=True,
                       help="cluster YAML/JSON file, or the name of a built-in example (examples/clusters)")
    p.add_argument("--global-batch", type=int, default=64, help="sequences per optimizer step (default 64)")
    p.add_argument("--micro-batch", type=int, default=1, help="sequences per micro-batch (default 1)")
    p.add_argument("--seq-len", type=int, default=4096, help="sequence length (default 4096)")
    p.add_argument("--recompute", choices=RECOMPUTE_MODES, default="none", help="activation recompute")
    p.add_argument("--no-sp", action="store_true", help="disable sequence parallelism in TP groups")
    p.add_argument("--profile", default=None, help="profile JSON from `hexhelix profile` (default: documented defaults)")


def resolve_cluster_path(spec: str) -> Path:
    """A path, or the stem of a file in examples/clusters (``mixed-a100-a40-t4``)."""
    p = Path(spec)
    if p.exists():
        return p
    for suffix in (".yaml", ".yml", ".json"):
        cand = EXAMPLES / "clusters" / f"{spec}{suffix}"
        if cand.exists():
            return cand
    return p  # load_cluster reports "file not found" with this name


def load_inputs(args: argparse.Namespace) -> tuple[Cluster | None, ModelConfig, TrainingConfig, Profile]:
    """Build (cluster, model, training, profile) from parsed flags; errors name the flag or file."""
    try:
        model = load_model(args.model)
    except InvalidInputError as err:
        if err.source is None:  # a bad preset name, not a file: name the flag
            raise InvalidInputError(err.message, field="--model") from None
        raise
    cluster = load_cluster(resolve_cluster_path(args.cluster)) if getattr(args, "cluster", None) else None
    try:
        training = TrainingConfig(global_batch=args.global_batch, micro_batch=args.micro_batch,
                                  seq_len=args.seq_len, recompute=args.recompute,
                                  sequence_parallel=not args.no_sp)
    except InvalidInputError as err:
        raise InvalidInputError(err.message, field="--" + (err.field or "").replace("_", "-")) from None
    return cluster, model, training, load_profile(args.profile)


def emit_json(obj: Any, out: str | None = None) -> None:
    """Write ``obj`` as JSON to ``out`` (a path) or stdout."""
    text = json.dumps(obj, indent=1) + "\n"
    if out:
        Path(out).write_text(text)
    else:
        sys.stdout.write(text)


def progress(message: str) -> None:
    """One progress line on stderr (stdout stays clean for --json)."""
    print(message, file=sys.stderr, flush=True)


def cell(v: float | None, spec: str) -> str:
    """``v`` in the format ``spec`` (e.g. ``'9.4f'``, ``'10,.0f'``); a missing value is a "-" as wide
    as the column, so tables stay aligned."""
    width = int(spec.lstrip(",").split(".")[0].replace(",", "") or 0)
    return f"{'-':>{width}}" if v is None else format(v, spec)
