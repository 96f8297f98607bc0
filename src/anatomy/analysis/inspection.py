"""`anatomy.inspect(model)` and `anatomy.compare(a, b, ...)`: the report of `anatomy inspect` as a
Python object that renders itself, as the page, inline in a notebook.

    report = anatomy.inspect("llama-3-8b", seq_len=512)
    report["params"]["total"]          # the dict `anatomy inspect --json` prints
    report.save_html("llama.html")     # the page `anatomy inspect --html` writes
    report                             # in Jupyter: the page itself (_repr_html_)
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Mapping

from torch import nn

from anatomy.config import ModelConfig
from anatomy.errors import InputError


class Report(Mapping[str, Any]):
    """The inspect report: a read-only mapping of the --json keys, with its renderings."""

    def __init__(self, data: dict[str, Any]) -> None:
        self.data = data

    def __getitem__(self, key: str) -> Any:
        return self.data[key]

    def __iter__(self):
        return iter(self.data)

    def __len__(self) -> int:
        return len(self.data)

    def to_json(self, **kwargs: Any) -> str:
        return json.dumps(self.data, **kwargs)

    def markdown(self) -> str:
        from anatomy.analysis.render import markdown

        return markdown(self.data)

    def html(self) -> str:
        from anatomy.analysis.page import inspect_page

        return inspect_page(self.data)

    def save_html(self, path: str | os.PathLike[str]) -> Path:
        from anatomy.analysis.page import write_page

        return write_page(self.html(), path, option="path")

    def _repr_html_(self) -> str:
        from anatomy.analysis.page import notebook_frame

        return notebook_frame(self.html())

    def __repr__(self) -> str:
        m = self.data["model"]
        return f"<anatomy report of {m['name']} ({m['architecture']}): {self.data['params']['total']:,} parameters>"


class Comparison(Mapping[str, Report]):
    """Several reports (without their traces), by model name; renders as the comparison page."""

    def __init__(self, reports: dict[str, dict[str, Any]]) -> None:
        self.reports = reports

    def __getitem__(self, name: str) -> Report:
        return Report(self.reports[name])

    def __iter__(self):
        return iter(self.reports)

    def __len__(self) -> int:
        return len(self.reports)

    def html(self) -> str:
        from anatomy.analysis.page import compare_page

        return compare_page(self.reports)

    def save_html(self, path: str | os.PathLike[str]) -> Path:
        from anatomy.analysis.page import write_page

        return write_page(self.html(), path, option="path")

    def _repr_html_(self) -> str:
        from anatomy.analysis.page import notebook_frame

        return notebook_frame(self.html())

    def __repr__(self) -> str:
        return f"<anatomy comparison of {', '.join(self.reports)}>"


def inspect(model: str | os.PathLike[str] | ModelConfig | nn.Module, *, batch_size: int = 1,
            seq_len: int | None = None, context: int | None = None, dtype: str = "bf16", kv_dtype: str | None = None,
            hardware: str = "h100-sxm", tokens: float | None = None, gpus: int = 1, mfu: float = 0.4,
            name: str | None = None) -> Report:
    """The anatomy of a model: a preset name, a config.json / .gguf / installed model name, a
    ModelConfig, or a built model (its config is read; no weights are needed). Options as in
    `anatomy inspect`: seq_len defaults to min(512, max_seq_len), context to max_seq_len."""
    from anatomy.analysis.hardware import get_hardware
    from anatomy.analysis.report import build_report

    config, label = resolve(model)
    options = _options(config, batch_size=batch_size, seq_len=seq_len, context=context, dtype=dtype,
                       kv_dtype=kv_dtype, tokens=tokens, gpus=gpus, mfu=mfu)
    return Report(build_report(config, name=name or label, options=options, hardware=get_hardware(hardware),
                               stored=_stored(model)))


def _stored(model: object) -> dict[str, Any] | None:
    """The real bytes of a loaded model (by format) or of a checkpoint; None for a ModelConfig, a
    preset or a config without weights."""
    if isinstance(model, nn.Module):
        from anatomy.weights.modules import stored_by_format

        by_format = stored_by_format(model)
        return {"source": f"this {type(model).__name__}", "bytes": sum(by_format.values()), "by_format": by_format}
    if isinstance(model, (str, os.PathLike)):
        from anatomy.checkpoints.loader import stored_weights

        return stored_weights(model)
    return None


def compare(*models: str | os.PathLike[str] | ModelConfig | nn.Module, **options: Any) -> Comparison:
    """Several models with the same options (as `anatomy compare`); traces are left out."""
    if not models:
        raise InputError("compare needs at least one model")
    reports = {}
    for model in models:
        data = dict(inspect(model, **options).data)
        data.pop("trace")
        reports[data["model"]["name"]] = data
    return Comparison(reports)


def resolve(model: str | os.PathLike[str] | ModelConfig | nn.Module) -> tuple[ModelConfig, str]:
    """(config, display name) of whatever names or is a model."""
    if isinstance(model, ModelConfig):
        return model, f"{model.architecture} L{model.n_layers} D{model.d_model}"
    if isinstance(model, nn.Module):
        config = getattr(model, "config", None)
        if not isinstance(config, ModelConfig):
            raise InputError(f"{type(model).__name__} has no anatomy ModelConfig in .config")
        return config, type(model).__name__
    if isinstance(model, (str, os.PathLike)):
        from anatomy.checkpoints.loader import load_config

        return load_config(model), str(model)
    raise InputError(f"cannot inspect a {type(model).__name__}: give a name, a path, a ModelConfig or a model")


def _options(config: ModelConfig, *, batch_size: int, seq_len: int | None, context: int | None, dtype: str,
             kv_dtype: str | None, tokens: float | None, gpus: int, mfu: float):
    from anatomy.analysis.memory import check_dtype
    from anatomy.analysis.report import Options

    seq = seq_len if seq_len is not None else min(512, config.max_seq_len)
    context = context if context is not None else config.max_seq_len
    for option, value in (("batch_size", batch_size), ("seq_len", seq), ("context", context), ("gpus", gpus)):
        if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
            raise InputError(f"{option}={value!r} must be a positive integer")
    if tokens is not None and not tokens > 0:
        raise InputError(f"tokens={tokens!r} must be positive")
    if not 0 < mfu <= 1:
        raise InputError(f"mfu={mfu!r} is outside (0, 1]")
    if config.position in ("learned", "sinusoidal"):
        for option, value in (("seq_len", seq),) + ((("context", context),) if not config.is_encoder else ()):
            if value > config.max_seq_len:
                raise InputError(f"{option}={value} exceeds max_seq_len={config.max_seq_len} "
                                 f"(position={config.position!r} has a table of max_seq_len entries)")
    check_dtype(dtype, option="dtype")
    if kv_dtype is not None:
        check_dtype(kv_dtype, option="kv_dtype")
    return Options(batch=batch_size, seq=seq, context=context, dtype=dtype, kv_dtype=kv_dtype, tokens=tokens,
                   gpus=gpus, mfu=mfu)
