"""Run events: the JSONL each rank appends, and the reader the reports build on. No torch.

Layout: `<run_dir>/events/rank<R>.jsonl`, one file per initial rank (ranks never interleave lines
in one file, which matters on Lustre), appended by every process that ever held that rank, so the
files span in-process and launcher restarts. Lines are written unbuffered-per-line: a SIGKILL
loses nothing that was emitted before it.

Every line is one JSON object with these common fields:
    v          schema version (1)
    t          wall clock, seconds since the epoch (float); compare across ranks on one host,
               across hosts only to clock-sync precision
    event      the event name (below)
    rank       initial rank of the emitting process
    pid        process id (unchanged across in-process restarts, new after a launcher restart)
    host       hostname
    cycle      ft_launcher restart count of the process (TORCHELASTIC_RESTART_COUNT)
    iteration  NVRx in-process restart iteration within the process (0 before any restart)
    attempt    the JobSet's restart attempt the pod belongs to (JOBSET_RESTART_ATTEMPT, from the
               pod's label; 0 outside a JobSet): every pod is new after a JobSet restart

Events and their own fields:
    run_start             world_size, preset, backend, checkpoint_backend, steps
    setup_end             resumed_from_step (0 = fresh start), setup_s, checkpointed_blocks (blocks
                          recomputed in backward: model.activation_checkpointing, "auto" resolved
                          by workloads.memory for this GPU and world size)[, on CUDA: sdpa_kernel (the
                          attention kernel torch picks for the model's shapes: "flash_attention",
                          "cudnn_attention", "efficient_attention", "math"), sdpa_flash_enabled,
                          sdpa_cudnn_enabled, sdpa_mem_efficient_enabled, sdpa_math_enabled
                          (workloads.model.attention_kernel)], gpu_reserved_bytes (what the caching
                          allocator holds as the iteration starts), gpu_alloc_retries (its
                          num_alloc_retries so far; both null off CUDA: workloads.device.allocator_counters)
    step_start            step
    step_end              step, loss (mean over ranks and micro-batches), lr, step_s,
                          batch_sha256 (this rank's input tokens of all the step's micro-batches,
                          first 16 hex digits), tokens_per_s (all ranks: world x batch_size x
                          seq_len x grad_accum_steps / step_s), tokens_per_s_per_gpu, mfu (model
                          FLOPs / peak, workloads/metrics.py; null on CPU or without a peak)
    eval_end              step, loss (mean per-token loss over the held-out sequences, all ranks),
                          eval_s, sequences, tokens (workloads.evaluation)
    checkpoint_worker     start ("reused" from the previous in-process iteration, "warmed" at
                          process start, "spawned"): the NVRx checkpoint worker of this iteration
    checkpoint_stall      step, backend, stall_s (time the training loop was blocked by the save)
    checkpoint_write_end  step, write_s (hand-off to "written on every rank"), seen at the poll
    checkpoint_commit     step, path, commit_s (rank 0 only: commit marker + pointer written)
    checkpoint_load       step, path, load_s (verifying and loading), build_s (of load_s: building
                          the empty state DCP loads into), trusted_files
    checkpoint_fallback   path, reason (a committed checkpoint failed verification or loading)
    checkpoint_resharded  path, from_world, to_world (loaded onto another world size by DCP)
    global_batch_changed  from_tokens, to_tokens (the config's global batch differs from the
                          checkpoint's; rank 0)
    checkpoint_pointer_rebuilt  reason, committed (latest.json unreadable: rebuilt from the commits)
    checkpoint_pointer_stale    reason, committed (a verified commit newer than latest.json names
                          was preferred)
    checkpoint_state_unknown    path, keys (a checkpoint older than a field of the loader's state,
                          e.g. the dataset digest: loaded without that check)
    checkpoint_trust_failed     step, path, reason (a file trusted at reload by its metadata failed
                          the background re-hash: the next commit is refused)
    local_save            step, stall_s (the copy into host buffers), bytes (node-local tier)
    local_saved           step, write_s, replicate_s, bytes, replica_of (the writer thread, done,
                          with the rank's own copy written; replica_of: the rank whose copy it
                          now holds, null when that rank sent none: its own write failed)
    local_save_failed     step, reason (the first of the rank's local saves that failed in a row;
                          the local tier only, FSx still holds the run)
    local_save_recovered  step, failed_saves, since_step (the first local save that succeeded
                          again after failed ones, and how many failed)
    local_copy_skipped    step, origin_rank, own, reason (a local copy failed its check on restore)
    local_tier_skipped    reason, fsx_step (no local step complete for every rank, or FSx newer)
    local_tier_disabled   reason (checkpoint.local.dir cannot be created: the iteration runs on
                          the FSx tier alone)
    local_restore         step, source ("local"|"replica"), from_rank, from_memory (the rank's
                          host copy, no file read), fsx_step, load_s (the whole restore from the
                          ranks' agreement on what exists: checks, exchange, building the empty
                          state and copying into it; compare checkpoint_load's), build_s (of
                          load_s: building the empty state, the same work whichever tier loads)
    fault_injected        kind, step, target_rank[, damaged][, node (node-loss, local-disk-full: the
                          simulated node)]
    fault_not_applicable  kind, step, reason (a fault this rank cannot carry out where it runs:
                          coordinator-loss in a pod, which cannot see the coordinator's process)
    iteration_failed      step (the step in progress, 0 while setting up), signature (the error's
                          type, normalized message and raising line: workloads.repeated_failure),
                          reason (an exception ended the iteration; the same signature at the same
                          step twice before any checkpoint ends the job)
    nonfinite_rank        step, node, nonfinite_ranks, world_size (this rank's loss was not finite
                          while other ranks' was: a hardware fault, the node leaves the job for
                          replacement; workloads.nonfinite)
    restart_begin         layer="inprocess", reason (emitted when NVRx finalizes the failed
                          iteration; the fault itself is usually a fault_injected line earlier)
    restart_end           layer="inprocess"|"launcher"|"kubernetes" (the JobSet recreated the
                          pods), resumed_from_step, since_begin_s (inprocess)
    sigterm               signal (the ranks voted to stop: a SIGTERM, or a lost rank monitor)
    monitor_lost          reason (ft_launcher's rank monitor went away: stopping with a checkpoint)
    unrecoverable         reason (an error no restart can fix: the job ends in 93)
    rank_discarded        reason (spare nodes: a rank of this node was lost, so this rank left with
                          its node; workloads.spares)
    run_lease             how (this process holds the run directory's lease now, as rank 0: "taken",
                          "taken over from <holder>", or "held by the command that started this
                          run"; workloads.lease)
    run_end               status ("completed"|"terminated"), final_step, final_loss; when completed
                          also state_sha256, rank_state_sha256, gpu_peak_reserved_bytes
                          (torch.cuda.max_memory_reserved since the setup of the iteration the
                          common `iteration` field names; null off CUDA), gpu_reserved_bytes and
                          gpu_alloc_retries (as in setup_end)

Watched lines: faults, restarts, checkpoints and the run's end, one line each (`watch_line`), are
also logged as they are emitted, `[rankR] event: <line>` (nvrx_eks.facts.training_metrics.EVENT_LINE),
so a pod's log carries them where the run directory cannot be read (`nvrx-eks logs NAME --events`).

summary.json (rank 0, at completion): final_step, final_loss, state_sha256, world_size, preset,
restarts {"inprocess": n, "launcher": n}, faults [...], checkpoints {...}, goodput, eval_s,
eval_loss and eval_step (the last evaluation; null without one); see
`summarize` and `workloads.goodput` for the derived numbers. Throughput
(workloads.metrics.summarize_throughput, medians over rank 0's steps after the first):
global_batch_tokens, tokens_per_s, tokens_per_s_per_gpu, step_time_s, mfu (null on CPU),
first_loss, last_loss.
"""

