"""Starting the ranks on this machine: `anatomy generate/serve --tensor-parallel-size N` runs itself
N x M times under torch's elastic agent (what torchrun runs), one process per rank.

    code = launch(["generate", "Hi", "--tensor-parallel-size", "2"], world=2, command="generate")

Rank 0's output is this terminal's. When a rank dies the agent stops the others and this process
says which rank failed, in one line; if the launcher itself dies the ranks end too (`watch_parent`).
Each rank gets an equal share of the cores. Under torchrun the same command runs as a rank directly.
docs/parallel.md, "Launching, and when a rank dies".
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

LAUNCHED_ENV = "ANATOMY_PARALLEL_LAUNCHER"  # set for the ranks this launcher starts
TAIL_LINES = 20


def launch(argv: list[str], *, world: int, command: str) -> int:
    """Run `anatomy <argv>` as `world` ranks on this machine; their exit code (0 when all succeeded)."""
    from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs, Std
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    logs = Path(tempfile.mkdtemp(prefix="anatomy-ranks-"))
    specs = DefaultLogsSpecs(log_dir=str(logs), redirects={r: Std.ALL for r in range(1, world)})
    config = LaunchConfig(min_nodes=1, max_nodes=1, nproc_per_node=world, logs_specs=specs, rdzv_backend="c10d",
                          rdzv_endpoint="127.0.0.1:0", run_id=f"anatomy-{uuid.uuid4().hex[:8]}", max_restarts=0,
                          monitor_interval=0.1, local_addr="127.0.0.1", shutdown_timeout=5)
    try:
        with _rank_environment(world), _quiet_agent():
            elastic_launch(config, sys.executable)("-m", "anatomy", *argv)
        return 0
    except ChildFailedError as exc:
        return _report(exc, logs, world=world, command=command)
    except SignalException as exc:
        if exc.sigval.name == "SIGINT":
            raise KeyboardInterrupt from None
        print(f"anatomy {command}: stopped by {exc.sigval.name}: the ranks were stopped", file=sys.stderr)
        return 1
    finally:
        shutil.rmtree(logs, ignore_errors=True)


def _report(exc, logs: Path, *, world: int, command: str) -> int:
    """One line for the rank that failed first (rank 0's own error it printed itself); its exit code.
    Another rank's death comes first even when rank 0 then exits with an error of its own (a served
    rank 0 drains its requests when the launcher stops it, and says that a collective failed)."""
    rank, failure = exc.get_first_failure()
    if rank == 0 and failure.exitcode > 0:
        return failure.exitcode  # rank 0 said what went wrong on this terminal already
    how = (f"was killed by {failure.signal_name()}" if failure.exitcode < 0
           else f"exited with code {failure.exitcode}")
    tail = _tail(logs, rank)
    said = next((line for line in reversed(tail) if line.startswith(f"anatomy {command}: error:")), None)
    if said is not None:  # the rank's own one-line error (bad input only it could see)
        print(said, file=sys.stderr)
        return failure.exitcode
    print(f"anatomy {command}: error: rank {rank} of {world} (pid {failure.pid}) {how}; the other ranks were "
          "stopped", file=sys.stderr)
    if tail:
        print("\n".join(f"  rank {rank}: {line}" for line in tail), file=sys.stderr)
    return 1


def _tail(logs: Path, rank: int) -> list[str]:
    for path in logs.glob(f"*/attempt_*/{rank}/stderr.log"):
        return path.read_text(errors="replace").splitlines()[-TAIL_LINES:]
    return []


@contextlib.contextmanager
def _rank_environment(world: int) -> Iterator[None]:
    """The environment the ranks inherit: the launcher's mark, a share of the cores each."""
    saved = dict(os.environ)
    os.environ[LAUNCHED_ENV] = str(os.getpid())
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // world)))
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


@contextlib.contextmanager
def _quiet_agent() -> Iterator[None]:
    """The agent logs its configuration and every failure at length: this module says what matters."""
    logger = logging.getLogger("torch.distributed.elastic")
    level, logger.level = logger.level, logging.CRITICAL
    try:
        yield
    finally:
        logger.setLevel(level)


def watch_parent(interval_s: float = 1.0) -> None:
    """End this rank if the process that started it goes away (its launcher killed: nobody would stop it)."""
    parent = os.getppid()

    def watch() -> None:
        while True:
            time.sleep(interval_s)
            if os.getppid() != parent:
                print(f"anatomy: rank {os.environ.get('RANK', '?')}: the launcher (pid {parent}) is gone; stopping",
                      file=sys.stderr, flush=True)
                os._exit(1)

    threading.Thread(target=watch, name="anatomy-parent-watch", daemon=True).start()
