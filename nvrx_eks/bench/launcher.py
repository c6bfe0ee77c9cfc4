"""How `nvrx-eks bench` starts processes: trainer runs one at a time through `nvrx-eks local`'s
runner (ft_launcher, the CPU profile of short timeouts), the full-relaunch baseline, and the
in-memory copy floor (`nvrx_eks.bench.floor`) in processes of its own."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console

from nvrx_eks.bench.settings import BenchSettings
from nvrx_eks.facts.exit_codes import EXIT_DO_NOT_REQUEUE


class BenchRunFailed(RuntimeError):
    """A trainer run did not end the way its scenario requires."""


@dataclass
class Launch:
    run_dir: Path
    exit_code: int
    wall_s: float
    killed_after_exit: list[int]


@dataclass
class Launcher:
    """Starts trainer runs one at a time under `root` and remembers every process it had to kill
    after a run (there should be none)."""

    root: Path
    settings: BenchSettings
    progress: Callable[[str], None]
    # Rendezvous port P (P+1 is used too) for each run; default: any free pair.
    ports: Callable[[], int] | None = None
    launches: list[Launch] = field(default_factory=list)

    def _overrides(self, extra: tuple[str, ...]) -> tuple[str, ...]:
        return (f"distributed.backend={self.settings.dist_backend}", *extra, *self.settings.overrides)

    def once(self, name: str, *, extra: tuple[str, ...] = (), **knobs: Any) -> Launch:
        """One run in ROOT/NAME: `knobs` are its LocalRun's (no faults, and the settings' nproc and
        checkpoint interval, unless given), and `extra` trainer overrides go beside the settings' own."""
        from nvrx_eks.local.runner import LocalRun, run_local

        run_dir = self.root / name
        run = LocalRun(
            run_dir=run_dir,
            overrides=self._overrides(extra),
            port=self.ports() if self.ports else None,
            **{"faults": "", "nproc": self.settings.nproc, "checkpoint_interval": self.settings.interval, **knobs},
        )
        started = time.monotonic()
        with open(os.devnull, "w") as sink:
            code = run_local(run, console=Console(file=sink))
        record = json.loads((run_dir / "local_run.json").read_text())
        launch = Launch(run_dir, code, time.monotonic() - started, record["killed_after_exit"])
        self.launches.append(launch)
        return launch

    def completed(self, name: str, **kwargs: Any) -> Path:
        launch = self.once(name, **kwargs)
        if launch.exit_code != 0:
            raise BenchRunFailed(
                f"{name}: the trainer exited with {launch.exit_code}; see {launch.run_dir / 'launcher.log'}"
            )
        return launch.run_dir

    def relaunched_until_done(self, name: str, *, max_launches: int, **kwargs: Any) -> int:
        """The full-relaunch baseline: ft_launcher may not restart anything, so a fault ends the
        job; it is started again at once with the same run directory (resuming from the newest
        committed checkpoint) until it completes. Returns the number of launches."""
        for count in range(1, max_launches + 1):
            launch = self.once(name, resume=count > 1, **kwargs)
            if launch.exit_code == 0:
                return count
            if launch.exit_code == EXIT_DO_NOT_REQUEUE:
                raise BenchRunFailed(
                    f"{name}: the trainer asked not to be restarted (exit {EXIT_DO_NOT_REQUEUE}); "
                    f"see {launch.run_dir / 'launcher.log'}"
                )
        raise BenchRunFailed(
            f"{name}: still not complete after {max_launches} launches; see {self.root / name / 'launcher.log'}"
        )

    def drop_checkpoints(self, run_dir: Path) -> None:
        """Checkpoints are hundreds of MB per run and nothing reads them after the analysis;
        the event logs stay for `nvrx-eks report`."""
        shutil.rmtree(run_dir / "checkpoints", ignore_errors=True)


def measure_floor(settings: BenchSettings, out: Path, repeats: int = 7) -> dict:
    """nvrx_eks.bench.floor in its own processes (ranks need a fresh process group), with the
    same thread setting as the trainer's ranks."""
    from nvrx_eks.local.processes import free_port_pair

    result_path = out / "floor.json"
    argv = [
        sys.executable,
        "-m",
        "nvrx_eks.bench.floor",
        "--preset",
        settings.preset,
        "--nproc",
        str(settings.nproc),
        "--repeats",
        str(repeats),
        "--dist-backend",
        settings.dist_backend,
        "--port",
        str(free_port_pair()),
        "--json",
        str(result_path),
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TORCH_CPP_LOG_LEVEL": "ERROR"}
    # The child inherits the working directory and environment: it imports nvrx_eks as this process did.
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=900)
    # Rank 0 writes the result only after every rank's timings were gathered: a result on disk is
    # complete even if a rank then crashed tearing the process group down (kept in the record).
    if not result_path.is_file():
        raise BenchRunFailed(
            f"the in-memory copy measurement failed ({done.returncode}): {done.stderr.strip()[-2000:]}"
        )
    return {**json.loads(result_path.read_text()), "exit_code": done.returncode}
