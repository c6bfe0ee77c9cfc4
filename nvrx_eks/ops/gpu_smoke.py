"""`nvrx-eks gpu-smoke`: the GPU path end to end on one machine, before it meets a cluster.

On a machine with one or more GPUs it runs the real trainer under ft_launcher, one rank per GPU,
with the NCCL backend and bf16 compute, and checks, printing the numbers and writing a JSON:

1. faults:  an exception (rank 0) and a hang (last rank) each recovered by the in-process layer
            (same pids, no launcher restart, no in-process restart left unfinished), async NVRx
            checkpoints committed along the way (nvrx_eks.ops.smoke_verdicts.faults_check);
2. resume:  a second launch on the same run directory continues from the last committed step;
3. stall:   the median checkpoint stall of the async (nvrx) backend against a synchronous run;
4. memory:  each rank's GPU high-water mark (torch.cuda.max_memory_reserved) against the part of
            workloads.memory's estimate that the allocator counts, within a stated tolerance
            (smoke_verdicts.memory_check, MEMORY_COMPARED), with the allocator's retry count.

The smoke's own process never initializes CUDA: the GPUs, torch's CUDA and NCCL, the allocator's
settings and the attention kernel the ranks will run are read by a short-lived child
(nvrx_eks.ops.gpu_env) and recorded under "device".

Before any launch the plan is checked, each failure a one-line error naming the fix (exit 2): the
preset must fit the GPU's memory (workloads.memory.check_fits), the disk where the runs go must
hold the checkpoints the smoke keeps at once, and /dev/shm the state NVRx's async save stages there.

Each phase's numbers include its throughput (tokens/s per rank, and MFU on a GPU with a published
peak). `--budget-s` bounds the wall time: a phase that would not fit in what is left is recorded as
skipped for the budget instead of run, and gpu_smoke.json is rewritten after every phase, so a
smoke killed half way leaves the phases it finished.

`--dry-run` runs the same code path on CPU (gloo, the tiny preset, 2 ranks, no memory figures):
the test suite runs it, so the script is known to work before a GPU is at hand. No figure in the
JSON is ever filled in by anything but a measurement of this run.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console

from nvrx_eks.facts.errors import ConfigError
from nvrx_eks.facts.exit_codes import EXIT_CONFIG_ERROR
from nvrx_eks.ops.smoke_report import SmokeReport
from nvrx_eks.ops.smoke_verdicts import faults_check, memory_check

if TYPE_CHECKING:
    from workloads.config import TrainConfig
    from workloads.events import RunEvents

#: Timeouts for the GPU runs: the local CPU profile's are sized for a tiny model on CPU; a GPU
#: run's setup (CUDA context, NCCL communicator, a 1B model) needs more, and TrainConfig's rules
#: (ft timeouts above the in-process recovery bound, which on GPU counts the CUDA checks) hold.
GPU_OVERRIDES = (
    "distributed.backend=nccl",
    "inprocess.soft_timeout_s=20",
    "inprocess.hard_timeout_s=40",
    "inprocess.barrier_timeout_s=60",
    "inprocess.completion_timeout_s=60",
    "inprocess.heartbeat_timeout_s=30",
    "inprocess.cuda_timeout_s=10",
    "fault_tolerance.section_timeouts_s.step=60",
    "fault_tolerance.out_of_section_timeout_s=200",
)
#: Overrides of every smoke run. Rank 0's TensorBoard writer is no part of what the smoke checks,
#: and a bare GPU machine has no tensorboard package (nor room for it in the carried wheels:
#: scripts/gpu_wheels.py).
SMOKE_OVERRIDES = ("metrics.tensorboard=false",)

#: Where NVRx's async save stages each rank's state (cpu_shm: shared host memory, one tensor at a
#: time, 12 bytes per parameter per rank; workloads.memory's host_staging).
SHM_DIR = Path("/dev/shm")
#: /dev/shm must hold the staged state with this much to spare: it is allocated per tensor, and
#: a tmpfs page touched past the mount's size is a SIGBUS in the rank, not an error.
SHM_HEADROOM = 1.2
#: Checkpoints a run holds on disk at once beyond its `keep` committed ones: the one being written
#: and one orphaned by a fault (its files are removed only at the next commit).
CHECKPOINTS_IN_FLIGHT = 2

#: Tokens per sequence of a GPU smoke: the 1b preset's longest.
GPU_SEQ_LEN = 2048
#: Sequences per rank and step of a GPU smoke.
GPU_BATCH_SIZE = 2
#: The model of a GPU smoke without --preset (scripts/gpu-smoke-device.sh asks for small: one
#: GPU runs every phase of it within the device's budget).
DEFAULT_GPU_PRESET = "1b"

#: The default wall-clock budget of a smoke, under 8 minutes: a GPU machine rented for a short
#: slot (its start-up included) runs the whole smoke and has time left to run it again.
DEFAULT_BUDGET_S = 480.0


class Budget:
    """The smoke's wall-clock budget and the estimate of a launch's length.

    Nothing is known before the first launch, so the faults phase always runs; a later launch
    runs only if the time left covers the longest launch so far (the faults phase, with its two
    restarts and a fresh start-up, is the longest of the smoke's launches)."""

    def __init__(self, budget_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.budget_s = budget_s
        self._clock = clock
        self._start = clock()
        self.longest_launch_s = 0.0

    def left_s(self) -> float:
        return self.budget_s - (self._clock() - self._start)

    def fits_a_launch(self) -> bool:
        return self.left_s() >= self.longest_launch_s

    def skipped(self) -> dict[str, Any]:
        """What a phase that would not fit says instead of its numbers."""
        return {"ok": None, "skipped": "budget", "left_s": round(self.left_s(), 1), "needed_s": self.longest_launch_s}

    def launch(self, run: Callable[[], dict[str, Any]]) -> dict[str, Any]:
        """`run()`, its wall time recorded (as "wall_s") and remembered for the next estimate."""
        began = self._clock()
        result = run()
        result["wall_s"] = round(self._clock() - began, 1)
        self.longest_launch_s = max(self.longest_launch_s, result["wall_s"])
        return result


#: A launch's exit code when this command was told to stop (SIGTERM, SIGHUP: run_local stops its
#: launchers as an eviction would and returns 128 + the signal).
STOPPED_CODES = frozenset({128 + signal.SIGTERM, 128 + signal.SIGHUP})

#: The launcher's log in a run directory (nvrx_eks.local.runner writes node 0's there).
LAUNCHER_LOG = "launcher.log"
#: How much of it a report holds when no rank started.
LOG_TAIL_LINES = 50


@dataclass(frozen=True)
class SmokePlan:
    nproc: int
    preset: str
    seq_len: int
    batch_size: int
    steps: int
    interval: int
    gpu: bool
    #: Stated rather than left to auto: the GPU smoke is the check of the bf16 path.
    precision: str = "fp32"
    #: The GPU's dense bf16 peak (nvrx_eks/facts/instances.py), for MFU; None: MFU is n/a.
    peak_tflops: float | None = None

    @property
    def overrides(self) -> list[str]:
        base = [
            *SMOKE_OVERRIDES,
            f"data.seq_len={self.seq_len}",
            f"data.batch_size={self.batch_size}",
            f"distributed.precision={self.precision}",
        ]
        if self.peak_tflops is not None:
            base.append(f"peak_tflops_per_gpu={self.peak_tflops}")
        return base + (list(GPU_OVERRIDES) if self.gpu else [])

    @property
    def described(self) -> dict[str, Any]:
        """What the smoke runs, as its report starts."""
        return {
            "mode": "gpu" if self.gpu else "dry-run (cpu, gloo)",
            "nproc": self.nproc,
            "preset": self.preset,
            "precision": self.precision,
            "seq_len": self.seq_len,
            "batch_size": self.batch_size,
        }

    @property
    def faults(self) -> str:
        return f"exception@{self.interval + 2}:0,hang@{2 * self.interval + 2}:{self.nproc - 1}"

    @property
    def sync_steps(self) -> int:
        """The stall phase's synchronous run: two saves, enough for a median."""
        return 2 * self.interval

    def train_config(self, run_dir: Path) -> TrainConfig:
        """The faulted run's configuration, as nvrx_eks.local.runner will write it."""
        from nvrx_eks.local.runner import local_config

        return local_config(
            run_dir=run_dir,
            steps=self.steps,
            faults=self.faults,
            preset=self.preset,
            checkpoint_interval=self.interval,
            backend="nvrx",
            overrides=self.overrides,
        )


@dataclass(frozen=True)
class Room:
    """What the smoke's runs take outside the GPU, at most, at any one time."""

    #: Checkpoints on the disk where the runs go.
    disk_bytes: int
    #: NVRx's staging in /dev/shm, with SHM_HEADROOM.
    shm_bytes: int
    #: One checkpoint of the whole job (every rank's state).
    checkpoint_bytes: int
    #: How many of them the disk holds at once.
    checkpoints: int


def room_needed(plan: SmokePlan, train: TrainConfig) -> Room:
    """The faulted run holds `keep` committed checkpoints plus CHECKPOINTS_IN_FLIGHT; the resume
    ends with a commit, which leaves `keep`, and beside those the sync run holds its saves, at most
    `keep` + 1 of them. All ranks run on this machine, so all their staging is in its /dev/shm."""
    from workloads.memory import estimate_for

    checkpoint = estimate_for(train, plan.nproc).host_staging * plan.nproc
    keep = train.checkpoint.keep
    sync_saves = min(keep + 1, plan.sync_steps // plan.interval)
    checkpoints = max(keep + CHECKPOINTS_IN_FLIGHT, keep + sync_saves)
    return Room(
        disk_bytes=checkpoints * checkpoint,
        shm_bytes=int(SHM_HEADROOM * checkpoint),
        checkpoint_bytes=checkpoint,
        checkpoints=checkpoints,
    )


def check_room(room: Room, runs_dir: Path, shm_dir: Path = SHM_DIR) -> None:
    """A ConfigError naming the fix when the disk under `runs_dir` or `shm_dir` is too small: a run
    that runs out of either ends in a rank's ENOSPC or SIGBUS minutes in, with no report."""
    from workloads.memory import GIB

    existing = next(p for p in (runs_dir, *runs_dir.parents) if p.exists())
    free = shutil.disk_usage(existing).free
    if free < room.disk_bytes:
        raise ConfigError(
            f"--out: {existing} has {free / GIB:.1f} GiB free; the smoke's checkpoints need "
            f"{room.disk_bytes / GIB:.1f} GiB ({room.checkpoints} of {room.checkpoint_bytes / GIB:.1f} GiB at "
            "once); put --out on a disk with more room, or choose a smaller --preset"
        )
    shm_free = shutil.disk_usage(shm_dir).free if shm_dir.is_dir() else 0
    if shm_free < room.shm_bytes:
        raise ConfigError(
            f"{shm_dir}: {shm_free / GIB:.1f} GiB free; NVRx's async save stages "
            f"{room.checkpoint_bytes / GIB:.1f} GiB there and needs {room.shm_bytes / GIB:.1f} GiB "
            f"({SHM_HEADROOM:g}x); enlarge it (as root: mount -o remount,size=<GiB>G {shm_dir}), or choose a "
            "smaller --preset"
        )


def check_fit(plan: SmokePlan, train: TrainConfig, gpu_name: str, gpu_memory_bytes: int) -> None:
    """A ConfigError when workloads.memory's fit check refuses the preset on this GPU: refused
    before a launch whose ranks would run out of memory after minutes of setup."""
    from workloads.memory import GIB, check_fits, estimate_for

    if check_fits(train, plan.nproc, gpu_memory_bytes / GIB, gpu_name) is None:
        return
    raise ConfigError(
        f"--preset {plan.preset}: the estimated memory per GPU at {plan.nproc} rank(s), "
        f"{estimate_for(train, plan.nproc, gpu_memory_bytes=gpu_memory_bytes).describe()}, exceeds the "
        f"{gpu_memory_bytes / GIB:.1f} GiB of one "
        f"{gpu_name}; choose a smaller --preset (small, 1b) or more GPUs with --nproc"
    )


def plan_for(dry_run: bool, preset: str | None, nproc: int | None, device: dict[str, Any] | None = None) -> SmokePlan:
    """The dry run's plan, or the plan for the GPUs `device` describes (read_device)."""
    if dry_run:
        return SmokePlan(
            nproc=nproc or 2, preset=preset or "tiny", seq_len=64, batch_size=8, steps=20, interval=5, gpu=False
        )
    gpus = device["gpus"] if device else []
    return gpu_plan(len(gpus), gpus[0]["name"] if gpus else "", preset, nproc)


def read_device(preset: str | None) -> dict[str, Any]:
    """The GPU machine as nvrx_eks.ops.gpu_env reads it in a child process, for `preset`'s shapes:
    this process never initializes CUDA."""
    from nvrx_eks.ops.gpu_env import read_gpu_facts

    preset = preset or DEFAULT_GPU_PRESET
    return read_gpu_facts(preset, gpu_seq_len(preset), GPU_BATCH_SIZE)


def gpu_seq_len(preset: str) -> int:
    """GPU_SEQ_LEN, or a shorter preset's longest (small); an unknown preset is refused by the
    configuration, naming model.preset."""
    from workloads.presets import MODEL_PRESETS

    shape = MODEL_PRESETS.get(preset)
    return min(GPU_SEQ_LEN, shape.max_seq_len) if shape else GPU_SEQ_LEN


def gpu_plan(gpus: int, device_name: str, preset: str | None, nproc: int | None) -> SmokePlan:
    """The plan on a machine with `gpus` GPUs named `device_name`: one rank per GPU by default."""
    from nvrx_eks.facts.instances import PEAK_BF16_DENSE_TFLOPS

    if gpus < 1:
        raise ConfigError(
            "gpu-smoke: no CUDA GPU is visible; run it on a GPU machine, or pass --dry-run "
            "to exercise the same path on CPU"
        )
    if nproc is not None and nproc > gpus:
        raise ConfigError(f"--nproc: {nproc} ranks need {nproc} GPUs; this machine has {gpus}")
    peak = next((tflops for model, tflops in PEAK_BF16_DENSE_TFLOPS.items() if model in device_name), None)
    preset = preset or DEFAULT_GPU_PRESET
    # nproc 1 leaves no second rank to hang; the hang then targets rank 0 after its exception.
    return SmokePlan(
        nproc=nproc or gpus,
        preset=preset,
        seq_len=gpu_seq_len(preset),
        batch_size=GPU_BATCH_SIZE,
        steps=30,
        interval=5,
        gpu=True,
        precision="bf16",
        peak_tflops=peak,
    )


def _run(
    plan: SmokePlan, run_dir: Path, *, steps: int, faults: str, backend: str, resume: bool, console: Console
) -> dict[str, Any]:
    from nvrx_eks.local.runner import LocalRun, run_local
    from workloads.events import load_run

    local_run = LocalRun(
        nproc=plan.nproc,
        steps=steps,
        faults=faults,
        run_dir=run_dir,
        preset=plan.preset,
        checkpoint_interval=plan.interval,
        backend=backend,
        resume=resume,
        overrides=tuple(plan.overrides),
    )
    code = run_local(local_run, console=console, print_summary=False)
    run = load_run(run_dir)
    summary_path = run_dir / "summary.json"
    return {
        "exit_code": code,
        "run": run,
        "summary": json.loads(summary_path.read_text()) if summary_path.is_file() else None,
    }


def smoke(
    *,
    out_dir: Path,
    dry_run: bool = False,
    preset: str | None = None,
    nproc: int | None = None,
    console: Console | None = None,
    budget_s: float | None = None,
) -> dict[str, Any]:
    """Run the checks within `budget_s` seconds (None: DEFAULT_BUDGET_S); returns the measured
    results and writes them to out_dir/gpu_smoke.json after every phase ("complete": false until
    the last)."""
    checks = _prepare(out_dir, dry_run, preset, nproc, console or Console(), budget_s)
    for phase in (checks.faults, checks.resume, checks.stall):
        then = phase()
        if then is not Then.GO_ON:
            return checks.report.final(stopped=then is Then.STOP)
        checks.report.write_so_far()
    checks.memory()
    return checks.report.final()


class Then(Enum):
    """What the smoke does after a phase."""

    GO_ON = "the next phase"
    END = "end the report here: a failure the later phases would repeat"
    STOP = "end the report as stopped: the launch was told to stop"


def _prepare(
    out_dir: Path, dry_run: bool, preset: str | None, nproc: int | None, console: Console, budget_s: float | None
) -> _SmokeChecks:
    """The smoke's plan, refused before any launch when the arguments, the GPU's memory or the
    disks cannot hold it."""
    out_dir = out_dir.resolve()
    if out_dir.exists() and any(out_dir.iterdir()):
        raise ConfigError(f"--out: {out_dir} is not empty; choose a new directory")
    budget_s = DEFAULT_BUDGET_S if budget_s is None else budget_s
    if budget_s <= 0:
        raise ConfigError(f"--budget-s: {budget_s:g} is not above 0; give the seconds the smoke may take")
    device = None if dry_run else read_device(preset)
    plan = plan_for(dry_run, preset, nproc, device)
    train = plan.train_config(out_dir / FAULTED_DIR)
    gpu_memory_bytes = None  # the GPU's, for the fit and for model.activation_checkpointing=auto
    if device is not None:
        gpu_memory_bytes = device["gpus"][0]["total_memory_bytes"]
        check_fit(plan, train, device["gpus"][0]["name"], gpu_memory_bytes)
    check_room(room_needed(plan, train), out_dir)
    budget = Budget(budget_s)
    out_dir.mkdir(parents=True, exist_ok=True)
    report = SmokeReport(out_dir, console, plan.described, budget_s, device)
    return _SmokeChecks(plan, train, gpu_memory_bytes, budget, report)


#: The faulted run's directory under --out; the resume launch continues it.
FAULTED_DIR = "faulted"


@dataclass
class _SmokeChecks:
    """The smoke's four checks, one method each, in the order smoke() runs them; each adds its
    result to the report."""

    plan: SmokePlan
    train: TrainConfig
    gpu_memory_bytes: int | None
    budget: Budget
    report: SmokeReport
    #: The faulted launch (its run's events and summary), which the later checks read.
    faulted: dict[str, Any] = field(default_factory=dict)
    #: Every run_end so far: the memory check's peaks.
    run_ends: list[dict[str, Any]] = field(default_factory=list)

    @property
    def faulted_run(self) -> RunEvents:
        return self.faulted["run"]

    def faults(self) -> Then:
        """1. Faults recovered in process, with async checkpoints."""
        plan, faulted_dir = self.plan, self.report.out_dir / FAULTED_DIR
        self.faulted = self.budget.launch(
            lambda: self._launch(faulted_dir, steps=plan.steps, faults=plan.faults, backend="nvrx", resume=False)
        )
        run, exit_code = self.faulted_run, self.faulted["exit_code"]
        starts = run.of("run_start", rank=0)
        if not starts:
            # An import, CUDA or NCCL error before the trainer ran: the later phases would fail the
            # same way, so the report ends here, with what the launcher saw.
            self.report.checks["faults"] = {
                "ok": False,
                "exit_code": exit_code,
                "error": "no rank started training (no run_start event); see launcher_log_tail",
                "launcher_log_tail": _log_tail(faulted_dir / LAUNCHER_LOG),
            }
            return Then.STOP if exit_code in STOPPED_CODES else Then.END
        self.report.checks["faults"] = {
            **faults_check(run, plan.faults, exit_code),
            "backend": starts[0].get("backend"),
            "commits": len(run.of("checkpoint_commit", rank=0)),
            "wall_s": self.faulted["wall_s"],
            **_throughput(run.of("step_end", rank=0)),
        }
        self.run_ends = run.of("run_end")
        return _after(self.faulted)

    def resume(self) -> Then:
        """2. Resume: a new launch continues from the last committed step."""
        if not self.budget.fits_a_launch():
            self.report.checks["resume"] = self.budget.skipped()
            return Then.GO_ON
        plan = self.plan
        resumed = self.budget.launch(
            lambda: self._launch(
                self.report.out_dir / FAULTED_DIR,
                steps=plan.steps + plan.interval,
                faults=plan.faults,
                backend="nvrx",
                resume=True,
            )
        )
        faulted_end_t = self.faulted_run.events[-1]["t"]
        self.run_ends += [e for e in resumed["run"].of("run_end") if e["t"] > faulted_end_t]
        cycle_starts = [e for e in resumed["run"].of("setup_end", rank=0) if e["t"] > faulted_end_t]
        resumed_from = cycle_starts[0]["resumed_from_step"] if cycle_starts else None
        self.report.checks["resume"] = {
            "ok": resumed["exit_code"] == 0 and resumed_from == plan.steps,
            "exit_code": resumed["exit_code"],
            "resumed_from_step": resumed_from,
            "wall_s": resumed["wall_s"],
            **_throughput([e for e in resumed["run"].of("step_end", rank=0) if e["t"] > faulted_end_t]),
        }
        return _after(resumed)

    def stall(self) -> Then:
        """3. Stall: async (from the faulted run) against synchronous saves."""
        if not self.budget.fits_a_launch():
            self.report.checks["stall"] = self.budget.skipped()
            return Then.GO_ON
        sync = self.budget.launch(
            lambda: self._launch(
                self.report.out_dir / "sync", steps=self.plan.sync_steps, faults="", backend="sync", resume=False
            )
        )
        async_stall = (self.faulted["summary"] or {}).get("checkpoints", {}).get("median_stall_s")
        sync_stall = (sync["summary"] or {}).get("checkpoints", {}).get("median_stall_s")
        self.report.checks["stall"] = {
            "ok": sync["exit_code"] == 0 and async_stall is not None and sync_stall is not None,
            "async_median_s": None if async_stall is None else round(async_stall, 4),
            "sync_median_s": None if sync_stall is None else round(sync_stall, 4),
            "wall_s": sync["wall_s"],
            **_throughput(sync["run"].of("step_end", rank=0)),
        }
        return _after(sync)

    def memory(self) -> None:
        """4. Memory: the high-water mark of each rank against the part of the estimate it measures."""
        from workloads.memory import estimate_for

        plan = self.plan
        estimate = estimate_for(
            self.train, plan.nproc, bf16=plan.precision == "bf16", gpu_memory_bytes=self.gpu_memory_bytes
        )
        self.report.checks["memory"] = memory_check(estimate, self.run_ends, plan.gpu, self.faulted_run.of("setup_end"))

    def _launch(self, run_dir: Path, *, steps: int, faults: str, backend: str, resume: bool) -> dict[str, Any]:
        return _run(
            self.plan, run_dir, steps=steps, faults=faults, backend=backend, resume=resume, console=self.report.console
        )


def _after(launch: dict[str, Any]) -> Then:
    """A launch told to stop (SIGTERM, SIGHUP) stops the smoke; any other exit is the check's to judge."""
    return Then.STOP if launch["exit_code"] in STOPPED_CODES else Then.GO_ON


def _throughput(step_ends: list[dict[str, Any]]) -> dict[str, Any]:
    """A phase's median tokens/s per rank and MFU (None on CPU, or without a published peak)."""
    from workloads.metrics import summarize_throughput

    measured = summarize_throughput(step_ends)
    per_rank, mfu = measured["tokens_per_s_per_gpu"], measured["mfu"]
    return {
        "tokens_per_s_per_rank": None if per_rank is None else round(per_rank),
        "mfu": None if mfu is None else round(mfu, 3),
    }


def _log_tail(path: Path, lines: int = LOG_TAIL_LINES) -> list[str]:
    """The last `lines` lines of `path`; none when it was never written."""
    if not path.is_file():
        return []
    return path.read_text(encoding="utf-8", errors="replace").splitlines()[-lines:]


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(
        prog="python -m nvrx_eks.ops.gpu_smoke",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--out", required=True, type=Path, help="a new directory for the runs and gpu_smoke.json")
    parser.add_argument("--dry-run", action="store_true", help="CPU, gloo, tiny preset: the same code path")
    parser.add_argument("--preset", default=None, help="model preset (default: 1b on GPU, tiny dry)")
    parser.add_argument("--nproc", type=int, default=None, help="ranks (default: one per visible GPU)")
    parser.add_argument(
        "--budget-s",
        type=float,
        default=DEFAULT_BUDGET_S,
        help=f"seconds the smoke may take; a phase that would not fit is skipped (default {DEFAULT_BUDGET_S:g})",
    )
    args = parser.parse_args(argv)
    os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")
    try:
        result = smoke(
            out_dir=args.out, dry_run=args.dry_run, preset=args.preset, nproc=args.nproc, budget_s=args.budget_s
        )
    except ConfigError as err:
        print(f"error: {err}")
        return EXIT_CONFIG_ERROR
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
