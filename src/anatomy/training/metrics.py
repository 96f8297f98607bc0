"""metrics.jsonl, the record of a run: written line by line by rank 0, cut back on resume, read by
`anatomy plot`.

    {"step", "loss", "lr", "grad_norm", "tokens", "tok_s", "mfu", "time"}        one per step
    {"step", "val_loss", "val_ppl", "time"}                                      one per evaluation (step 0: before training)
    {"step", "skipped": true, "loss", "grad_norm", "nonfinite", "tokens", ...}   one per skipped (non-finite) step

A line cut short by a crash, or anything else that is not an object with a numeric "step", is not a
record: readers skip it, and a resumed run drops it.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from anatomy.atomic import atomic_file


class Metrics:
    """Append-only metrics.jsonl, written by rank 0, flushed every line."""

    def __init__(self, path: Path, *, enabled: bool) -> None:
        self.path, self.enabled = path, enabled
        self.start = time.perf_counter()

    def write(self, record: dict[str, Any]) -> None:
        if not self.enabled:
            return
        record = {**record, "time": round(time.perf_counter() - self.start, 3)}
        with open(self.path, "a") as f:
            f.write(json.dumps(record) + "\n")


def parse_record(line: str) -> dict[str, Any] | None:
    """The record of one line, or None when the line is not one."""
    try:
        record = json.loads(line)
    except ValueError:
        return None
    return record if isinstance(record, dict) and is_number(record.get("step")) else None


def is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def truncate_metrics(path: Path, step: int) -> None:
    """On resume: keep the records up to `step` (the later ones are about to be run again)."""
    if not path.is_file():
        return
    records = map(parse_record, path.read_text(encoding="utf-8", errors="replace").splitlines())
    kept = [record for record in records if record is not None and record["step"] <= step]
    with atomic_file(path) as f:
        f.write("".join(json.dumps(record) + "\n" for record in kept).encode())
