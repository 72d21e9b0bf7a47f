"""hexhelix.solver — cost model, evaluator, exact formulations, heuristics and baselines."""

from .evaluate import Evaluation, evaluate

__all__ = ["Evaluation", "evaluate"]
