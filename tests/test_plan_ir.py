"""Plan IR (schema hexhelix.plan/1): the example plan round-trips through JSON, and Plan.check
rejects structurally wrong plans with the offending field named."""

from __future__ import annotations

import copy
import json
import random
from pathlib import Path

import pytest
from hexhelix.ir.cluster import Cluster
from hexhelix.ir.document import IRDocument, build_ir
from hexhelix.ir.errors import InvalidInputError
from hexhelix.ir.model import PRESETS, TrainingConfig
from hexhelix.ir.plan import PLAN_SCHEMA, Plan, PlanProblem
from hexhelix.ir.profile import DEFAULT_PROFILE, Profile
from hexhelix.ir.program import Program

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE_PLAN = ROOT / "examples" / "plans" / "small-mixed-llama2-7b.json"


@pytest.fixture
def plan_dict() -> dict:
    return json.loads(EXAMPLE_PLAN.read_text())


def test_example_plan_round_trips(plan_dict: dict) -> None:
    plan = Plan.from_dict(plan_dict)
    assert plan.to_dict() == plan_dict                      # the file is in canonical form
    again = Plan.from_dict(json.loads(json.dumps(plan.to_dict())))
    assert again == plan
    assert again.meta == plan.meta == {"solver": "hand-written", "note": "example of the plan format"}
    assert plan_dict["schema"] == PLAN_SCHEMA
    assert plan.num_gpus_used == 8


def test_problem_round_trips(plan_dict: dict) -> None:
    problem = Plan.from_dict(plan_dict).problem
    assert PlanProblem.from_dict(json.loads(json.dumps(problem.to_dict()))) == problem
    with pytest.raises(InvalidInputError) as err:
        PlanProblem.from_dict({**problem.to_dict(), "schedule": "zigzag"})
    assert err.value.field == "schedule"


def _rejects(d: dict, field: str, words: str) -> None:
    with pytest.raises(InvalidInputError) as err:
        Plan.from_dict(d, source="plan.json")
    assert err.value.field == field, str(err.value)
    assert words in err.value.message
    assert str(err.value).startswith(f"plan.json: {field}: ")


def test_rejects_a_gpu_used_twice(plan_dict: dict) -> None:
    d = copy.deepcopy(plan_dict)
    d["pipelines"][0]["stages"][1]["gpus"] = [1, 2]         # GPU 1 is in stage 0 already
    _rejects(d, "pipelines[0].stages[1].gpus", "GPU 1 is already used by pipelines[0].stages[0]")


def test_rejects_a_tp_group_spanning_two_nodes(plan_dict: dict) -> None:
    d = copy.deepcopy(plan_dict)
    d["pipelines"][1]["stages"][0]["gpus"] = [5, 6]         # GPU 6 sits in node 2 (T4), not node 1
    _rejects(d, "pipelines[1].stages[0].gpus", "must stay inside one node")


def test_rejects_layers_not_covering_the_model(plan_dict: dict) -> None:
    d = copy.deepcopy(plan_dict)
    d["pipelines"][1]["stages"][1]["layers"] = [24, 30]
    _rejects(d, "pipelines[1].stages", "stages hold 30 layers, the model has 32")
    d["pipelines"][1]["stages"][1]["layers"] = [25, 32]     # a gap
    _rejects(d, "pipelines[1].stages[1].layers", "starting at 24")
    d["pipelines"][1]["stages"][1]["layers"] = [24, 24]     # empty stage
    _rejects(d, "pipelines[1].stages[1].layers", "non-empty")


def test_rejects_micro_batches_not_summing_to_global_over_micro(plan_dict: dict) -> None:
    d = copy.deepcopy(plan_dict)
    d["pipelines"][0]["micro_batches"] = 21
    _rejects(d, "pipelines", "micro-batches sum to 31, but global batch 32 / micro-batch 1 = 32")


def test_rejects_other_structural_errors(plan_dict: dict) -> None:
    d = copy.deepcopy(plan_dict)
    d["pipelines"][0]["stages"][0]["gpus"] = [0, 1, 2]      # TP 3 does not divide 32 heads
    d["pipelines"][0]["stages"][1]["gpus"] = [3]
    _rejects(d, "pipelines[0].stages[0].gpus", "not divisible by TP degree 3")
    d = copy.deepcopy(plan_dict)
    d["pipelines"][0]["stages"][0]["node"] = 9
    _rejects(d, "pipelines[0].stages[0].node", "out of range")
    d = copy.deepcopy(plan_dict)
    d["pipelines"][0]["stages"][0]["gpus"] = [0, 99]
    _rejects(d, "pipelines[0].stages[0].gpus", "GPU 99 does not exist")
    d = copy.deepcopy(plan_dict)
    d["pipelines"][0]["micro_batches"] = 0
    _rejects(d, "pipelines[0].micro_batches", ">= 1")
    d = copy.deepcopy(plan_dict)
    d["schema"] = "hexhelix.plan/0"
    _rejects(d, "schema", "re-export")
    d = copy.deepcopy(plan_dict)
    del d["pipelines"][0]["stages"][0]["layers"]
    _rejects(d, "pipelines[0].stages[0]", "malformed pipeline entry")
    d = copy.deepcopy(plan_dict)
    del d["pipelines"][1]["micro_batches"]
    _rejects(d, "pipelines[1]", "malformed pipeline entry")


# ----------------------------------------------------------------------------- hardening
_WEIRD = [None, [], {}, "x", "", -1, 0, 2.5, 1e300, float("nan"), True, [1], {"a": 1}]


def _paths(obj: object, prefix: tuple = ()):
    if prefix:
        yield prefix
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from _paths(v, (*prefix, k))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            yield from _paths(v, (*prefix, i))


def _mutants(base: dict, seed: int, count: int):
    """``count`` copies of ``base``, each with one value replaced by an odd one or deleted."""
    rng = random.Random(seed)
    paths = list(_paths(base))
    for _ in range(count):
        d = copy.deepcopy(base)
        path = rng.choice(paths)
        parent = d
        for key in path[:-1]:
            parent = parent[key]
        choice = rng.randrange(len(_WEIRD) + 1)
        if choice == len(_WEIRD):
            del parent[path[-1]]
        else:
            parent[path[-1]] = _WEIRD[choice]
        yield path, d


def _documents() -> dict:
    from test_program_ir import small_program

    plan = json.loads(EXAMPLE_PLAN.read_text())
    cluster = Cluster.from_dict(plan["problem"]["cluster"])
    ir = build_ir(cluster, PRESETS["tiny"], TrainingConfig(global_batch=8, seq_len=64), tps=[1, 2])
    return {"plan": (plan, Plan.from_dict), "ir": (ir.to_dict(), IRDocument.from_dict),
            "program": (small_program().to_dict(), Program.from_dict),
            "profile": (DEFAULT_PROFILE.to_dict(), Profile.from_dict)}


@pytest.mark.parametrize("kind", ["plan", "ir", "program", "profile"])
def test_malformed_documents_raise_only_invalid_input(kind: str) -> None:
    """Every loader turns any one-field corruption into InvalidInputError (one CLI line, exit 2),
    never a TypeError/KeyError/AttributeError traceback (seeded corruption of one field at a time)."""
    base, load = _documents()[kind]
    for path, doc in _mutants(base, seed=7, count=400):
        try:
            load(doc)
        except InvalidInputError:
            pass
        except Exception as err:  # pragma: no cover - the failure message is the point
            pytest.fail(f"{kind}: {'.'.join(map(str, path))} -> {type(err).__name__}: {err}")
