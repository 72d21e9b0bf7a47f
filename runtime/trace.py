"""Chrome trace export of a simulated timeline (Trace Event Format; opens in Perfetto and
chrome://tracing).

One process per rank, one thread (track) per stream: compute, intra-node link, inter-node link,
plus a counter track of the rank's live activation and receive-buffer memory.
Every instruction that took time is a complete event (``ph: "X"``) named by its token; each
point-to-point transfer carries a flow arrow (``ph: "s"`` on the SEND's slice, ``ph: "f"`` on the
RECV's) so Perfetto draws the message from sender to receiver.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from hexhelix.ir.errors import InvalidInputError

from .sim_result import STREAMS, SimResult

__all__ = ["chrome_trace", "write_chrome_trace"]

_US = 1e6  # trace timestamps are microseconds


def chrome_trace(result: SimResult) -> dict[str, Any]:
    """The trace as a JSON-ready dict (``traceEvents`` plus metadata)."""
    tl = result.timeline
    if tl is None:
        raise InvalidInputError("the simulation ran with record=False; rerun with record=True for a trace")
    prog = tl.program
    events: list[dict[str, Any]] = []
    for r, info in enumerate(prog.ranks):
        events.append({"ph": "M", "name": "process_name", "pid": r,
                       "args": {"name": f"rank {r} ({info.gpu} on {info.node})"}})
        events.append({"ph": "M", "name": "process_sort_index", "pid": r, "args": {"sort_index": r}})
        for tid, stream in enumerate(STREAMS):
            events.append({"ph": "M", "name": "thread_name", "pid": r, "tid": tid, "args": {"name": stream}})
    stream_of: list[dict[int, int]] = []
    for r, spans in enumerate(tl.spans):
        code = prog.programs[r]
        where: dict[int, int] = {}
        stream_of.append(where)
        for start, end, stream, i in spans:
            where[i] = stream
            ins = code[i]
            events.append({"ph": "X", "name": str(ins), "cat": ins.op.value, "pid": r, "tid": stream,
                           "ts": start * _US, "dur": (end - start) * _US,
                           "args": {"index": i, "bytes": ins.bytes}})
    for fid, (src, si, dst, ri, start, _end) in enumerate(tl.flows):
        name = f"{prog.programs[src][si]} -> {prog.programs[dst][ri]}"
        # the arrow leaves the SEND's slice and enters the RECV's (both span the transfer)
        events.append({"ph": "s", "id": fid, "name": name, "cat": "p2p", "pid": src,
                       "tid": stream_of[src].get(si, 0), "ts": start * _US})
        events.append({"ph": "f", "bp": "e", "id": fid, "name": name, "cat": "p2p", "pid": dst,
                       "tid": stream_of[dst].get(ri, 0), "ts": start * _US})
    for r, curve in enumerate(tl.memory):
        for when, live in curve:
            events.append({"ph": "C", "name": "live activation + receive buffers (GiB)", "pid": r,
                           "ts": when * _US, "args": {"GiB": live / 2**30}})
    return {"traceEvents": events, "displayTimeUnit": "ms",
            "otherData": {"schedule": prog.schedule, "makespan_s": result.makespan_s,
                          "bubble_fraction": result.bubble_fraction}}


def write_chrome_trace(result: SimResult, path: str | Path) -> Path:
    """Write the trace JSON to ``path`` and return it."""
    p = Path(path)
    try:
        p.write_text(json.dumps(chrome_trace(result)))
    except OSError as err:
        raise InvalidInputError(f"cannot write trace ({err.strerror})", source=str(p)) from None
    return p
