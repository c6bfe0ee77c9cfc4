"""A failure that repeats before the first checkpoint ends the job with exit 93 instead of being
retried by every layer. No torch.

Why: ft_launcher's no-progress stop (--ft-max-no-progress-cycles) compares `latest_step`, which
the trainer writes at each FSx commit; while that file is missing NVRx skips the check. So a
deterministic failure before the first commit (a CUDA out-of-memory at step 1, a bug in the
first evaluation) was retried by every layer: (inprocess.max_restarts + 1) iterations per
process x (fault_tolerance.max_restarts + 1) launcher cycles x (the JobSet's maxRestarts + 1)
attempts, about 176 starts with the defaults, hours of a p5 cluster, ending as an ordinary failure.

The rule: the same error at the same step twice, with no checkpoint committed, is deterministic.
The rank stops the job the way a configuration error does (workloads.do_not_requeue), naming the
error and the step in one line.

- "The same error" is a signature, not the exception object: its type, its message with numbers
  and addresses taken out (an OOM's sizes vary from one try to the next), and the line that raised
  it (error_signature).
- "The same step" is the step in progress, 0 while setting up. Before the first checkpoint every
  attempt starts from step 0 and replays the same data, so a deterministic failure meets the same
  step again.
- In-process restarts share the process, launcher and JobSet restarts do not. So each failure is
  an `iteration_failed` event in the rank's event log, in the run directory (on FSx in the pods,
  shared by every attempt), and the next failure looks for its signature there. Only this
  submission's events count: those since the last start of a first attempt's first launcher cycle
  (a `run_start` with cycle 0 and attempt 0), so a job resubmitted into the same directory starts
  afresh. A PyTorchJob's recreated pod also starts at attempt 0: its repeats are seen within the
  pod only.

Not repeats: a fault that happens once (an injected `exception@5` fires once, and its replay runs
clean), a peer's failure as the other ranks see it (another error, once, or NVRx's restart
exception, which is not an Exception and is not recorded), and anything after the first commit,
where ft_launcher's no-progress stop applies.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from nvrx_eks.facts.checkpoint_layout import iteration_file
from workloads.events import EventLog, events_dir

#: A signature keeps this much of the normalized message.
_MESSAGE_CHARS = 200
_ADDRESS = re.compile(r"0x[0-9a-fA-F]+")
_NUMBER = re.compile(r"\d+(?:\.\d+)?")


def error_signature(err: BaseException) -> str:
    """What makes two failures "the same error": the exception's type, its message with every
    address and number replaced (an OOM names the bytes free, which vary), and the file, line and
    function that raised it (the innermost frame of its traceback)."""
    message = _NUMBER.sub("#", _ADDRESS.sub("0x?", str(err)))
    message = " ".join(message.split())[:_MESSAGE_CHARS]
    where = ""
    tb = err.__traceback__
    if tb is not None:
        while tb.tb_next is not None:
            tb = tb.tb_next
        code = tb.tb_frame.f_code
        where = f" @ {Path(code.co_filename).name}:{tb.tb_lineno} {code.co_name}"
    return f"{type(err).__name__}: {message}{where}"


def submission_events(run_dir: str | Path, ranks: set[int], event: str) -> list[dict[str, Any]]:
    """The `event` records of this submission in the event files of `ranks` (by the rank that
    wrote them), oldest first. Reads only the lines naming `event` or run_start."""
    wanted = (f'"event":"{event}"', '"event":"run_start"')
    records: list[dict[str, Any]] = []
    for rank in sorted(ranks):
        path = events_dir(run_dir) / f"rank{rank}.jsonl"
        try:
            lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
        except OSError:
            continue
        for line in lines:
            if not any(key in line for key in wanted):
                continue
            try:
                record = json.loads(line)
            except ValueError:
                continue  # a line torn by a kill
            if isinstance(record, dict):
                records.append(record)
    records.sort(key=lambda r: r.get("t", 0.0))
    starts = [r["t"] for r in records if r.get("event") == "run_start" and not r.get("cycle") and not r.get("attempt")]
    since = starts[-1] if starts else 0.0
    return [r for r in records if r.get("event") == event and r.get("t", 0.0) >= since]


def checkpoint_committed(checkpoint_dir: str | Path) -> bool:
    """Whether the run has committed a checkpoint: the file ft_launcher's progress check reads."""
    return Path(iteration_file(checkpoint_dir)).exists()


def record_failure(
    events: EventLog, run_dir: str | Path, checkpoint_dir: str | Path, initial_rank: int, err: Exception, step: int
) -> str | None:
    """Record this failure (an `iteration_failed` event); return the reason to stop the job when
    it repeats one of this submission's before any checkpoint, else None."""
    signature = error_signature(err)
    earlier: list[dict[str, Any]] = []
    if not checkpoint_committed(checkpoint_dir):
        # The files of whichever process held this rank (a spare may hold it now) and our own.
        seen = submission_events(run_dir, {initial_rank, events.rank}, "iteration_failed")
        earlier = [r for r in seen if r.get("rank") == events.rank and r.get("step") == step]
        earlier = [r for r in earlier if r.get("signature") == signature]
    events.emit("iteration_failed", step=step, signature=signature, reason=str(err)[:500])
    if not earlier:
        return None
    where = f"at step {step}" if step else "while setting up"
    first_line = (str(err).strip().splitlines() or [""])[0][:300]
    hint = ""
    if type(err).__name__ == "OutOfMemoryError":
        hint = "; lower data.batch_size or set model.activation_checkpointing=true"
    return (
        f"{type(err).__name__}: {first_line} {where}, the second time with no checkpoint committed: it "
        f"fails the same way on every restart, so the job stops instead of retrying{hint}"
    )
