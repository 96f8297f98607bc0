"""Modules that moved, importable under their old names for a release, with a deprecation warning.

    import anatomy.tokenizer            # works, warns: anatomy.tokenizer moved to anatomy.text.tokenizer
    from anatomy.inference.planning import plan_view     # the same function as anatomy.kernels.planning's

One table and one import hook (installed by `import anatomy`) instead of a stub file per old path:
the old name is an alias of the new module object, so classes and functions are the same objects.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys

from anatomy.deprecation import deprecated

MOVED = {
    # the text pipeline, in one package
    "anatomy.tokenizer": "anatomy.text.tokenizer",
    "anatomy.tokenizer_gguf": "anatomy.text.gguf_vocab",
    "anatomy.tokenizer_chars": "anatomy.text.chars",
    "anatomy.detokenizer": "anatomy.text.detokenizer",
    "anatomy.chat_template": "anatomy.text.chat_template",
    "anatomy.inference.streaming": "anatomy.text.stops",
    # the measured kernel plan, in a package of its own
    "anatomy.inference.kernels": "anatomy.kernels.candidates",
    "anatomy.inference.plan": "anatomy.kernels.plan",
    "anatomy.inference.plan_record": "anatomy.kernels.record",
    "anatomy.inference.plan_timing": "anatomy.kernels.timing",
    "anatomy.inference.plan_cache": "anatomy.kernels.cache",
    "anatomy.inference.planned_linear": "anatomy.kernels.planned_linear",
    "anatomy.inference.planning": "anatomy.kernels.planning",
    # the engine, a package of its own
    "anatomy.inference.capture": "anatomy.inference.engine.capture",
    "anatomy.inference.kv_cache": "anatomy.inference.engine.kv_cache",
    # one KV cache family: the static cache's layers are paged (kv_cache.StaticLayer)
    "anatomy.inference.engine.layer_cache": "anatomy.inference.engine.kv_cache",
    "anatomy.inference.engine.window_cache": "anatomy.inference.engine.kv_cache",
    "anatomy.inference.view": "anatomy.inference.engine.view",
    "anatomy.inference.steps": "anatomy.inference.engine.run",
    "anatomy.serving.paged": "anatomy.inference.engine.paged",
    "anatomy.serving.speculation": "anatomy.inference.speculative.rounds",
    # "context" is the model's length: a pass's inputs and a stack's position rules are named for what they are
    "anatomy.layers.context": "anatomy.layers.pass_inputs",
    "anatomy.models.context": "anatomy.models.position_rules",
    # the load generator is a client of servers, not part of one
    "anatomy.serving.bench": "anatomy.loadgen",
    # the profiler, a package
    "anatomy.analysis.profiling": "anatomy.analysis.profile.api",
    **{f"anatomy.analysis.profile_{part}": f"anatomy.analysis.profile.{part}"
       for part in ("calls", "checks", "machine", "match", "plot", "positions", "render", "rows", "run", "sweep",
                    "weights", "whatif", "workloads")},
}


class MovedModules(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds the old names (only when no module of that name exists) and loads the new module in their place."""

    def find_spec(self, name, path=None, target=None):
        return importlib.util.spec_from_loader(name, self) if name in MOVED else None

    def exec_module(self, module) -> None:
        old = module.__name__
        deprecated(f"the module {old} moved to {MOVED[old]}; import it from there")
        sys.modules[old] = importlib.import_module(MOVED[old])  # the import system returns what is here


def install() -> None:
    if not any(isinstance(finder, MovedModules) for finder in sys.meta_path):
        sys.meta_path.append(MovedModules())