from __future__ import annotations

import json
import logging
import math
import os
import socket
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from nvrx_eks.facts.job_kinds import JOBSET_RESTART_ATTEMPT_ENV
from nvrx_eks.facts.training_metrics import EVENT_MARK
from workloads.faults import KINDS_INTERRUPTING_NOTHING
from workloads.goodput import WallTimeSplit, split_wall_time

SCHEMA_VERSION = 1


log = logging.getLogger("workloads.train")


def events_dir(run_dir: str | Path) -> Path:
    return Path(run_dir) / "events"


class EventLog:
    """Appends this process's events, to the file of the rank it started as. `iteration` is
    updated by the trainer on in-process restart, and `rank` when a restart gave the process
    another rank (workloads.spares): each event names the rank it was emitted as, so "rank 0's
    events" are those of whichever process was rank 0 at the time."""

    def __init__(self, run_dir: str | Path, rank: int):
        self.rank = rank
        self.iteration = 0
        self.cycle = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") or 0)
        self.attempt = int(os.environ.get(JOBSET_RESTART_ATTEMPT_ENV, "0") or 0)
        self._host = socket.gethostname()
        path = events_dir(run_dir) / f"rank{rank}.jsonl"
        path.parent.mkdir(parents=True, exist_ok=True)
        self._file = open(path, "a", buffering=1)  # noqa: SIM115 - lives as long as the process
        #: Called with every record after it is written (rank 0's live metrics, workloads.live_metrics).
        self.on_emit: Callable[[dict[str, Any]], None] | None = None

    def emit(self, event: str, **fields: Any) -> dict[str, Any]:
        record = {
            "v": SCHEMA_VERSION,
            "t": time.time(),
            "event": event,
            "rank": self.rank,
            "pid": os.getpid(),
            "host": self._host,
            "cycle": self.cycle,
            "iteration": self.iteration,
            "attempt": self.attempt,
            **fields,
        }
        self._file.write(json.dumps(record, separators=(",", ":")) + "\n")
        if (line := watch_line(record)) is not None:
            log.info("%s%s", EVENT_MARK, line)
        if self.on_emit is not None:
            self.on_emit(record)
        return record

    def close(self) -> None:
        self._file.close()


