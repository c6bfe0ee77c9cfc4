"""Live metrics of a run, from rank 0's events as they are emitted: TensorBoard scalars in
<run_dir>/tensorboard (TensorBoard's own writer) and, on EKS, the same numbers to CloudWatch
(workloads.cloudwatch_metrics). The event log stays the record; these are views of it.

What appears where (TensorBoard tag / CloudWatch metric in nvrx_eks/facts/training_metrics.py):

    every step         train/loss, train/lr, throughput/tokens_per_s, throughput/tokens_per_s_per_gpu,
                       throughput/mfu (GPU only), time/step_s
                       CloudWatch every `log_every` steps: loss, tokens_per_s, mfu, step_time_s
    each evaluation    eval/loss, time/eval_s; CloudWatch eval_loss, eval_s
    each save          checkpoint/stall_s; CloudWatch checkpoint_stall_s
    each restart       restarts/<layer> (the run's count so far, at the step resumed from);
                       CloudWatch restarts (1 per restart) with dimension Layer
    each evaluation    goodput/fraction and goodput/<part>_s (workloads.goodput, read from the
    and the end        event log); CloudWatch goodput (percent) and the parts in seconds

Only rank 0 writes. A failure here is logged once and never reaches the training loop.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

from nvrx_eks.facts import training_metrics as names
from workloads.cloudwatch_metrics import EmfSender, cloudwatch_wanted, emf_document
from workloads.config import TrainConfig
from workloads.events import load_run, summarize

log = logging.getLogger("workloads.train")


def tensorboard_dir(run_dir: str | Path) -> Path:
    return Path(run_dir) / "tensorboard"


class LiveMetrics:
    """EventLog.on_emit of rank 0: turns events into scalars."""

    def __init__(self, cfg: TrainConfig):
        self.cfg = cfg
        self.job = {names.JOB_DIMENSION: Path(cfg.run_dir).resolve().name}
        self.failed = False
        self.tensorboard: Any = None
        if cfg.metrics.tensorboard:
            # Imported here: only rank 0 pays for TensorBoard.
            from torch.utils.tensorboard import SummaryWriter

            self.tensorboard = SummaryWriter(log_dir=str(tensorboard_dir(cfg.run_dir)), flush_secs=10)
        self.cloudwatch = EmfSender(cfg.metrics.emf_endpoint) if cloudwatch_wanted(cfg.metrics.cloudwatch) else None
        self._handlers: dict[str, Callable[[dict[str, Any]], None]] = {
            "step_end": self._step,
            "eval_end": self._eval,
            "checkpoint_stall": self._stall,
            "restart_end": self._restart,
            "run_end": self._run_end,
        }

    def __call__(self, record: dict[str, Any]) -> None:
        handler = self._handlers.get(record["event"])
        if handler is None or self.failed:
            return
        try:
            handler(record)
        except Exception:  # noqa: BLE001 - a metrics failure must not fail the training step
            log.warning("live metrics off after an error at %s", record["event"], exc_info=True)
            self.failed = True

    def close(self) -> None:
        if self.tensorboard is not None:
            self.tensorboard.close()
        if self.cloudwatch is not None:
            self.cloudwatch.close()

    # ----- events -------------------------------------------------------------------------------

    def _step(self, e: dict[str, Any]) -> None:
        step = e["step"]
        self._scalars(
            step,
            {
                "train/loss": e["loss"],
                "train/lr": e.get("lr"),
                "throughput/tokens_per_s": e.get("tokens_per_s"),
                "throughput/tokens_per_s_per_gpu": e.get("tokens_per_s_per_gpu"),
                "throughput/mfu": e.get("mfu"),
                "time/step_s": e["step_s"],
            },
        )
        if step % self.cfg.log_every == 0 or step == self.cfg.steps:
            mfu = e.get("mfu")
            values = {
                "loss": e["loss"],
                "tokens_per_s": e.get("tokens_per_s"),
                "mfu": mfu * 100 if mfu is not None else None,
                "step_time_s": e["step_s"],
            }
            self._send(values, names.STEP_METRICS, step)

    def _eval(self, e: dict[str, Any]) -> None:
        self._scalars(e["step"], {"eval/loss": e["loss"], "time/eval_s": e["eval_s"]})
        self._send({"eval_loss": e["loss"], "eval_s": e["eval_s"]}, names.EVAL_METRICS, e["step"])
        self._goodput(e["step"])

    def _stall(self, e: dict[str, Any]) -> None:
        self._scalars(e["step"], {"checkpoint/stall_s": e["stall_s"]})
        self._send({"checkpoint_stall_s": e["stall_s"]}, names.CHECKPOINT_METRICS, e["step"])

    def _restart(self, e: dict[str, Any]) -> None:
        counts = summarize(load_run(self.cfg.run_dir), rank=0).restarts_by_layer()
        self._scalars(e["resumed_from_step"], {f"restarts/{layer}": n for layer, n in counts.items()})
        if self.cloudwatch is not None:
            dimensions = {**self.job, names.LAYER_DIMENSION: e["layer"]}
            units = {names.RESTART_METRIC: "Count"}
            self.cloudwatch.send(
                emf_document(
                    {names.RESTART_METRIC: 1},
                    units,
                    dimensions,
                    {"step": e["resumed_from_step"]},
                    log_group=self.cfg.metrics.log_group,
                )
            )

    def _run_end(self, e: dict[str, Any]) -> None:
        self._goodput(e["final_step"])
        if self.tensorboard is not None:
            self.tensorboard.flush()

    def _goodput(self, step: int) -> None:
        split = summarize(load_run(self.cfg.run_dir), rank=0)
        parts = {
            "productive_s": split.productive_s,
            "checkpoint_stall_total_s": split.checkpoint_stall_s,
            "eval_total_s": split.eval_s,
            "replayed_s": split.replayed_s,
            "recovery_s": split.recovery_s,
            "other_s": split.other_s,
        }
        self._scalars(step, {"goodput/fraction": split.goodput, **{f"goodput/{k}": v for k, v in parts.items()}})
        self._send({"goodput": split.goodput * 100, **parts}, names.GOODPUT_METRICS, step)

    # ----- sinks --------------------------------------------------------------------------------

    def _scalars(self, step: int, values: dict[str, float | None]) -> None:
        if self.tensorboard is None:
            return
        for tag, value in values.items():
            if value is not None:
                self.tensorboard.add_scalar(tag, value, step)

    def _send(self, values: dict[str, float | None], units: dict[str, str], step: int) -> None:
        if self.cloudwatch is None:
            return
        present = {name: value for name, value in values.items() if value is not None}
        self.cloudwatch.send(
            emf_document(present, units, self.job, {"step": step}, log_group=self.cfg.metrics.log_group)
        )


def for_rank(cfg: TrainConfig, rank: int, current: Callable[[dict[str, Any]], None] | None) -> LiveMetrics | None:
    """The live metrics of this process as of an iteration: kept across in-process restarts on
    rank 0, none on the other ranks (closed if this process was rank 0 before spares moved it)."""
    if rank != 0:
        if isinstance(current, LiveMetrics):
            current.close()
        return None
    return current if isinstance(current, LiveMetrics) else LiveMetrics(cfg)
