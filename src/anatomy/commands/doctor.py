"""`anatomy doctor`: what this installation runs (torch, the native kernels, the kernel plan cache,
llguidance, the default models) and, for each missing piece, the one command that fixes it.
--json for machines; --build compiles the native kernels now where they are missing."""

from __future__ import annotations

import argparse
import json
import sys

from anatomy import installation


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("doctor", help="what this installation runs (torch, native kernels, plans, models) and "
                                      "the command that fixes what is missing")
    p.add_argument("--json", action="store_true", help="one JSON object on stdout")
    p.add_argument("--build", action="store_true",
                   help="compile the native kernels now where they are missing (retrying a failed build)")
    p.add_argument("--replan", action="store_true",
                   help="forget the kernel plans measured while the machine was busy, so that the next start "
                        "measures them again (run it on a quiet machine)")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    if args.build:
        _build()
    if args.replan:
        _replan()
    facts = installation.report()
    if args.json:
        print(json.dumps({"installation": installation.platform_line(), **installation.python_details(),
                          "ok": all(f.ok for f in facts), "facts": [f.as_dict() for f in facts]}, indent=1))
        return 0
    print(installation.platform_line())
    width = max(len(f.name) for f in facts)
    for fact in facts:
        print(f"  {'ok' if fact.ok else 'MISSING':8} {fact.name:{width}}  {fact.summary}")
        if fact.fix:
            print(f"  {'':8} {'':{width}}  fix: {fact.fix}")
    return 0


def _replan() -> None:
    from anatomy.kernels.cache import noisy_plans

    forgotten = noisy_plans()
    for path in forgotten:
        path.unlink(missing_ok=True)
    print(f"forgot {len(forgotten)} kernel plan{'s' if len(forgotten) != 1 else ''} measured under noise",
          file=sys.stderr)


def _build() -> None:
    """Compile the library into the per-user cache where none is found; the compiler's output's end on
    stderr when it fails."""
    from anatomy.kernels.native import library

    path, _ = library.obtain(retry=True)
    if path is None and library.failure_log().is_file():
        tail = library.failure_log().read_text(errors="replace").splitlines()[-20:]
        print("\n".join(tail), file=sys.stderr)