@dataclass
class Restart:
    layer: str  # "inprocess" | "launcher" | "kubernetes"
    rank: int
    begin_t: float
    end_t: float
    resumed_from_step: int
    pids: tuple[int, int]  # (pid before, pid after)

    @property
    def latency_s(self) -> float:
        return self.end_t - self.begin_t


@dataclass
class RunEvents:
    events: list[dict[str, Any]] = field(default_factory=list)
    #: Lines of the event files that held no event (torn by a kill, or damaged).
    unreadable_lines: int = 0

    def of(self, *names: str, rank: int | None = None) -> list[dict[str, Any]]:
        return [e for e in self.events if e["event"] in names and (rank is None or e["rank"] == rank)]

    @property
    def ranks(self) -> list[int]:
        return sorted({e["rank"] for e in self.events})

    def started_since(self, t: float) -> RunEvents:
        """The events of the processes started at or after `t`: a run's own, in a directory
        that also holds earlier runs' events, or a concurrent run's. A process is its host and
        pid from its run_start on (every trainer process writes one first; a recycled pid
        writes a new one), so a process already running at `t` (another run on the same
        directory) is left out even where its events come later."""
        started: dict[tuple[Any, int], float] = {}
        mine = []
        for e in self.events:
            process = (e.get("host"), e["pid"])
            if e["event"] == "run_start" or process not in started:
                started[process] = e["t"]
            if e["t"] >= t and started[process] >= t:
                mine.append(e)
        return RunEvents(mine, self.unreadable_lines)

    def restarts(self, rank: int = 0) -> list[Restart]:
        """Restarts seen by `rank`, oldest first.

        In-process: restart_begin -> restart_end of the same pid. Launcher: the new process's
        restart_end, begun at the last event any rank emitted in the previous cycle (for a
        sigkill that is the fault_injected line written just before the kill). Kubernetes: the
        new pod's restart_end, begun at the last event of the previous attempt.
        """
        out: list[Restart] = []
        pending_begin: dict[int, dict[str, Any]] = {}
        for e in self.events:
            # A process's restart begins under the rank it had and may end under another (a
            # spare took a lost rank's place and the ranks above it shifted down).
            if e["event"] == "restart_begin":
                pending_begin[e["pid"]] = e
            if e["rank"] != rank:
                continue
            if e["event"] == "restart_end" and e.get("layer") == "inprocess":
                begin = pending_begin.pop(e["pid"], None)
                if begin is not None:
                    out.append(
                        Restart("inprocess", rank, begin["t"], e["t"], e["resumed_from_step"], (e["pid"], e["pid"]))
                    )
            elif e["event"] == "restart_end" and e.get("layer") in ("launcher", "kubernetes"):
                # Events written before the attempt field existed belong to attempt 0.
                if e["layer"] == "launcher":
                    earlier = [x for x in self.events if x["cycle"] < e["cycle"] and x["t"] <= e["t"]]
                else:
                    earlier = [x for x in self.events if x.get("attempt", 0) < e["attempt"] and x["t"] <= e["t"]]
                if earlier:
                    last = max(earlier, key=lambda x: x["t"])
                    before = [x for x in earlier if x["rank"] == rank]
                    old_pid = before[-1]["pid"] if before else last["pid"]
                    out.append(
                        Restart(e["layer"], rank, last["t"], e["t"], e["resumed_from_step"], (old_pid, e["pid"]))
                    )
        return out


