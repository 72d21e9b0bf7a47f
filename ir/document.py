"""The exported IR document (schema ``hexhelix.ir/1``): cluster, device graph, model, training and
the layer operator graphs at the requested TP degrees."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .cluster import Cluster
from .errors import InvalidInputError
from .files import read_json
from .model import ModelConfig, TrainingConfig
from .opgraph import LayerGraph, build_layer_graph

__all__ = ["IR_SCHEMA", "IRDocument", "build_ir"]

IR_SCHEMA = "hexhelix.ir/1"


@dataclass(frozen=True, slots=True, kw_only=True)
class IRDocument:
    """Everything a planner needs to know about one problem instance, in one versioned file.

    The device graph is written for readers (node-link form) and rebuilt from the cluster on load,
    so it can never disagree with it."""

    cluster: Cluster
    model: ModelConfig
    training: TrainingConfig
    layer_graphs: tuple[LayerGraph, ...]

    def to_dict(self) -> dict[str, Any]:
        g = self.cluster.device_graph()
        return {
            "schema": IR_SCHEMA,
            "cluster": self.cluster.to_dict(),
            "device_graph": {
                "nodes": [{"id": n, **g.nodes[n]} for n in sorted(g.nodes)],
                "edges": [{"u": u, "v": v, **g.edges[u, v]} for u, v in sorted(g.edges)],
            },
            "model": self.model.to_dict(),
            "training": self.training.to_dict(),
            "layer_graphs": [lg.to_dict() for lg in self.layer_graphs],
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=1) + "\n"

    @classmethod
    def from_dict(cls, d: Any, *, source: str | None = None) -> IRDocument:
        try:
            if not isinstance(d, dict):
                raise InvalidInputError("expected a JSON object")
            if d.get("schema") != IR_SCHEMA:
                raise InvalidInputError(f"expected schema {IR_SCHEMA!r}, got {d.get('schema')!r}", field="schema")
            for key in ("cluster", "model", "training", "layer_graphs"):
                if key not in d:
                    raise InvalidInputError("missing required field", field=key)
            try:
                graphs = tuple(LayerGraph.from_dict(g) for g in d["layer_graphs"])
            except (KeyError, TypeError, ValueError) as err:
                if isinstance(err, InvalidInputError):
                    raise
                raise InvalidInputError(f"malformed layer graph ({err})", field="layer_graphs") from None
            return cls(cluster=Cluster.from_dict(d["cluster"]), model=ModelConfig.from_dict(d["model"]),
                       training=TrainingConfig.from_dict(d["training"]), layer_graphs=graphs)
        except InvalidInputError as err:
            raise (err.with_source(source) if source else err) from None

    @classmethod
    def load(cls, path: str | Path) -> IRDocument:
        return cls.from_dict(read_json(path), source=str(path))


def build_ir(cluster: Cluster, model: ModelConfig, training: TrainingConfig,
             tps: list[int] | None = None, sequence_parallel: bool | None = None) -> IRDocument:
    """Build the IR with layer graphs at each TP degree in ``tps`` (default: every power of two up
    to the largest node that divides the model's heads)."""
    if tps is None:
        largest = max(n.count for n in cluster.nodes)
        tps = [t for t in (1, 2, 4, 8, 16) if t <= largest and model.heads % t == 0
               and model.kv_heads % t == 0 and model.ffn % t == 0]
    graphs = tuple(build_layer_graph(model, training, t, sequence_parallel=sequence_parallel) for t in tps)
    return IRDocument(cluster=cluster, model=model, training=training, layer_graphs=graphs)
