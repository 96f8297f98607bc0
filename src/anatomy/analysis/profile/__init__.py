"""`anatomy profile`: the real engine under torch.profiler, taken apart by the positions of the decoder's map.

    api.py        anatomy.profile(model, ...) -> ProfileReport (what `anatomy profile` prints)
    checks.py     the sizes checked before anything is loaded
    workloads.py  the steps of each phase, through the engine's public API
    run.py        the steps run with and without torch.profiler
    calls.py      the profiler's events as a tree of intervals
    match.py      each op matched to its module and its row of the shape trace
    positions.py  the position of the decoder's map each row belongs to
    weights.py    the bytes a linear's planned kernel reads
    rows.py       FLOPs, bytes, roofline time and verdict per row
    machine.py    this machine's roofs, op latency and load
    measure.py    one profile: the phases measured, reconciled and predicted
    sweep.py      batch and context sweeps; whatif.py: what-ifs per position
    render.py     tables (terminal, Markdown); plot.py: the PNG
"""

from anatomy.analysis.profile.api import ProfileReport, profile

__all__ = ["ProfileReport", "profile"]
