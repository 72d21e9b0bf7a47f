"""Cluster description: nodes of GPUs, links between them, and the device graph built from them.

A cluster file (YAML or JSON) looks like::

    name: mixed-example
    gpu_types: {MyCard: {tflops: 100.0, memory_gib: 24}}
    nodes:
      - {name: a100-0, gpu: A100-SXM4-80GB, count: 8, intra_GBps: 300}
    inter_GBps: 12.5
    latency_us: 10
    links: [{between: [a100-0, t4-0], GBps: 5}]

Bandwidths are GB/s (1e9 bytes/s) per direction; latencies are microseconds.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import networkx as nx

from .catalog import SPEC_MAX, GpuType, lookup_gpu
from .checks import finite_number
from .errors import InvalidInputError
from .files import read_structured_file

__all__ = ["Cluster", "Device", "Link", "Node", "load_cluster"]

DEFAULT_LATENCY_US = 10.0
DEFAULT_INTRA_LATENCY_US = 5.0
# Sanity limits, so a typo (count: 80000) is one clear error instead of a device graph with
# billions of edges: a node is one machine (an NVL72 rack counts as one); the device graph is
# complete, and at 4096 GPUs it already has 8.4 M edges (tens of seconds to build).
MAX_GPUS_PER_NODE = 256
MAX_GPUS = 4096


@dataclass(frozen=True, slots=True, kw_only=True)
class Node:
    """A machine with ``count`` identical GPUs joined by an intra-node link."""

    name: str
    gpu: str
    count: int
    intra_GBps: float
    intra_latency_us: float = DEFAULT_INTRA_LATENCY_US


@dataclass(frozen=True, slots=True, kw_only=True)
class Link:
    """A per-pair override of the inter-node link between nodes ``a`` and ``b``."""

    a: str
    b: str
    GBps: float
    latency_us: float


@dataclass(frozen=True, slots=True, kw_only=True)
class Device:
    """One GPU: its global id, the node it sits in and its local index there."""

    id: int
    node: int
    local: int
    gpu: GpuType


@dataclass(frozen=True, slots=True, kw_only=True)
class Cluster:
    """Validated cluster: nodes, GPU types in use and the link table."""

    name: str
    nodes: tuple[Node, ...]
    gpu_types: dict[str, GpuType]
    inter_GBps: float
    latency_us: float = DEFAULT_LATENCY_US
    links: tuple[Link, ...] = ()
    # first global device id of each node, and the GPU count: derived once (planners ask per stage)
    _starts: tuple[int, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_starts", tuple(itertools.accumulate((n.count for n in self.nodes), initial=0)))
        if not self.nodes:
            raise InvalidInputError("a cluster needs at least one node", field="nodes")
        names = [n.name for n in self.nodes]
        for i, name in enumerate(names):
            if names.index(name) != i:
                raise InvalidInputError(f"duplicate node name {name!r}", field=f"nodes[{i}].name")
        for i, node in enumerate(self.nodes):
            if node.gpu not in self.gpu_types:
                raise InvalidInputError(f"unknown GPU type {node.gpu!r}", field=f"nodes[{i}].gpu")

    # ----------------------------------------------------------------- derived views
    @property
    def num_gpus(self) -> int:
        return self._starts[-1]

    def node_index(self, name: str) -> int:
        for i, n in enumerate(self.nodes):
            if n.name == name:
                return i
        raise InvalidInputError(f"no node named {name!r}", field="nodes")

    def devices(self) -> list[Device]:
        """Every GPU in node order; global ids are contiguous per node."""
        out: list[Device] = []
        for ni, node in enumerate(self.nodes):
            gpu = self.gpu_types[node.gpu]
            for local in range(node.count):
                out.append(Device(id=len(out), node=ni, local=local, gpu=gpu))
        return out

    def node_gpus(self, node: int) -> list[int]:
        """Global device ids of the GPUs in node ``node``."""
        if not 0 <= node < len(self.nodes):
            raise IndexError(f"node {node} out of range (0..{len(self.nodes) - 1})")
        return list(range(self._starts[node], self._starts[node + 1]))

    def gpu_of_node(self, node: int) -> GpuType:
        return self.gpu_types[self.nodes[node].gpu]

    def node_link(self, a: int, b: int) -> tuple[float, float]:
        """(bandwidth bytes/s, latency s) between nodes ``a`` and ``b`` (intra-node when equal)."""
        if a == b:
            node = self.nodes[a]
            return node.intra_GBps * 1e9, node.intra_latency_us * 1e-6
        na, nb = self.nodes[a].name, self.nodes[b].name
        for link in self.links:
            if {link.a, link.b} == {na, nb}:
                return link.GBps * 1e9, link.latency_us * 1e-6
        return self.inter_GBps * 1e9, self.latency_us * 1e-6

    def interchangeable(self, a: int, b: int) -> bool:
        """Nodes ``a`` and ``b`` can swap places: same GPU type, count and own link, and the same
        link to every other node (so swapping them maps any plan to one of equal cost)."""
        na, nb = self.nodes[a], self.nodes[b]
        if (na.gpu, na.count, self.node_link(a, a)) != (nb.gpu, nb.count, self.node_link(b, b)):
            return False
        return all(self.node_link(a, m) == self.node_link(b, m) for m in range(len(self.nodes)) if m not in (a, b))

    def total_peak_flops(self) -> float:
        return sum(self.gpu_types[n.gpu].peak_flops * n.count for n in self.nodes)

    def device_graph(self) -> nx.Graph:
        """Complete graph, one node per GPU (attrs: gpu, node, tflops, memory_gib) and edges with
        ``bandwidth`` (bytes/s), ``latency`` (s) and ``intra`` (same node)."""
        g = nx.Graph(name=self.name)
        devs = self.devices()
        for d in devs:
            g.add_node(d.id, gpu=d.gpu.name, node=self.nodes[d.node].name, node_index=d.node,
                       local=d.local, tflops=d.gpu.tflops, memory_gib=d.gpu.memory_gib)
        for i, a in enumerate(devs):
            for b in devs[i + 1:]:
                bw, lat = self.node_link(a.node, b.node)
                g.add_edge(a.id, b.id, bandwidth=bw, latency=lat, intra=a.node == b.node)
        return g

    # ----------------------------------------------------------------- serialisation
    def to_dict(self) -> dict[str, Any]:
        used = sorted({n.gpu for n in self.nodes})
        return {
            "name": self.name,
            "gpu_types": {k: self.gpu_types[k].to_dict() for k in used},
            "nodes": [
                {"name": n.name, "gpu": n.gpu, "count": n.count, "intra_GBps": n.intra_GBps,
                 "intra_latency_us": n.intra_latency_us}
                for n in self.nodes
            ],
            "inter_GBps": self.inter_GBps,
            "latency_us": self.latency_us,
            "links": [{"between": [lk.a, lk.b], "GBps": lk.GBps, "latency_us": lk.latency_us}
                      for lk in self.links],
        }

    @classmethod
    def from_dict(cls, data: Any, *, source: str | None = None) -> Cluster:
        """Parse and validate a cluster mapping; errors name ``source`` and the field."""
        try:
            return _parse_cluster(data)
        except InvalidInputError as err:
            raise (err.with_source(source) if source else err) from None


# --------------------------------------------------------------------------- parsing helpers
def _num(value: Any, field: str, *, positive: bool = True, allow_zero: bool = False) -> float:
    if not finite_number(value):
        raise InvalidInputError(f"must be a finite number, got {value!r}", field=field)
    if positive and (value < 0 or (value == 0 and not allow_zero)):
        raise InvalidInputError(f"must be {'non-negative' if allow_zero else 'positive'}, got {value!r}", field=field)
    if abs(value) > SPEC_MAX:
        raise InvalidInputError(f"must be at most {SPEC_MAX:g}, got {value!r}", field=field)
    return float(value)


def _req(mapping: dict, key: str, where: str) -> Any:
    if key not in mapping:
        raise InvalidInputError("missing required field", field=f"{where}{key}" if where else key)
    return mapping[key]


def _check_keys(mapping: dict, allowed: set[str], where: str) -> None:
    for key in mapping:
        if key not in allowed:
            raise InvalidInputError(f"unknown field (allowed: {', '.join(sorted(allowed))})",
                                    field=f"{where}{key}")


def _parse_cluster(data: Any) -> Cluster:
    if not isinstance(data, dict):
        raise InvalidInputError(f"expected a mapping at the top level, got {type(data).__name__}")
    data = {k: v for k, v in data.items() if k != "schema"}
    _check_keys(data, {"name", "gpu_types", "nodes", "inter_GBps", "latency_us", "links"}, "")
    name = str(data.get("name", "cluster"))

    types: dict[str, GpuType] = {}
    raw_types = data.get("gpu_types") or {}
    if not isinstance(raw_types, dict):
        raise InvalidInputError("must be a mapping of type name to {tflops, memory_gib}", field="gpu_types")
    for tname, spec in raw_types.items():
        where = f"gpu_types.{tname}"
        if not isinstance(spec, dict):
            raise InvalidInputError("must be a mapping with tflops and memory_gib", field=where)
        _check_keys(spec, {"name", "tflops", "memory_gib", "mem_GBps", "intra_GBps", "source"}, where + ".")
        kwargs: dict[str, Any] = {
            "name": str(tname),
            "tflops": _num(_req(spec, "tflops", where + "."), where + ".tflops"),
            "memory_gib": _num(_req(spec, "memory_gib", where + "."), where + ".memory_gib"),
            "source": str(spec.get("source", "user-defined in the cluster file")),
        }
        for opt in ("mem_GBps", "intra_GBps"):
            if opt in spec:
                kwargs[opt] = _num(spec[opt], f"{where}.{opt}")
        types[str(tname)] = GpuType(**kwargs)

    raw_nodes = _req(data, "nodes", "")
    if not isinstance(raw_nodes, list) or not raw_nodes:
        raise InvalidInputError("must be a non-empty list of nodes", field="nodes")
    nodes: list[Node] = []
    used: dict[str, GpuType] = {}
    for i, raw in enumerate(raw_nodes):
        where = f"nodes[{i}]"
        if not isinstance(raw, dict):
            raise InvalidInputError("must be a mapping {name, gpu, count, intra_GBps}", field=where)
        _check_keys(raw, {"name", "gpu", "count", "intra_GBps", "intra_latency_us"}, where + ".")
        gname = str(_req(raw, "gpu", where + "."))
        gpu = lookup_gpu(gname, types)
        if gpu is None:
            raise InvalidInputError(
                f"unknown GPU type {gname!r}; define it under gpu_types or use one of the catalog "
                f"(hexhelix gpus lists them)", field=f"{where}.gpu")
        used[gpu.name] = gpu
        count = _req(raw, "count", where + ".")
        if isinstance(count, bool) or not isinstance(count, int) or count <= 0:
            raise InvalidInputError(f"must be a positive integer, got {count!r}", field=f"{where}.count")
        if count > MAX_GPUS_PER_NODE:
            raise InvalidInputError(f"{count} GPUs in one node exceeds the limit of {MAX_GPUS_PER_NODE}; "
                                    "split the machine into several nodes", field=f"{where}.count")
        intra = _num(raw["intra_GBps"], f"{where}.intra_GBps") if "intra_GBps" in raw else gpu.intra_GBps
        lat = (_num(raw["intra_latency_us"], f"{where}.intra_latency_us", allow_zero=True)
               if "intra_latency_us" in raw else DEFAULT_INTRA_LATENCY_US)
        nodes.append(Node(name=str(raw.get("name", f"node{i}")), gpu=gpu.name, count=count,
                          intra_GBps=intra, intra_latency_us=lat))

    total = sum(n.count for n in nodes)
    if total > MAX_GPUS:
        raise InvalidInputError(f"the cluster has {total} GPUs, more than the limit of {MAX_GPUS}", field="nodes")
    multi = len(nodes) > 1
    if "inter_GBps" in data:
        inter = _num(data["inter_GBps"], "inter_GBps")
    elif multi:
        raise InvalidInputError("missing required field (bandwidth between nodes, GB/s)", field="inter_GBps")
    else:
        inter = 1.0  # unused with a single node
    latency = _num(data["latency_us"], "latency_us", allow_zero=True) if "latency_us" in data else DEFAULT_LATENCY_US

    node_names = {n.name for n in nodes}
    links: list[Link] = []
    raw_links = data.get("links") or []
    if not isinstance(raw_links, list):
        raise InvalidInputError("must be a list of {between: [a, b], GBps} entries", field="links")
    seen_pairs: dict[frozenset, int] = {}
    for i, raw in enumerate(raw_links):
        where = f"links[{i}]"
        if not isinstance(raw, dict):
            raise InvalidInputError("must be a mapping {between: [a, b], GBps}", field=where)
        _check_keys(raw, {"between", "GBps", "latency_us"}, where + ".")
        between = _req(raw, "between", where + ".")
        if not isinstance(between, list) or len(between) != 2:
            raise InvalidInputError("must list exactly two node names", field=f"{where}.between")
        for b in between:
            if not isinstance(b, str) or b not in node_names:
                raise InvalidInputError(f"no node named {b!r}", field=f"{where}.between")
        pair = frozenset(between)
        if len(pair) != 2:
            raise InvalidInputError(f"names node {between[0]!r} twice; set its intra_GBps on the node instead",
                                    field=f"{where}.between")
        if pair in seen_pairs:
            raise InvalidInputError(f"the pair is already overridden by links[{seen_pairs[pair]}]",
                                    field=f"{where}.between")
        seen_pairs[pair] = i
        links.append(Link(a=str(between[0]), b=str(between[1]),
                          GBps=_num(_req(raw, "GBps", where + "."), f"{where}.GBps"),
                          latency_us=_num(raw.get("latency_us", latency), f"{where}.latency_us", allow_zero=True)))
    return Cluster(name=name, nodes=tuple(nodes), gpu_types=used, inter_GBps=inter,
                   latency_us=latency, links=tuple(links))


def load_cluster(path: str | Path) -> Cluster:
    """Load and validate a cluster file (YAML or JSON)."""
    return Cluster.from_dict(read_structured_file(path), source=str(path))
