"""The numba kernels are compiled for the argument types the solvers pass, before a solve's clock."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hexhelix.ir.cluster import load_cluster
from hexhelix.ir.model import PRESETS, TrainingConfig
from hexhelix.ir.plan import PlanProblem
from hexhelix.solver import kernels
from hexhelix.solver.candidates import build_tables
from hexhelix.solver.kernels import Kernel, signature
from hexhelix.solver.layer_assign import assign_layers
from hexhelix.solver.layer_assign_jit import assign_layers_compiled
from hexhelix.solver.shape_pricing import ShapePricer
from hexhelix.solver.solve import solve
from hexhelix.solver.stage_floors import Locality
from test_planner_exact import make_problem

ROOT = Path(__file__).resolve().parents[1]
needs_numba = pytest.mark.skipif(not kernels.AVAILABLE, reason="numba is not installed")


def test_signature_codes_spell_numba_types() -> None:
    assert signature("f1 N i") == "(float64[::1], none, int64)"
    assert signature("b2 f3 f i1 b") == "(boolean[:, ::1], float64[:, :, ::1], float64, int64[::1], boolean)"
    with pytest.raises(ValueError, match="'x1'"):
        signature("f1 x1")


@needs_numba
def test_warm_compiles_every_kernel_for_exactly_its_declared_types() -> None:
    kernels.warm()
    assert {k.fn.__name__ for k in kernels._REGISTRY} == {"_dp_batch", "_labels_batch", "_depth_dp", "_scan"}
    for k in kernels._REGISTRY:
        assert len(k.ready().signatures) == len(k.signatures), k.fn.__name__


@needs_numba
def test_a_solve_calls_every_kernel_with_declared_types_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """A call with an undeclared argument type (say an int32 array, or None where an array was
    declared) would compile a new specialisation inside the solve's time; none may."""
    kernels.warm()
    called: set[str] = set()
    call = Kernel.__call__

    def recording(self: Kernel, *args: object) -> object:
        called.add(self.fn.__name__)
        return call(self, *args)

    monkeypatch.setattr(Kernel, "__call__", recording)
    # small-mixed without recompute: the pricing DP (fluid search) and the DP with memory at depth
    pb = PlanProblem(cluster=load_cluster(ROOT / "examples/clusters/small-mixed.yaml"), model=PRESETS["llama2-7b"],
                     training=TrainingConfig())
    res = solve(pb, "cpsat", time_limit=5, options={"fluid_parallel": False})
    assert res.plan is not None
    # the labels, which a solve reaches only in its last whole-batch phase (timing-dependent): called as it does
    tiny = make_problem(gpus=(2, 3), mem=(4, 4), gb=4, seq=4096, layers=5)
    pricer, nodes = ShapePricer(build_tables(tiny), engine="jit"), len(tiny.cluster.nodes)
    for lows in (np.array([-math.inf]), np.array([0.01])):
        vals, _, _ = pricer.solve_whole(np.array([1e9]), lows, None, np.array([1.0]), 0.5, np.array([1e9]),
                                        np.full(nodes, 0.1), pricer.extras(2, Locality(visit=frozenset({1}))))
        assert np.isfinite(vals).all()
    # HexiScale's layer scan, as phase 2 calls it (lists of floats and ints)
    args = ([1.0, 2.0, 1.5], [0.5, 1.0, 0.7], [4, 4, 4], 8, 4)
    assert assign_layers_compiled(*args) == assign_layers(*args)
    assert called == {k.fn.__name__ for k in kernels._REGISTRY}
    for k in kernels._REGISTRY:
        assert len(k.ready().signatures) == len(k.signatures), k.fn.__name__


@needs_numba
def test_a_fresh_install_compiles_before_the_time_limit_starts(tmp_path: Path) -> None:
    """With an empty kernel cache (a fresh install) the compile (~25 s on 2 cores) is not spent out of
    the solve's time limit: the solve keeps to it, and its result and stderr say what the compile took."""
    env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path / "numba-cache")}
    out = subprocess.run([sys.executable, "-m", "hexhelix", "plan", "--model", "llama2-7b", "--cluster", "small-mixed",
                          "--recompute", "full", "--solver", "cpsat", "--time-limit", "3", "--json"],
                         capture_output=True, text=True, env=env, cwd=ROOT, timeout=300)
    assert out.returncode == 0, out.stderr
    res = json.loads(out.stdout)
    assert res["params"]["kernels_s"] > 3.0  # compiled, not loaded
    assert res["solve_time_s"] < 3.0 + 1.0
    assert "numba kernels took" in out.stderr
    assert any((tmp_path / "numba-cache").rglob("*.nbi"))  # cached for the next solve
