"""The Trainer: one in-process iteration of a rank: set up (process group, build_training, the
Checkpointer, restore), the training loop, and the end of the run (final save, state digest,
summary.json). What outlives an iteration is the ProcessState (workloads.process_state)."""

from __future__ import annotations

import contextlib
import datetime
import json
import logging
import os
import signal
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from nvrx_eks.facts.checkpoint_layout import run_identity
from workloads.checkpoint.checkpointer import Checkpointer
from workloads.checkpoint.digest import state_digests
from workloads.checkpoint.local_tier import LocalTier
from workloads.config import TrainConfig
from workloads.data import batch_fingerprint
from workloads.device import (
    Runtime,
    allocator_counters,
    peak_memory_reserved,
    release_cached_memory,
    reset_peak_memory,
    resolve_runtime,
    to_device,
)
from workloads.evaluation import Evaluator
from workloads.events import load_run, summarize
from workloads.live_metrics import for_rank as live_metrics_for_rank
from workloads.metrics import flops_per_token, format_mfu, step_throughput, summarize_throughput
from workloads.model import attention_kernel
from workloads.nonfinite import check_loss, check_votes
from workloads.process_state import ProcessState
from workloads.training import Training, build_training, load_initial_weights
from workloads.transport import require_efa

log = logging.getLogger("workloads.train")


def init_process_group(process: ProcessState, runtime: Runtime, iteration: int) -> None:
    """The iteration's default process group: from the environment without a store, else on the
    coordinator's in-process store (workloads.coordinator), under a key prefix of its own."""
    timeout = datetime.timedelta(seconds=runtime.pg_timeout_s)
    device_id = runtime.device if runtime.is_cuda else None
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    if process.store is None:
        dist.init_process_group(runtime.backend, rank=rank, world_size=world, timeout=timeout, device_id=device_id)
        return
    if process.wrapper_store is None:
        # Keys of this rendezvous round only (CoordinatorStore), and each iteration a fresh prefix
        # of them, so a restart never reads stale keys.
        from workloads.coordinator import CoordinatorStore

        host, port = process.store
        process.wrapper_store = CoordinatorStore(host, port, datetime.timedelta(seconds=300))
    store = dist.PrefixStore(f"pg-cycle{process.events.cycle}-iter{iteration}", process.wrapper_store)
    dist.init_process_group(
        runtime.backend, store=store, rank=rank, world_size=world, timeout=timeout, device_id=device_id
    )


def forget_previous_meshes() -> None:
    """Drop DTensor's sharding caches before an in-process restart builds the model again.

    They key on device meshes, and a DeviceMesh compares equal to any mesh of the same ranks
    whatever this process's rank in it: a cached result hands the new iteration's tensors the
    previous iteration's mesh, with the previous rank's coordinate. When a spare takes a lost
    node's place, the ranks above it shift down, and a rank that was 1 and is now 0 would save
    the shard of rank 1 under rank 0's name: two ranks write one shard, and DCP's planner
    refuses the checkpoint ("invalid fill"; torch 2.13). Measured cost: none worth naming, the
    caches refill on the first step."""
    from torch.distributed.tensor._api import DTensor
    from torch.distributed.tensor._redistribute import clear_redistribute_planner_cache

    DTensor._op_dispatcher.sharding_propagator.propagate_op_sharding.cache_clear()
    DTensor._op_dispatcher.sharding_propagator._propagate_tensor_meta_cached.cache_clear()
    torch._C._clear_DTensor_sharding_propagator_cache()
    clear_redistribute_planner_cache()


@dataclass
class StepOutcome:
    """What one optimizer step reports, after the single host sync of the step."""

    loss: float
    stop: bool  # some rank was asked to stop (SIGTERM, or its launcher going away)
    save: bool  # some rank's checkpoint.interval_seconds elapsed
    fingerprint: str
    step_s: float


