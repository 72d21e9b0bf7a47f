"""A call in a forked child answers with its value, or with one line when it raises or dies, and
one that overruns is stopped (solver/forked.py)."""

from __future__ import annotations

import os
import time

import pytest
from hexhelix.solver.forked import fork_available, fork_call

pytestmark = pytest.mark.skipif(not fork_available(), reason="needs the fork start method")


def _square(x: int) -> int:
    return x * x


def _raises() -> None:
    raise ValueError("no such layer")


def _dies() -> None:
    os._exit(3)


def _sleeps(seconds: float) -> str:
    time.sleep(seconds)
    return "late"


def test_a_forked_call_sends_back_its_value() -> None:
    call = fork_call(_square, 7, name="test-square")
    got = call.wait(10.0)
    call.stop(grace=1.0)
    assert got is not None and got.value == 49 and got.error == ""
    assert not call.process.is_alive()


@pytest.mark.parametrize(("fn", "says"), [(_raises, "ValueError: no such layer"), (_dies, "exited without a result")])
def test_a_call_that_raises_or_dies_answers_with_one_line(fn, says: str) -> None:
    call = fork_call(fn, name="test-broken")
    got = call.wait(10.0)
    call.stop(grace=1.0)
    assert got is not None and got.value is None and says in got.error


@pytest.mark.parametrize("kill", [False, True])
def test_a_call_past_its_wait_gives_none_and_is_stopped(kill: bool) -> None:
    call = fork_call(_sleeps, 30.0, name="test-sleeper")
    t0 = time.monotonic()
    assert call.wait(0.2) is None
    assert call.process.is_alive()
    call.stop(kill=kill)
    assert not call.process.is_alive()
    assert call.process.exitcode == (-9 if kill else -15)
    assert time.monotonic() - t0 < 5.0
