"""`python -m benchmarks [--quiet] [NAME ...]`: run every benchmarks/bench_*.py (or the named ones) in turn.

Each module provides main() -> None and prints its own table; on a terminal, progress is shown on
stderr (anatomy/progress.py) unless --quiet."""

from __future__ import annotations

import importlib
import pkgutil
import sys
import time

import benchmarks
from anatomy import progress


def main(argv: list[str]) -> int:
    names = sorted(m.name for m in pkgutil.iter_modules(benchmarks.__path__) if m.name.startswith("bench_"))
    quiet = "--quiet" in argv
    wanted = [n if n.startswith("bench_") else f"bench_{n}" for n in argv if n != "--quiet"] or names
    unknown = sorted(set(wanted) - set(names))
    if unknown:
        print(f"unknown benchmark(s) {unknown}; available: {names}", file=sys.stderr)
        return 2
    with progress.quieted(quiet), progress.task("benchmarks", total=len(wanted)) as bar:
        for name in wanted:
            bar.update(info=name)
            print(f"\n## {name}\n", flush=True)
            start = time.perf_counter()
            importlib.import_module(f"benchmarks.{name}").main()
            print(f"\n({name} took {time.perf_counter() - start:.0f} s)", flush=True)
            bar.advance()
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