class Trainer:
    """One in-process iteration. `call_wrapper` is NVRx's CallWrapper (None without the in-process
    layer): its iteration number, watchdog ping, atomic section and hang-protection switch."""

    def __init__(self, process: ProcessState, call_wrapper: Any = None):
        self.process, self.cfg = process, process.cfg
        self.events, self.ft, self.faults = process.events, process.ft, process.faults
        self.iteration: int = call_wrapper.iteration if call_wrapper is not None else 0
        self.ping: Callable[[], None] = call_wrapper.ping if call_wrapper is not None else (lambda: None)
        self.atomic: Callable[[], AbstractContextManager[Any]] = (
            call_wrapper.atomic if call_wrapper is not None else contextlib.nullcontext
        )
        self.unguarded: Callable[[], AbstractContextManager[Any]] = (
            call_wrapper.disable_hang_protection if call_wrapper is not None else contextlib.nullcontext
        )
        self.events.iteration = self.iteration
        self.ft.atomic = self.atomic  # messages to ft_launcher's monitor must not be torn by a restart
        #: The step being trained, 0 while setting up: where a failure happened
        #: (workloads.repeated_failure).
        self.step = 0

    def run(self) -> dict[str, str]:
        """Set up, train, finish. Returns {"status": "completed" | "terminated"}."""
        self.setup()
        stopped = self.train()
        return self.finish(stopped)

    def setup(self) -> None:
        setup_started = time.monotonic()
        cfg = self.cfg
        with self.ft.section("setup"):
            self.runtime = resolve_runtime(cfg)
            if self.iteration > 0:
                # What the failed iteration cached goes back to the device before this one's
                # high-water mark starts (RestartFinalize freed its objects; their blocks stay
                # cached on streams the new model never uses).
                release_cached_memory(self.runtime)
            reset_peak_memory(self.runtime)
            with require_efa(cfg.distributed.require_efa, self.runtime.backend, cfg.run_dir, self.process.rank):
                init_process_group(self.process, self.runtime, self.iteration)
            self.rank, self.world = dist.get_rank(), dist.get_world_size()
            # With spare nodes the active rank can change at a restart.
            self.faults.retarget(self.rank)
            self.events.rank = self.rank
            self.events.on_emit = live_metrics_for_rank(cfg, self.rank, self.events.on_emit)
            if self.iteration > 0:
                forget_previous_meshes()
            self.training = build_training(cfg, self.runtime, self.rank, self.world)
            self.evaluator = Evaluator(
                cfg,
                self.training.model,
                self.runtime.device,
                self.rank,
                self.world,
                events=self.events,
                section=self.ft.section,
                ping=self.ping,
            )
            local_tier = None
            if cfg.checkpoint.local.enabled:
                nproc_per_node = int(os.environ.get("LOCAL_WORLD_SIZE", self.world))
                local_tier = LocalTier(cfg, events=self.events, nproc_per_node=nproc_per_node, ping=self.ping)
            self.checkpointer = Checkpointer(
                cfg,
                events=self.events,
                faults=self.faults,
                device=self.runtime.device,
                identity=run_identity(self.world, cfg.model.preset, cfg.model.shape_changes),
                states=self.training.states,
                local_tier=local_tier,
                ft=self.ft,
                atomic=self.atomic,
                ping=self.ping,
                unguarded=self.unguarded,
            )
            # Dropped by the in-process finalize, so a failed iteration's objects can be freed.
            self.process.iteration_objects.update(
                model=self.training.model,
                optimizer=self.training.optimizer,
                checkpointer=self.checkpointer,
                local_tier=local_tier,
            )
            restored = self.checkpointer.restore()
            if restored is None:
                # model.init_from is the initial state of a run that restores nothing; a restored
                # checkpoint replaces every weight, so the weights are not read then (each rank
                # ~1 GB from FSx at 8b/16, on the restart's critical path).
                load_initial_weights(cfg, self.training.model)
        self._report_start(restored, time.monotonic() - setup_started)

    def _report_start(self, restored: int | None, setup_s: float) -> None:
        start_step = self.training.progress.step
        attention: dict[str, Any] = {}
        if self.runtime.is_cuda:
            compute = torch.bfloat16 if self.runtime.bf16 else torch.float32
            attention = attention_kernel(
                self.cfg.model.shape, self.cfg.data.seq_len, self.cfg.data.batch_size, self.runtime.device, compute
            )
        self.events.emit(
            "setup_end",
            resumed_from_step=start_step,
            setup_s=setup_s,
            checkpointed_blocks=self.training.checkpointed_blocks,
            **attention,
            **allocator_counters(self.runtime),
        )
        if self.iteration > 0:
            begun = self.process.restart_begin_t
            since = time.time() - begun if begun else None
            self.events.emit("restart_end", layer="inprocess", resumed_from_step=start_step, since_begin_s=since)
        elif self.events.cycle > 0:
            self.events.emit("restart_end", layer="launcher", resumed_from_step=start_step)
        elif self.events.attempt > 0:
            self.events.emit("restart_end", layer="kubernetes", resumed_from_step=start_step)
        if self.rank == 0:
            log.info(
                "iteration %d: %s at step %d (world %d, %s, %s)",
                self.iteration,
                "resumed" if restored is not None else "starting",
                start_step,
                self.world,
                self.runtime.backend,
                self.runtime.device,
            )
        data = self.cfg.data
        self.accumulation = self._accumulation()
        self.tokens_per_step = self.world * data.batch_size * data.seq_len * self.accumulation
        self.checkpointer.run_facts["global_batch_tokens"] = self.tokens_per_step
        self.flops_token = flops_per_token(self.cfg.model.shape, data.seq_len)
        # MFU against a GPU's peak only: a CPU run's figure would compare with nothing.
        self.peak_tflops = self.cfg.peak_tflops_per_gpu if self.runtime.is_cuda else None

    def _accumulation(self) -> int:
        """Micro-batches per step. A run resumed on another world size keeps the global batch its
        checkpoint was trained with (when the config fixes none): the data position is global, so
        the same sequences make each step, split over fewer or more ranks."""
        data = self.cfg.data
        written = self.checkpointer.loaded_manifest or {}
        tokens = written.get("global_batch_tokens")
        if data.global_batch_tokens is None and tokens and written.get("world_size") != self.world:
            return data.model_copy(update={"global_batch_tokens": tokens}).accumulation(self.world)
        accumulation = data.accumulation(self.world)
        now = self.world * data.batch_size * data.seq_len * accumulation
        if tokens and tokens != now and self.rank == 0:
            log.warning("the global batch changes from %d tokens (the checkpoint's) to %d", tokens, now)
            self.events.emit("global_batch_changed", from_tokens=tokens, to_tokens=now)
        return accumulation

    def train(self) -> bool:
        """The loop, from the step after the restored one to the last; True if a stop request ended it."""
        self.training.model.train()
        for step in range(self.training.progress.step + 1, self.cfg.steps + 1):
            self.step = step
            self.ping()
            self.checkpointer.poll_in_flight()
            self.faults.at_step_start(step, self.checkpointer.corrupt_latest, self.checkpointer.corrupt_local)
            self.events.emit("step_start", step=step)
            outcome = self.train_step(step)
            self.report_step(step, outcome)
            self.evaluator.maybe_evaluate(step, stopping=outcome.stop)
            self.checkpointer.maybe_save(step, force=outcome.stop or outcome.save)
            if outcome.stop:
                self.events.emit("sigterm", signal=int(signal.SIGTERM), step=step)
                return True
        return False

    def train_step(self, step: int) -> StepOutcome:
        """One optimizer step over the data config's accumulation of micro-batches."""
        training = self.training
        accum = self.accumulation
        started = time.monotonic()
        poisoned = self.faults.loss_poisoned(step)  # the `nan` fault: a GPU computing NaN
        with self.ft.section("step"):
            # Gradient accumulation: each micro-batch's backward reduce-scatters into the sharded
            # gradients, which sum across micro-batches (FSDP2 keeps no unsharded gradient
            # between them: the memory of workloads.memory holds for any accumulation). The loader
            # advances per micro-batch and checkpoints fall between optimizer steps, so a resumed
            # run reads exactly the micro-batches the uninterrupted one would have.
            micro_inputs: list[torch.Tensor] = []
            loss: torch.Tensor | None = None
            for _ in range(accum):
                inputs, targets = training.batches.next_batch()
                micro_inputs.append(inputs)
                # The model computes the loss itself, chunk by chunk (OutputProjection): no full
                # [tokens, vocab] logits tensor is ever alive here.
                micro_loss = training.model(to_device(inputs, self.runtime), to_device(targets, self.runtime)) / accum
                if poisoned:
                    micro_loss = micro_loss * float("nan")
                micro_loss.backward()
                loss = micro_loss.detach() if loss is None else loss + micro_loss.detach()
            assert loss is not None  # grad_accum_steps >= 1
            fingerprint = batch_fingerprint(torch.cat(micro_inputs))
            if self.cfg.optimizer.grad_clip is not None:
                torch.nn.utils.clip_grad_norm_(training.model.parameters(), self.cfg.optimizer.grad_clip)
            training.optimizer.step()
            training.scheduler.step()
            training.optimizer.zero_grad(set_to_none=True)
            # One all-reduce per step carries the loss and the decisions every rank must take at
            # the same step: stop after a SIGTERM, save because the time interval elapsed, and
            # which ranks computed a non-finite loss (workloads.nonfinite). The loss stays on the
            # device until the single host sync below (.tolist()).
            flags = torch.tensor([float(self.process.stop_requested), float(self.checkpointer.time_due())])
            nonfinite = torch.isfinite(loss).logical_not().float().view(1)
            control = torch.cat([loss.float().view(1), to_device(flags, self.runtime), nonfinite])
            dist.all_reduce(control)
            loss_sum, stop_votes, save_votes, nonfinite_ranks = control.tolist()
        check_votes(step, self.world, stop=stop_votes, save=save_votes, nonfinite=nonfinite_ranks)
        check_loss(self.process, step, loss_sum, int(nonfinite_ranks), self.world, mine=lambda: bool(nonfinite.item()))
        mean_loss = loss_sum / self.world
        training.progress.step, training.progress.last_loss = step, mean_loss
        return StepOutcome(mean_loss, stop_votes > 0, save_votes > 0, fingerprint, time.monotonic() - started)

    def report_step(self, step: int, outcome: StepOutcome) -> None:
        speed = step_throughput(
            tokens=self.tokens_per_step,
            world_size=self.world,
            step_s=outcome.step_s,
            flops_token=self.flops_token,
            peak_tflops=self.peak_tflops,
        )
        lr = self.training.scheduler.get_last_lr()[0]
        self.events.emit(
            "step_end",
            step=step,
            loss=outcome.loss,
            lr=lr,
            step_s=outcome.step_s,
            batch_sha256=outcome.fingerprint,
            **speed.fields(),
        )
        if self.rank == 0 and (step % self.cfg.log_every == 0 or step == self.cfg.steps):
            log.info(
                "step %d loss %.4f lr %.2e %.3fs/step %.0f tokens/s (%.0f per GPU) MFU %s",
                step,
                outcome.loss,
                lr,
                outcome.step_s,
                speed.tokens_per_s,
                speed.tokens_per_s_per_gpu,
                format_mfu(speed.mfu),
            )

    def finish(self, stopped: bool) -> dict[str, str]:
        """The final save; then, for a completed run, the state digest, run_end and summary.json."""
        progress = self.training.progress
        self.checkpointer.finish(progress.step)
        if stopped:
            self.events.emit("run_end", status="terminated", final_step=progress.step, final_loss=progress.last_loss)
            dist.destroy_process_group()
            return {"status": "terminated"}

        def digest_progress() -> None:
            self.ping()
            self.faults.during_digest(progress.step)

        states = self.training.states
        # Each rank hashes its own shards; pinging as it goes keeps the in-process watchdog from
        # taking a large state's digest for a hang (state_digests).
        model_state = {"model": states["model"].state_dict(), "optim": states["optim"].state_dict()}
        digest, rank_digests = state_digests(model_state, digest_progress)
        # The GPU memory high-water mark of this iteration (reserved: what the allocator took from
        # the device, which is what must fit), next to workloads.memory's estimate in the GPU
        # smoke test.
        peak = peak_memory_reserved(self.runtime)
        self.events.emit(
            "run_end",
            status="completed",
            final_step=progress.step,
            final_loss=progress.last_loss,
            state_sha256=digest,
            rank_state_sha256=rank_digests[self.rank],
            gpu_peak_reserved_bytes=peak,
            **allocator_counters(self.runtime),
        )
        if self.rank == 0:
            # It reads every rank's event log, which grows with the run and reports no progress:
            # not a hang. The ft launcher's out-of-section timeout still bounds it.
            with self.unguarded():
                write_summary(self.cfg, self.training, self.world, digest, rank_digests, self.tokens_per_step)
        dist.destroy_process_group()
        return {"status": "completed"}


