"""One rule for user-given numbers (hexhelix/ir/checks.py): finite, real, never a bool — the same in
the cluster and profile loaders and in every solver option of seconds."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hexhelix.ir.checks import check_seconds, finite_number
from hexhelix.ir.cluster import Cluster
from hexhelix.ir.errors import InvalidInputError
from hexhelix.solver.solve import solve
from test_planner_exact import make_problem

NOT_NUMBERS = (True, False, math.nan, math.inf, -math.inf, "5", None, [1.0])


def test_a_finite_number_is_a_real_that_is_not_a_bool() -> None:
    for ok in (0, 3, 2.5, -1.0, np.float64(0.25), np.int64(7)):
        assert finite_number(ok), ok
    for bad in NOT_NUMBERS:
        assert not finite_number(bad), bad


def test_seconds_are_non_negative_or_positive_and_a_bad_value_names_its_field() -> None:
    assert check_seconds(0, "improve_s") == 0.0 and check_seconds(np.float32(1.5), "x") == 1.5
    assert check_seconds(2, "--time-limit", positive=True) == 2.0
    for bad in (*NOT_NUMBERS, -0.5):
        with pytest.raises(InvalidInputError, match="improve_s: must be a non-negative number of seconds"):
            check_seconds(bad, "improve_s")
    with pytest.raises(InvalidInputError, match="--time-limit: must be a positive number of seconds, got 0"):
        check_seconds(0, "--time-limit", positive=True)


def test_true_is_not_one_second_for_a_time_limit_nor_one_gpu_for_a_cluster() -> None:
    """Booleans are ints in Python; the shared rule keeps them out of the solver's time limit, the
    exact planner's seconds beside the fluid child (where True and False are modes, not seconds) and
    the cluster file's numbers."""
    pb = make_problem()
    with pytest.raises(InvalidInputError, match="--time-limit"):
        solve(pb, "cpsat", time_limit=True)
    for bad in (-1, math.nan, "ten"):  # seconds >= 0, or True / False: the default share / off
        with pytest.raises(InvalidInputError, match="symmetric_more_s: must be seconds >= 0, True"):
            solve(pb, "cpsat", time_limit=5.0, options={"symmetric_more_s": bad})
    with pytest.raises(InvalidInputError, match=r"inter_GBps: must be a finite number, got True"):
        Cluster.from_dict({"name": "c", "inter_GBps": True,
                           "nodes": [{"name": "n0", "gpu": "A100-SXM4-80GB", "count": 2, "intra_GBps": 300}]})
