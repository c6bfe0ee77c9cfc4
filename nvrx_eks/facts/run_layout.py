"""Where a local launch keeps its processes' bookkeeping inside a run directory: read by the
launcher that writes it, by the fault injector in the ranks and by the tests."""

from __future__ import annotations

from pathlib import Path

#: The run directory's folder of pid files: the launch's coordinator and NVRx's monitor processes.
PIDS_DIR = "pids"
#: The coordinator's pid file in PIDS_DIR (the coordinator-loss fault reads it; in pods no rank can
#: see the coordinator's process).
COORDINATOR_PIDFILE = "coordinator.pid"


def coordinator_pidfile(run_dir: str | Path) -> Path:
    return Path(run_dir) / PIDS_DIR / COORDINATOR_PIDFILE
