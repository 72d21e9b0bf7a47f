"""``hexhelix gpus``: list the built-in GPU catalog with its sources."""

from __future__ import annotations

import argparse

from hexhelix.ir.catalog import CATALOG

from .common import emit_json


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("gpus", help="list the built-in GPU catalog",
                       description="Dense bf16/fp16 tensor TFLOPS, memory and links of the catalog GPUs.")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.json:
        emit_json({name: g.to_dict() for name, g in CATALOG.items()})
        return 0
    print(f"{'GPU':<16} {'TFLOPS':>8} {'GiB':>5} {'HBM GB/s':>9} {'intra GB/s':>10}  source")
    for g in CATALOG.values():
        print(f"{g.name:<16} {g.tflops:>8.1f} {g.memory_gib:>5.0f} {g.mem_GBps:>9.0f} {g.intra_GBps:>10.0f}  {g.source}")
    return 0
