"""The measured kernel plan: which implementation computes each linear layer, per phase, on this machine.

    candidates.py      forms (layouts built from a weight format) and kernels (x @ W^T on a form)
    timing.py          a candidate checked against the float64 product and timed per phase
    plan.py            make_plan: the fastest accurate kernel per layer shape and phase
    record.py          KernelPlan / WeightPlan: the decisions, with the timings behind them
    cache.py           plans stored per machine, torch version, model and weights
    planned_linear.py  PlannedLinear: a linear layer that runs the planned kernel for its row count
    planning.py        a model's linear layers put on their planned kernels (the engine's view)
"""
