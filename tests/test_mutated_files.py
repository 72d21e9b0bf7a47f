"""Every file the CLI reads, with one value replaced by a value of another kind (or removed), either
works or is refused with exit code 2 and one stderr line: no traceback, no other exit code, no hang.
Seeded samples of the mutations; the plan and its compiled two-strand program are small."""

from __future__ import annotations

import contextlib
import copy
import io
import json
import random
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from compile_cases import make_plan
from hexhelix.solver.compile import compile_plan

from hexhelix.cli import main

ODD_VALUES = [None, "x", -1, 0, 1e308, float("nan"), [], {}, True, 10**12, -0.5, [1, 2]]
SECONDS_PER_RUN = 20


def _paths(doc: Any, prefix: tuple = ()) -> Iterator[tuple]:
    """Every place in ``doc`` (the first three items of each list)."""
    yield prefix
    if isinstance(doc, dict):
        for key, value in doc.items():
            yield from _paths(value, (*prefix, key))
    elif isinstance(doc, list):
        for i, value in enumerate(doc[:3]):
            yield from _paths(value, (*prefix, i))


def _mutated(doc: Any, path: tuple, value: Any, delete: bool) -> Any:
    doc = copy.deepcopy(doc)
    if not path:
        return value
    cur = doc
    for key in path[:-1]:
        cur = cur[key]
    if delete and isinstance(cur, dict):
        del cur[path[-1]]
    else:
        cur[path[-1]] = value
    return doc


def _sample(doc: Any, count: int, seed: int) -> list[tuple[tuple, Any, bool]]:
    places = [p for p in _paths(doc) if p]
    cases = [(p, v, False) for p in places for v in ODD_VALUES] + [(p, None, True) for p in places]
    return random.Random(seed).sample(cases, min(count, len(cases)))


def _timeout(*_: Any) -> None:
    raise TimeoutError(f"no answer within {SECONDS_PER_RUN} s")


def _run(argv: list[str]) -> tuple[int, str]:
    err = io.StringIO()
    old = signal.signal(signal.SIGALRM, _timeout)
    signal.alarm(SECONDS_PER_RUN)
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            rc = main(argv)
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
    return rc, err.getvalue()


# mutations that once gave a traceback, a hang or an exhausted memory (always run, beside the sample)
PLAN_REGRESSIONS = [(("problem", "model", "tie_embeddings"), []),
                    (("problem", "cluster", "gpu_types", "A40", "memory_gib"), 1e308),
                    (("problem", "training", "state_bytes_per_param"), float("nan")),
                    (("problem", "model", "layers"), 10**12)]
PROGRAM_REGRESSIONS = [(("strands",), 10**12), (("pipes", 0, "micro_batches"), 10**12),
                       (("stages", 1, "layers", 1), 10**12), (("ranks", 1, "state_bytes"), float("nan")),
                       (("programs", 0, 1, "bytes"), {}), (("meta", "pair_oef"), {}),
                       (("grad_sync", "b0", 0, "hi"), "x")]


def _check_every_mutation(tmp_path: Path, doc: Any, commands: list[list[str]], count: int, seed: int,
                          pinned: list[tuple[tuple, Any]]) -> None:
    path = tmp_path / "mutated.json"
    for place, value, delete in [*((p, v, False) for p, v in pinned), *_sample(doc, count, seed)]:
        path.write_text(json.dumps(_mutated(doc, place, value, delete)))
        for command in commands:
            argv = [a.replace("{f}", str(path)) for a in command]
            what = f"{' '.join(argv[:1])} with {'no' if delete else repr(value)} at {place}"
            rc, err = _run(argv)
            assert "Traceback" not in err and rc in (0, 1, 2), (what, rc, err[-500:])
            if rc == 2:
                assert len(err.strip().splitlines()) == 1, (what, err)


@pytest.fixture(scope="module")
def plan_doc() -> dict[str, Any]:
    return json.loads(json.dumps(make_plan([(2, 4, (1, 2)), (1, 2, (2,))], "1f1b").to_dict()))


def test_every_mutated_plan_file_is_scored_or_refused_in_one_line(tmp_path: Path, plan_doc) -> None:
    _check_every_mutation(tmp_path, plan_doc, [["evaluate", "{f}"], ["compile", "{f}", "-o", str(tmp_path / "p.json")]],
                          count=150, seed=1, pinned=PLAN_REGRESSIONS)


def test_every_mutated_program_file_is_checked_or_refused_in_one_line(tmp_path: Path) -> None:
    prog = compile_plan(make_plan([(2, 4, (1, 2)), (1, 2, (2,))], "wshape"), pairing={1: 0.2})
    _check_every_mutation(tmp_path, prog.to_dict(), [["validate", "{f}"], ["simulate", "{f}"]], count=200, seed=2,
                          pinned=PROGRAM_REGRESSIONS)
