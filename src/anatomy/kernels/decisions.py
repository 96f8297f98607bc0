"""Choices between two paths that are measured once per machine and model and then kept.

A timing race on every start makes two runs of one command take different paths and costs seconds
each time; a decision is measured the first time and stored beside the kernel plans (kernels/cache.py:
the same directory, keyed by machine_key, which names the CPU, torch and the native library's build and
vector code, and by what the choice depends on), so every later run of that machine and model takes
the same path.

    rows = decided("fused_rows", {"model": ..., "plan": ...}, measure=lambda: ..., cache=True)
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable

from anatomy.kernels import cache as plan_cache

KIND = "decision"


def decided(name: str, depends_on: dict[str, Any], *, measure: Callable[[], Any],
            cache: bool | str | Path = True) -> Any:
    """The kept value of decision `name` for this machine and `depends_on` (JSON data); measured by
    measure() and kept when there is none. cache=False: measured now, neither read nor kept; a path:
    kept in that directory instead of the plan cache's (as make_plan takes it)."""
    if cache is False:
        return measure()
    key = json.loads(json.dumps({KIND: name, "machine": plan_cache.machine_key(), **depends_on}))
    path = plan_cache.plan_path(key, None if cache is True else Path(cache))
    stored = plan_cache.load_entry(path, key)
    if stored is not None and "value" in stored:
        return stored["value"]
    value = measure()
    plan_cache.save_entry(path, key, {"value": value})
    return value
