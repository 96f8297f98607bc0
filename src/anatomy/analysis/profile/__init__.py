"""`anatomy profile`: the real engine under torch.profiler, taken apart by the positions of the decoder's map.

api.py: anatomy.profile(model, ...) -> ProfileReport; checks.py: sizes checked before loading;
workloads.py: each phase's steps; run.py: the steps with and without torch.profiler; calls.py: the
events as a tree of intervals; match.py: ops to modules and shape-trace rows; positions.py: the
map's positions; weights.py: a planned kernel's bytes; rows.py: FLOPs, bytes, roofline and verdict;
machine.py: this machine's roofs; measure.py: one profile; sweep.py, whatif.py: sweeps and
what-ifs; render.py, plot.py: tables and the PNG.
"""

from anatomy.analysis.profile.api import ProfileReport, profile

__all__ = ["ProfileReport", "profile"]