#: What the readers rely on, by field: the type every event has (EventLog writes them all) ...
_COMMON_FIELDS: dict[str, type | tuple[type, ...]] = {
    "t": (int, float),
    "event": str,
    "rank": int,
    "pid": int,
    "cycle": int,
    "iteration": int,
}
#: ... the type of a common field older runs may lack ...
_OPTIONAL_FIELDS: dict[str, type | tuple[type, ...]] = {"attempt": int, "host": str}
#: ... and, per event, the fields the readers (summarize, the reports, bench) index.
_EVENT_FIELDS: dict[str, dict[str, type | tuple[type, ...]]] = {
    "step_end": {"step": int, "step_s": (int, float), "loss": (int, float)},
    "setup_end": {"resumed_from_step": int, "setup_s": (int, float)},
    "restart_end": {"layer": str, "resumed_from_step": int},
    "checkpoint_stall": {"step": int, "stall_s": (int, float)},
    "eval_end": {"step": int, "loss": (int, float), "eval_s": (int, float)},
    "checkpoint_write_end": {"step": int, "write_s": (int, float)},
    "checkpoint_load": {"step": int},
    "checkpoint_fallback": {"path": str, "reason": str},
    "checkpoint_pointer_rebuilt": {"reason": str},
    "fault_injected": {"kind": str, "step": int, "target_rank": int},
    "local_save": {"step": int},
    "local_save_failed": {"reason": str},
    "local_copy_skipped": {"step": int, "origin_rank": int, "reason": str},
    "local_restore": {"step": int, "source": str},
    "unrecoverable": {"reason": str},
    "iteration_failed": {"step": int, "signature": str},
    "nonfinite_rank": {"step": int, "node": int},
}
#: Fields some events carry only sometimes: typed where present (a throughput field may be null).
_SOMETIMES_FIELDS: dict[str, dict[str, type | tuple[type, ...]]] = {
    "step_end": {"tokens_per_s": (int, float), "tokens_per_s_per_gpu": (int, float), "mfu": (int, float, type(None))},
    "fault_injected": {"node": int},
}


def _of_type(value: Any, kind: type | tuple[type, ...]) -> bool:
    # JSON true/false load as bool, which Python counts as an int: never a step or a time.
    return isinstance(value, kind) and not isinstance(value, bool)


def is_well_formed(record: Any) -> bool:
    """Whether a decoded line is an event the readers can use: every field they read present
    with its type, and a finite time. A hand-edited or foreign line (`"t": "abc"`, `"event": 5`,
    a mapping for `step`, NaN for `t`, a field missing) is not."""
    if not isinstance(record, dict):
        return False
    required = {**_COMMON_FIELDS, **_EVENT_FIELDS.get(record.get("event"), {})}  # type: ignore[arg-type]
    if any(not _of_type(record.get(name), kind) for name, kind in required.items()):
        return False
    if not math.isfinite(record["t"]):
        return False
    sometimes = {**_OPTIONAL_FIELDS, **_SOMETIMES_FIELDS.get(record["event"], {})}
    return all(name not in record or _of_type(record[name], kind) for name, kind in sometimes.items())


