"""What a kernel plan records: the choice per weight and phase, the measurements behind it, the
layouts held and why, as text (describe) and as JSON (the cache file's body)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from anatomy.errors import InputError
from anatomy.kernels.timing import Measurement, Phase

NOISE_LIMIT = 0.5  # a plan whose typical measurement spread exceeds this is kept, and named noisy by `anatomy doctor`


@dataclass
class WeightPlan:
    """The plan for the weights of one signature (and phase set): chosen kernel per phase, layouts held, and why."""

    key: str  # the signature, with the phases when a layer was limited to some
    signature: str
    phases: list[str]  # the phases measured for these layers, in order
    layers: list[str]
    nbytes: int  # bytes of the stored format, per layer
    choices: dict[str, str]  # phase -> kernel name
    forms: list[str]  # layouts held per layer, the first phase's first
    form_bytes: dict[str, int]  # layout -> bytes per layer
    measurements: dict[str, list[Measurement]]  # phase -> every candidate
    reasons: dict[str, str] = field(default_factory=dict)  # phase -> why this layout

    def seconds(self, phase: str) -> float:
        """Measured seconds per call of the chosen kernel at `phase`."""
        return by_kernel(self.measurements[phase])[self.choices[phase]].seconds or 0.0

    def to_json(self) -> dict[str, Any]:
        return {"key": self.key, "signature": self.signature, "phases": self.phases, "layers": self.layers,
                "nbytes": self.nbytes, "choices": self.choices, "forms": self.forms, "form_bytes": self.form_bytes,
                "reasons": self.reasons,
                "measurements": {p: [m.to_json() for m in ms] for p, ms in self.measurements.items()}}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> WeightPlan:
        return cls(key=str(d["key"]), signature=str(d["signature"]), phases=[str(p) for p in d["phases"]],
                   layers=[str(x) for x in d["layers"]], nbytes=int(d["nbytes"]),
                   choices={str(p): str(k) for p, k in d["choices"].items()}, forms=[str(f) for f in d["forms"]],
                   form_bytes={str(f): int(b) for f, b in d["form_bytes"].items()},
                   measurements={str(p): [Measurement.from_json(m) for m in ms] for p, ms in d["measurements"].items()},
                   reasons={str(p): str(r) for p, r in d["reasons"].items()})


@dataclass
class KernelPlan:
    """A plan for a whole model: a WeightPlan per signature, the phases, the memory decision."""

    phases: tuple[Phase, ...]
    weights: dict[str, WeightPlan]  # WeightPlan.key -> plan
    threshold: float
    budget_bytes: int
    extra_bytes: int  # bytes of second layouts, all layers
    measure_seconds: float  # how long measuring took
    noise: float = 0.0  # median spread (slowest - fastest round) / median over the timed candidates
    from_cache: bool = False
    path: Path | None = None

    def for_layer(self, name: str) -> WeightPlan:
        for w in self.weights.values():
            if name in w.layers:
                return w
        raise InputError(f"layer {name!r} is not in this kernel plan ({sum(len(w.layers) for w in self.weights.values())}"
                         " layers)")

    @property
    def trusted(self) -> bool:
        """Measured quietly (typical spread between rounds at most NOISE_LIMIT); a noisy plan is kept
        too, and `anatomy doctor` names it."""
        return self.noise <= NOISE_LIMIT

    def phases_of(self, w: WeightPlan) -> list[Phase]:
        return [p for p in self.phases if p.name in w.phases]

    def describe(self) -> list[str]:
        """One line per phase and signature: the choice, what it beat, what was rejected and why."""
        lines = []
        for phase in self.phases:
            for w in self.weights.values():
                if phase.name in w.phases:
                    lines.append(f"{phase.name:8} {w.signature} x{len(w.layers)}: {_explain(w, phase.name)}")
        mib = self.extra_bytes / 2 ** 20
        lines.append(f"second layouts: {mib:.1f} MiB of a {self.budget_bytes / 2 ** 20:.0f} MiB budget; measured in "
                     f"{self.measure_seconds:.1f} s, typical spread between rounds {self.noise:.0%}"
                     + (f"; loaded from {self.path}" if self.from_cache else "")
                     + ("" if self.trusted else "; measured under noise (is something else running?): kept, so "
                        "every start takes the same path; `anatomy doctor --replan` measures it again"))
        return lines

    def to_json(self) -> dict[str, Any]:
        return {"phases": [[p.name, p.rows, p.max_rows] for p in self.phases], "threshold": self.threshold,
                "budget_bytes": self.budget_bytes, "extra_bytes": self.extra_bytes, "noise": self.noise,
                "measure_seconds": self.measure_seconds, "weights": [w.to_json() for w in self.weights.values()]}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> KernelPlan:
        weights = [WeightPlan.from_json(w) for w in d["weights"]]
        return cls(phases=tuple(Phase(str(n), int(r), None if m is None else int(m)) for n, r, m in d["phases"]),
                   weights={w.key: w for w in weights}, threshold=float(d["threshold"]),
                   budget_bytes=int(d["budget_bytes"]), extra_bytes=int(d["extra_bytes"]),
                   measure_seconds=float(d["measure_seconds"]), noise=float(d["noise"]))


def _explain(w: WeightPlan, phase: str) -> str:
    ms = w.measurements[phase]
    chosen = by_kernel(ms)[w.choices[phase]]
    timed = sorted((m for m in ms if m.eligible and m.kernel != chosen.kernel), key=lambda m: m.seconds)
    text = f"{chosen.kernel} ({_ms(chosen)}, err {chosen.error:.0e})"
    faster = [m for m in timed if m.seconds < chosen.seconds]
    if faster:
        text += " on the held layout; faster elsewhere: " + ", ".join(f"{m.kernel} ({_ms(m)})" for m in faster)
    slower = [m for m in timed if m.seconds >= chosen.seconds]
    if slower:
        text += " beat " + ", ".join(f"{m.kernel} ({_ms(m)})" for m in slower)
    rejected = [f"{m.kernel} ({m.note.split(':')[0]})" for m in ms if not m.eligible]
    if rejected:
        text += "; rejected " + ", ".join(rejected)
    if phase in w.reasons:
        text += f" [{w.reasons[phase]}]"
    return text


def _ms(m: Measurement) -> str:
    return f"{m.seconds * 1e3:.3f} ms" + (" pruned" if m.note.startswith("pruned") else "")


def by_kernel(ms: list[Measurement]) -> dict[str, Measurement]:
    return {m.kernel: m for m in ms}
