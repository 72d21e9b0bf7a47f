"""How an exact solve divides its time limit: each share and threshold of :mod:`.exact_plan`, with
the measurements that set it (dated, the machine: 2 cores)."""

DEFAULT_TIME_LIMIT = 60.0
TICKS_AT_RATE_BOUND = 1e9   # integer time scale: the total-work bound maps to 1e9 ticks
# from this time limit on, the fluid search runs in a child on a second core. 20 s until 2026-12-07: at 15 s in
# the planner's process, hexiscale-het3 / Llama-2 13B's P = 4-5 roots did not converge (bound 4.943 s, 47.8 %;
# in a child 8.954 s, 5.5 %). One cpsat solve each way (Llama-2 7B, full recompute; scratch script over `solve`), gap here -> in a child:
# at 15 s het2 7.29 -> 3.79 %, het3 21.6 -> 9.65 %, homo-32xa100 1.81 -> 0.46 %, mixed-a100-a40-t4 3.86 -> 1.64 %,
# gen-64 7.25 -> 3.57 %, het1 and small-mixed the same; at 10 s het3 51.7 -> 11.9 %, het2 8.02 -> 5.32 %, the others
# the same or better; at 5 s het3 14.4 -> 51.7 % (the child answered nothing in time), hence a threshold
FLUID_PARALLEL_MIN_S = 10.0
FLUID_COLLECT_S = 1.0        # kept at the end to receive the child's bounds and round its masters
FLUID_SPLIT_MIN_GPUS = 16    # from here on both cores search fluid bounds (odd and even pipeline counts)
# ... after the exact models had this share of the time: at 16-32 GPUs they proved no more than the
# shape bound and found no better plan in 120 s; 5 % against 15 % (2026-12-01, one 120 s solve each):
# gen-64 1.99 -> 1.54 %, mixed-a100-a40-t4 2.0 -> 1.98 %, homo-for-het1 0.02 % both; 2 % against 5 %
# (2026-12-02, hexiscale-het2, two 120 s cpsat solves each): bound 7.5080/7.5095 -> 7.5098/7.5156 s
EXACT_SHARE_SPLIT = 0.02
WARM_START_REGROUP_EVALS = 100_000  # hexiscale's grouping search in the warm start: bounded by its budget
# the heuristics' share of the time limit; hexiscale's sweep over pipeline counts may use all of it (512 GPUs:
# 19 s in all, its best plan, 2.832 s, found within 7.5 s: 2026-12-06), its grouping search and polish stop at 10 s
WARM_START_SHARE, WARM_START_IMPROVE_S = 0.25, 10.0
FLUID_SHARE = 0.6  # of the time left after the warm start, for the fluid search when it runs in this process
# where no P-model could be built and called in the time the models would get (too big,
# or its build and first call alone would outlast it: 256-512 GPUs at 10-15 s, or 128 through PuLP), that time would
# go unused: the warm start then gets this share of the limit (at 25 % hexiscale's sweep over pipeline counts is cut
# short) and the fluid search this share of the rest, ending FLUID_ALONE_MARGIN of the limit (at least 1 s) before
# it: its last steps overshoot their deadline at 512 GPUs by 0.7-1.3 s. One cpsat solve each way (2026-12-06,
# 14:00 UTC): gen-256 at 15 s plan 3.172 -> 2.982 s, gap 30.1 -> 26.4 %, 10.6 -> 13.0 s; at 10 s 4.480 -> 2.982 s,
# 61.6 -> 42.2 %; gen-512 at 15 s 3.634 -> 3.185 s, 52.6 -> 45.9 %, 11.2 -> 13.1 s; at 10 s 3.828 -> 3.372 s.
# (A warm start of 0.7 gave gen-512 3.061 s but gen-256's bound 2.217 -> 1.723 s.) Beside a fluid child the models
# get all that the warm start leaves, and where none fits in it the warm start gets this share too.
# The same test is made again once the warm start is over, with the pipeline counts the one-pipeline or depth bound
# settled left out, for the fluid search's share: hexiscale-het1 and homo-32xa100 at 10 s through HiGHS had passed
# the first (P = 1's model fits) but settled P = 1 on the way, and their solves ended at 7.1 s with the last 2.9 s
# unused; now the fluid search takes them (2026-12-07: homo-32xa100 gap 3.67 -> 2.81 %, hexiscale-het2 9.93 ->
# 7.86 %, het1 6.59 % both, each ending at 8.5 s)
WARM_START_ALONE_SHARE, FLUID_ALONE_SHARE, FLUID_ALONE_MARGIN = 0.5, 0.97, 0.15
REGROUP_MORE_S, REGROUP_MORE_SHARE = 20.0, 0.2  # hexiscale's grouping search, continued beside the fluid child
SYMMETRIC_MORE_S, SYMMETRIC_MORE_SHARE = 10.0, 0.1  # identical-pipeline plans listed in full beside the fluid child
SHAPE_BOUND_SHARE = 0.25  # of the exact models' time, for the order-free shape bound where the fluid search is not split
DEPTH_SHARE = 0.25  # of the time limit, for the depth bound where memory depends on depth (docs §16)
SINGLE_PIPELINE_SHARE = 0.05  # of the time left after the warm start, for the one-pipeline bound (docs §18)
# a backend call costs seconds beyond its search whatever its limit (building the model, handing it over,
# presolve), and the node-pair terms P*K*nodes^2 of a P-model set it: 3.0 / 5.4 s to build and call at limits
# <= 1 s for gen-64's P = 4 / 8 (8,192 / 16,384 terms), 2.9 / 4.9 s for gen-128's P = 1 / 2 (8,192 / 16,384),
# 9.7 / 15.4 s for gen-256's P = 1 / 2 (32,768 / 65,536; 2026-12-06, this 2-core machine). So do the unary
# micro-batch terms P*(M-P+1) where a step has many micro-batches, at 1e-4 to 6.4e-4 s each: 7.4 s for
# small-mixed's P = 2 at 10,000 micro-batches (19,998 terms), 8.4 s for its P = 8 (79,944), 5.6 s for
# hexiscale-het3's P = 2 at 4,096 (8,190); they count twice. A model not built yet is charged that before
# it is built; a built one what its calls took. Since the models hold m_p − 1 once (plan_formulation) and
# CP-SAT's model is written straight into its proto (cpsat_plan.cp_model_of; both 2026-12-07), building
# and handing over costs 0.5-1.5e-4 s per term: gen-64's P = 8 1.8 s, gen-256's P = 2 4.5 s,
# hexiscale-het3's P = 2 at 4,096 micro-batches 1.0 s (8.0 s before), its P = 4 with Llama-2 13B 1.3 s
# (3.4 s). The rate is kept all the same: it also decides whether a short solve leaves the P-models out
# and gives the fluid search all its time (params['models_fit']), and at 1.2e-4 the 10 s cpsat solves of the goal's clusters ended with the same
# gaps (scratch runs, 2026-12-07): that decision would better be a rule of its own (not built)
BUILD_AND_CALL_S_PER_TERM = 3.3e-4
# a pass over the unproven pipeline counts gives each a share of its time in proportion to its gap to the
# incumbent, at least this share of the largest gap: the bound is the least over P, and even shares had spent
# 41 s of a 120 s solve of hexiscale-het2 with LLaMA 30B on P = 1, 0.3 % under the incumbent, while P = 3
# (3.8 % under) went unproven
GAP_WEIGHT_FLOOR = 0.2