def load_run(run_dir: str | Path) -> RunEvents:
    """All ranks' events of a run, sorted by wall clock. Skips (and counts) lines that hold no
    usable event: a line cut short by a kill, bytes damaged on disk (decoded as U+FFFD, so one
    bad byte costs its line at most, never the report), or a record without the fields the
    readers rely on (is_well_formed)."""
    events: list[dict[str, Any]] = []
    unreadable = 0
    directory = events_dir(run_dir)
    for path in sorted(directory.glob("*.jsonl")) if directory.is_dir() else []:
        for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
            try:
                event = json.loads(line)
            except (json.JSONDecodeError, RecursionError):
                event = None
            if is_well_formed(event):
                events.append(event)
            elif line.strip():
                unreadable += 1
    events.sort(key=lambda e: e["t"])
    return RunEvents(events, unreadable)


@dataclass(frozen=True)
class RunReport(WallTimeSplit):
    """A run as one rank saw it: where its wall time went (`workloads.goodput`), its restarts,
    the faults injected and each checkpoint stall."""

    restarts: list[Restart] = field(default_factory=list)
    faults: list[dict[str, Any]] = field(default_factory=list)
    stalls_s: list[float] = field(default_factory=list)

    @property
    def median_stall_s(self) -> float | None:
        return statistics.median(self.stalls_s) if self.stalls_s else None

    def restarts_by_layer(self) -> dict[str, int]:
        counts = {"inprocess": 0, "launcher": 0}
        for r in self.restarts:
            counts[r.layer] = counts.get(r.layer, 0) + 1
        return counts

    def fault_outcomes(self) -> list[dict[str, Any]]:
        """Each injected fault with the restart that followed it (if any) on the reporting rank."""
        return fault_outcomes(self.faults, self.restarts)


def fault_target(fault: dict[str, Any]) -> int:
    """What a fault_injected event's spec named: the rank, or for the node kinds the node."""
    return fault.get("node", fault["target_rank"])


def fault_label(fault: dict[str, Any]) -> str:
    """A fault_injected event as its spec was written: KIND@STEP:RANK (or :NODE)."""
    return f"{fault['kind']}@{fault['step']}:{fault_target(fault)}"


