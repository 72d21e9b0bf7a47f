"""hexhelix.ir — the data model: cluster, model, operator graphs, plans and programs (no solver code)."""

from .catalog import CATALOG, GpuType, lookup_gpu
from .cluster import Cluster, Device, Node, load_cluster
from .document import IR_SCHEMA, IRDocument, build_ir
from .errors import HexhelixError, InvalidInputError, ScheduleError, SolverError, UnsupportedError
from .model import PRESETS, ModelConfig, TrainingConfig, load_model
from .opgraph import LayerGraph, Op, OpClass, OpKind, Resource, build_layer_graph
from .plan import PipelinePlan, Plan, PlanProblem, StagePlan
from .profile import DEFAULT_PROFILE, Profile, load_profile

__all__ = [
    "CATALOG", "DEFAULT_PROFILE", "IR_SCHEMA", "PRESETS", "Cluster", "Device", "GpuType", "HexhelixError",
    "IRDocument", "InvalidInputError", "LayerGraph", "ModelConfig", "Node", "Op", "OpClass", "OpKind",
    "PipelinePlan", "Plan", "PlanProblem", "Profile", "Resource", "ScheduleError", "SolverError", "StagePlan",
    "TrainingConfig", "UnsupportedError", "build_ir", "build_layer_graph", "load_cluster", "load_model",
    "load_profile", "lookup_gpu",
]