def write_summary(
    cfg: TrainConfig, training: Training, world: int, digest: str, rank_digests: list[str], tokens_per_step: int
) -> None:
    """summary.json in the run directory (rank 0, at a completed run), replaced atomically."""
    run_events = load_run(cfg.run_dir)
    report = summarize(run_events, rank=0)
    evals = run_events.of("eval_end", rank=0)
    summary = {
        "final_step": training.progress.step,
        "final_loss": training.progress.last_loss,
        "state_sha256": digest,
        "rank_state_sha256": rank_digests,
        "world_size": world,
        "preset": cfg.model.preset,
        "restarts": report.restarts_by_layer(),
        "faults": report.fault_outcomes(),
        "checkpoints": {
            "backend": cfg.checkpoint.backend,
            "median_stall_s": report.median_stall_s,
            "stalls": len(report.stalls_s),
        },
        "goodput": report.goodput,
        "eval_s": report.eval_s,
        "eval_loss": evals[-1]["loss"] if evals else None,
        "eval_step": evals[-1]["step"] if evals else None,
        "wall_s": report.wall_s,
        "replayed_steps": report.lost_steps,
        "global_batch_tokens": tokens_per_step,
        **summarize_throughput(run_events.of("step_end", rank=0)),
    }
    tmp = Path(cfg.run_dir) / ".summary.json.tmp"
    tmp.write_text(json.dumps(summary, indent=1))
    os.replace(tmp, Path(cfg.run_dir) / "summary.json")
