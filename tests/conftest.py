"""Shared fixtures: tiny instances, the example clusters, and the opt-in tiers (--runslow, --rungpu)."""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--runslow", action="store_true", help="run tests marked slow")
    parser.addoption("--rungpu", action="store_true", help="run tests marked gpu (needs CUDA)")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if "slow" in item.keywords and not config.getoption("--runslow"):
            item.add_marker(pytest.mark.skip(reason="slow: pass --runslow"))
        if "gpu" in item.keywords and not config.getoption("--rungpu"):
            item.add_marker(pytest.mark.skip(reason="gpu: pass --rungpu on a CUDA machine"))


@pytest.fixture
def examples_dir() -> Path:
    return EXAMPLES


@pytest.fixture
def small_cluster():
    from hexhelix.ir.cluster import load_cluster

    return load_cluster(EXAMPLES / "clusters" / "small-mixed.yaml")


@pytest.fixture
def llama7b():
    from hexhelix.ir.model import PRESETS

    return PRESETS["llama2-7b"]


@pytest.fixture
def tiny():
    from hexhelix.ir.model import PRESETS

    return PRESETS["tiny"]