def split_first_saves(stalls: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """checkpoint_stall events, oldest first, as (the first save of each process, the rest). A
    process's first save is warm-up, not the steady cost: NVRx's checkpoint worker starts and the
    staging buffers are allocated (seconds on CPU, against milliseconds after). A launcher restart
    starts new processes, each warming up again; an in-process restart keeps its process and,
    where usable, its worker: its saves are steady. A process is its host and
    pid, as in `started_since`."""
    seen: set[tuple[Any, int]] = set()
    first: list[dict[str, Any]] = []
    steady: list[dict[str, Any]] = []
    for stall in stalls:
        process = (stall.get("host"), stall["pid"])
        (steady if process in seen else first).append(stall)
        seen.add(process)
    return first, steady


#: How each restart layer is named to people (live lines, reports).
LAYER_NAMES = {"inprocess": "in-process", "launcher": "ft_launcher", "kubernetes": "JobSet"}

#: A restart's reason is an exception's repr, up to 500 characters: a line keeps its start.
REASON_CHARS = 100

#: The starts of the watched lines that several ranks write for one happening (a node-loss on
#: each rank of its node, the same error on every rank): word for word the same, so a watcher
#: shows the first and drops the copies. The other lines are rank 0's alone.
SHARED_LINE_STARTS = ("fault ", "cannot continue: ")


def _short(reason: str) -> str:
    first = reason.strip().splitlines()[0] if reason.strip() else ""
    return first if len(first) <= REASON_CHARS else first[: REASON_CHARS - 1] + "…"


def watch_line(event: dict[str, Any], took_s: float | None = None) -> str | None:
    """The line a person watching the run reads for an event: faults, errors no restart fixes and
    failing node-local saves and nodes leaving for replacement from any rank, restarts, checkpoints
    and the run's end from rank 0 (every rank records those); None for the rest. `took_s`: a
    restart_end's length where the
    caller knows it better than the event (a launcher restart has no begin in its process)."""
    name = event["event"]
    if name == "fault_injected":
        return f"{SHARED_LINE_STARTS[0]}{fault_label(event)} injected"
    if name == "unrecoverable":
        return f"{SHARED_LINE_STARTS[1]}{_short(event['reason'])}"
    # A rank's node-local storage failing, and recovering: each reported once per failure.
    rank = event["rank"]
    if name == "local_save_failed":
        return f"local checkpoints failing on rank {rank} from step {event.get('step')}: {_short(event['reason'])}"
    if name == "local_save_recovered":
        return f"local checkpoints on rank {rank} saved again at step {event['step']} ({event['failed_saves']} failed)"
    if name == "nonfinite_rank":
        return (
            f"rank {rank}: loss not finite at step {event['step']} (not on every rank): "
            f"node {event['node']} leaves for replacement"
        )
    if rank != 0:
        return None
    if name == "restart_begin":
        layer = LAYER_NAMES.get(event.get("layer", "inprocess"), event.get("layer"))
        return f"restart ({layer}) began: {_short(event.get('reason', ''))}"
    if name == "restart_end":
        layer = LAYER_NAMES.get(event["layer"], event["layer"])
        took = took_s if took_s is not None else event.get("since_begin_s")
        length = f", {took:.1f} s" if isinstance(took, (int, float)) else ""
        return f"resumed from step {event['resumed_from_step']} ({layer}{length})"
    if name == "checkpoint_commit":
        return f"checkpoint step {event['step']} committed"
    if name == "local_save":
        return f"local checkpoint step {event['step']} saved"
    if name == "checkpoint_fallback":
        return f"checkpoint {Path(event['path']).name} not used: {_short(event['reason'])}"
    if name == "run_end":
        loss = event.get("final_loss")
        at_loss = f", loss {loss:.3f}" if isinstance(loss, (int, float)) else ""
        status = "completed" if event.get("status") == "completed" else "stopped"
        return f"run {status} at step {event.get('final_step')}{at_loss}"
    return None


def fault_outcomes(faults: list[dict[str, Any]], restarts: list[Restart]) -> list[dict[str, Any]]:
    """Each fault with the first restart that ended after it: the layer, fault -> training ready
    (`recovered_s`), the step resumed from and the steps lost. Faults that interrupt nothing
    (workloads.faults.KINDS_INTERRUPTING_NOTHING) get no restart."""
    out = []
    for f in faults:
        after = [r for r in restarts if r.end_t >= f["t"]]
        rec = {"fault": fault_label(f), "kind": f["kind"], "target": fault_target(f), "t": f["t"]}
        if after and f["kind"] not in KINDS_INTERRUPTING_NOTHING:
            r = after[0]
            rec.update(
                layer=r.layer,
                recovered_s=r.end_t - f["t"],
                resumed_from_step=r.resumed_from_step,
                lost_steps=max(0, f["step"] - 1 - r.resumed_from_step),
            )
        out.append(rec)
    return out


def summarize(run: RunEvents, rank: int = 0) -> RunReport:
    """The run as `rank` saw it, over wall time from the first run_start to the last event; the
    goodput counts the last execution of each step only (replayed steps after a restart were lost
    work). A fault injected on several ranks at once is one fault: its recovery counts once."""
    starts = run.of("run_start")
    first_t = starts[0]["t"] if starts else (run.events[0]["t"] if run.events else 0.0)
    last_t = run.events[-1]["t"] if run.events else first_t
    restarts = run.restarts(rank)
    faults = run.of("fault_injected")
    stalls = [e["stall_s"] for e in run.of("checkpoint_stall", rank=rank)]
    evals = [e["eval_s"] for e in run.of("eval_end", rank=rank)]
    unique = {o["fault"]: o for o in fault_outcomes(faults, restarts)}
    split = split_wall_time(
        wall_s=last_t - first_t,
        step_ends=run.of("step_end", rank=rank),
        stalls_s=stalls,
        evals_s=evals,
        recovery_s=sum(o.get("recovered_s", 0.0) for o in unique.values()),
    )
    return RunReport(**asdict(split), restarts=restarts, faults=faults, stalls_s=stalls)
