"""``hexhelix ir``: export the IR (cluster, device graph, model, layer operator graphs) as JSON."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from hexhelix.ir.document import build_ir
from hexhelix.ir.errors import InvalidInputError

from .common import add_model_args, load_inputs


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("ir", help="export the IR of a model on a cluster as versioned JSON",
                       description="Write the IR (schema hexhelix.ir/1): cluster, device graph, model, "
                                   "training settings and one layer's operator graph per TP degree.")
    add_model_args(p)
    p.add_argument("--tp", type=int, action="append", help="TP degree of a layer graph (repeatable; "
                   "default: every power of two up to the largest node)")
    p.add_argument("--sp", action="store_true", help="sequence parallelism in the layer graphs (default: "
                   "on unless --no-sp)")
    p.add_argument("-o", "--output", help="output file (default: stdout)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    cluster, model, training, _ = load_inputs(args)
    assert cluster is not None
    if args.sp and args.no_sp:
        raise InvalidInputError("--sp and --no-sp contradict each other; give one", field="--sp")
    for t in args.tp or []:
        try:
            model.check_tp(t)
        except InvalidInputError as err:
            raise InvalidInputError(err.message, field="--tp") from None
    doc = build_ir(cluster, model, training, tps=args.tp, sequence_parallel=True if args.sp else None)
    text = doc.to_json()
    if args.output:
        try:
            Path(args.output).write_text(text)
        except OSError as err:
            raise InvalidInputError(f"cannot write the IR ({err.strerror})", source=args.output) from None
        print(f"wrote {args.output} ({len(doc.layer_graphs)} layer graphs, {cluster.num_gpus} GPUs)",
              file=sys.stderr)
    else:
        sys.stdout.write(text)
    return 0
