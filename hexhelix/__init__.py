"""hexhelix: plan, compile and run LLM training over heterogeneous GPU clusters.

The work lives in three subpackages: :mod:`hexhelix.ir` (data model), :mod:`hexhelix.solver`
(cost model and planners) and :mod:`hexhelix.runtime` (executors); this package is the front door.
"""

__version__ = "0.1.0"
