"""Trainer entry point: `python -m workloads.train --config PATH [dotted.key=value ...]`.

Started by ft_launcher (see workloads.launch), one process per rank. The training function runs
under NVRx's in-process restart Wrapper (workloads.inprocess); each call of it is one "iteration":
it builds the process group, model, optimizer, data and checkpointer from scratch, loads the newest
committed checkpoint, trains, and on completion writes summary.json.

Exit codes: 0 done; 93 (nvrx_eks.facts.exit_codes.EXIT_DO_NOT_REQUEUE) for errors no restart can fix;
143 after a SIGTERM was honoured (in-flight checkpoint finished); anything else is a failure that
ft_launcher restarts.

`--preflight --world-size N` checks, before any rank starts, everything that can be checked on the
config, the data path and the checkpoint directory, and exits 0 or 93.

The `if __name__ == "__main__"` guard matters: NVRx's checkpoint worker is a spawned process that
re-imports this module as __mp_main__.
"""

# No `from __future__ import annotations` in this module: NVRx finds the parameter that receives
# its CallWrapper by the annotation object, which postponed annotations would turn into a string.

import argparse
import contextlib
import datetime
import json
import logging
import math
import os
import random
import signal
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Any

from nvidia_resiliency_ext.inprocess import CallWrapper

from nvrx_eks.facts.errors import ConfigError
from nvrx_eks.facts.exit_codes import EXIT_BOUND_S, EXIT_DO_NOT_REQUEUE, EXIT_TERMINATED
from workloads.config import TrainConfig
from workloads.faults import parse_fault_spec

log = logging.getLogger("workloads.train")


class Unrecoverable(BaseException):
    """A ConfigError raised inside the wrapped function. A BaseException so the NVRx Wrapper
    terminates instead of restarting: retrying cannot fix a configuration."""


class ProcessState:
    """What outlives in-process restarts: identity, event log, ft connection, SIGTERM flag."""

    def __init__(self, cfg: TrainConfig, rank: int, world_size: int, store_port: int | None):
        from workloads.events import EventLog
        from workloads.faults import FaultInjector
        from workloads.ft_integration import FaultToleranceReporter

        self.cfg, self.rank, self.world_size = cfg, rank, world_size
        self.store_port = store_port
        self.events = EventLog(cfg.run_dir, rank)
        self.ft = FaultToleranceReporter(cfg.fault_tolerance)
        self.faults = FaultInjector(
            parse_fault_spec(cfg.faults),
            rank,
            Path(cfg.run_dir) / "faults",
            self.events.emit,
            nproc_per_node=int(os.environ.get("LOCAL_WORLD_SIZE", "1")),
        )
        self.sigterm_received = False
        self.restart_begin_t: float | None = None
        self.iteration_objects: dict[str, Any] = {}
        self.wrapper_store = None

    def drop_iteration_state(self) -> None:
        self.restart_begin_t = time.time()
        self.iteration_objects.clear()


def _lr_lambda(cfg: TrainConfig):
    opt = cfg.optimizer

    def factor(step: int) -> float:
        if step < opt.warmup_steps:
            return (step + 1) / opt.warmup_steps
        if opt.schedule == "constant":
            return 1.0
        progress = min(1.0, (step - opt.warmup_steps) / max(1, cfg.steps - opt.warmup_steps))
        cosine = 0.5 * (1 + math.cos(math.pi * progress))
        return opt.min_lr_ratio + (1 - opt.min_lr_ratio) * cosine

    return factor


def _rng_state(cuda: bool) -> dict[str, Any]:
    """Every RNG the step uses, as tensors only: the checkpoint directory is writable by every pod
    that mounts the volume, so nothing read back from it may be unpickled (code execution)."""
    import numpy as np
    import torch

    version, mt, gauss = random.getstate()
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    assert kind == "MT19937", kind  # the only bit generator np.random's legacy state has
    return {
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state() if cuda else torch.zeros(0, dtype=torch.uint8),
        "python_mt": torch.tensor(mt, dtype=torch.int64),
        "python_meta": torch.tensor([version, gauss is not None], dtype=torch.int64),
        "python_gauss": torch.tensor([gauss or 0.0], dtype=torch.float64),
        "numpy_keys": torch.from_numpy(keys.astype(np.int64)),
        "numpy_meta": torch.tensor([pos, has_gauss], dtype=torch.int64),
        "numpy_gauss": torch.tensor([cached], dtype=torch.float64),
    }


def _restore_rng(state: dict[str, Any], cuda: bool) -> None:
    import numpy as np
    import torch

    torch.set_rng_state(state["torch"])
    if cuda:
        torch.cuda.set_rng_state(state["cuda"])
    version, has_gauss = (int(v) for v in state["python_meta"].tolist())
    gauss = float(state["python_gauss"][0]) if has_gauss else None
    random.setstate((version, tuple(int(v) for v in state["python_mt"].tolist()), gauss))
    pos, np_has_gauss = (int(v) for v in state["numpy_meta"].tolist())
    np.random.set_state(
        ("MT19937", state["numpy_keys"].numpy().astype(np.uint32), pos, np_has_gauss, float(state["numpy_gauss"][0]))
    )


def _init_process_group(process: ProcessState, runtime, iteration: int) -> None:
    import torch.distributed as dist

    timeout = datetime.timedelta(seconds=runtime.pg_timeout_s)
    device_id = runtime.device if runtime.is_cuda else None
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    if process.store_port is None:
        dist.init_process_group(runtime.backend, rank=rank, world_size=world, timeout=timeout, device_id=device_id)
        return
    if process.wrapper_store is None:
        # A client of the store NVRx's Wrapper hosts on rank 0 (or, without the Wrapper, our own
        # server); each iteration uses a fresh key prefix, so a restart never reads stale keys.
        host = os.environ.get("MASTER_ADDR", "127.0.0.1")
        is_host = not process.cfg.inprocess.enabled and rank == 0
        process.wrapper_store = dist.TCPStore(
            host,
            process.store_port,
            world,
            is_master=is_host,
            timeout=datetime.timedelta(seconds=300),
            wait_for_workers=False,
        )
    store = dist.PrefixStore(f"pg-cycle{process.events.cycle}-iter{iteration}", process.wrapper_store)
    dist.init_process_group(
        runtime.backend, store=store, rank=rank, world_size=world, timeout=timeout, device_id=device_id
    )


def _restore(checkpointer, local_tier, build_state, rank: int):
    """The newest state complete for every rank: the node-local tier when it holds a step not
    older than the newest committed FSx checkpoint (no FSx data is read then), else FSx."""
    if local_tier is not None and checkpointer.backend != "none":
        from nvrx_eks.facts.checkpoint_layout import commit_state, step_of

        committed = commit_state(checkpointer.dir).committed if rank == 0 else []
        restored = local_tier.restore(build_state, step_of(committed[0]) if committed else -1)
        if restored is not None:
            return restored
    return checkpointer.load_latest(build_state)


def train_attempt(process: ProcessState, call_wrapper: CallWrapper | None = None) -> dict:
    """One in-process iteration: build, load, train, finish. Returns {"status": ...}."""
    try:
        return _train_attempt(process, call_wrapper)
    except ConfigError as err:
        # From here the rank is leaving: the watchdog bounds everything the Wrapper and run()
        # still do on the way out (barriers with peers, stopping the checkpoint worker).
        arm_exit_watchdog(EXIT_DO_NOT_REQUEUE)
        process.events.emit("unrecoverable", reason=str(err)[:2000])
        _stop_the_job(process, str(err))
        raise Unrecoverable(str(err)) from None


def _stop_the_job(process: ProcessState, reason: str) -> None:
    """Make the 93 stick beyond this rank: record the decision for this job attempt on the shared
    run dir, then ask ft_launcher to shut the workload down instead of restarting ranks
    (workloads.do_not_requeue says how the launcher's wrapper turns both into exit 93). Each
    step on its own and best effort: the exit is bounded by the watchdog already armed."""
    from workloads import do_not_requeue

    attempt = do_not_requeue.attempt_id()
    if attempt is None:
        log.info("no %s set: the decision is not recorded for the launcher's wrapper", do_not_requeue.ATTEMPT_ID_ENV)
    else:
        try:
            do_not_requeue.write_record(process.cfg.run_dir, attempt, reason=reason, rank=process.rank)
        except OSError as err:
            log.warning("could not record the do-not-requeue decision in %s: %s", process.cfg.run_dir, err)
    try:
        process.ft.request_shutdown(reason)
    except Exception:  # noqa: BLE001 - a launcher connection already gone must not block the exit
        log.exception("could not ask ft_launcher to shut the workload down")


def _train_attempt(process: ProcessState, call_wrapper) -> dict:
    import numpy as np
    import torch
    import torch.distributed as dist
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
    from torch.distributed.device_mesh import init_device_mesh

    from workloads.checkpoint import Checkpointer, state_digests
    from workloads.data import batch_fingerprint, build_batches
    from workloads.device import resolve_runtime
    from workloads.events import load_run, summarize
    from workloads.metrics import flops_per_token, format_mfu, step_throughput, summarize_throughput
    from workloads.model import build_model
    from workloads.transport import require_efa

    cfg, events, ft, faults = process.cfg, process.events, process.ft, process.faults
    iteration = call_wrapper.iteration if call_wrapper is not None else 0
    ping = call_wrapper.ping if call_wrapper is not None else (lambda: None)
    atomic = call_wrapper.atomic if call_wrapper is not None else contextlib.nullcontext
    unguarded = call_wrapper.disable_hang_protection if call_wrapper is not None else contextlib.nullcontext
    events.iteration = iteration
    ft.atomic = atomic  # messages to ft_launcher's monitor must not be torn by a restart
    setup_started = time.monotonic()
    objects = process.iteration_objects

    with ft.section("setup"):
        runtime = resolve_runtime(cfg)
        with require_efa(cfg.distributed.require_efa, runtime.backend, cfg.run_dir, process.rank):
            _init_process_group(process, runtime, iteration)
        rank, world = dist.get_rank(), dist.get_world_size()
        faults.retarget(rank)  # with spare nodes the active rank can change at a restart
        if cfg.distributed.shard == "hybrid":
            # HSDP: FSDP2 shards along "shard" (the ranks of one node) and replicates along
            # "replicate"; fully_shard takes the 2-D mesh as is (workloads.model).
            local = int(os.environ.get("LOCAL_WORLD_SIZE", world))
            mesh = init_device_mesh(runtime.device.type, (world // local, local), mesh_dim_names=("replicate", "shard"))
        else:
            mesh = init_device_mesh(runtime.device.type, (world,))
        shape = cfg.model.shape
        torch.manual_seed(cfg.seed + rank)
        random.seed(cfg.seed + rank)
        np.random.seed(cfg.seed + rank)
        model = objects["model"] = build_model(
            shape,
            runtime,
            mesh,
            cfg.seed,
            activation_checkpointing=cfg.model.checkpoint_activations,
            loss_chunk_tokens=cfg.model.loss_chunk_tokens,
        )
        opt = cfg.optimizer
        optimizer = objects["optimizer"] = torch.optim.AdamW(
            model.parameters(), lr=opt.lr, betas=(opt.beta1, opt.beta2), eps=opt.eps, weight_decay=opt.weight_decay
        )
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, _lr_lambda(cfg))
        batches = build_batches(cfg.data, rank, world, shape.vocab_size, cfg.seed)
        checkpointer = objects["checkpointer"] = Checkpointer(
            cfg,
            events=events,
            faults=faults,
            device=runtime.device,
            atomic=atomic,
            ping=ping,
            unguarded=unguarded,
            identity={"world_size": world, "preset": cfg.model.preset},
        )

        progress = {"step": 0, "last_loss": float("nan")}

        def checkpoint_state() -> dict[str, Any]:
            model_sd, optim_sd = get_state_dict(model, optimizer)
            return {
                "model": model_sd,
                "optim": optim_sd,
                "train": {**progress, "scheduler": scheduler.state_dict()},
                "data": batches.state_dict(),
                f"rng_rank{rank}": _rng_state(runtime.is_cuda),
            }

        local_tier = None
        if cfg.checkpoint.local.enabled:
            from workloads.local_tier import LocalTier

            local_tier = objects["local_tier"] = LocalTier(
                cfg, events=events, nproc_per_node=int(os.environ.get("LOCAL_WORLD_SIZE", world))
            )
        loaded = _restore(checkpointer, local_tier, checkpoint_state, rank)
        if loaded is not None:
            state = loaded.state
            set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
            scheduler.load_state_dict(state["train"]["scheduler"])
            batches.load_state_dict(state["data"])
            _restore_rng(state[f"rng_rank{rank}"], runtime.is_cuda)
            progress.update(step=int(state["train"]["step"]), last_loss=float(state["train"]["last_loss"]))
    start_step = progress["step"]
    checkpointer.last_saved_step = start_step
    events.emit("setup_end", resumed_from_step=start_step, setup_s=time.monotonic() - setup_started)
    if iteration > 0:
        since = time.time() - process.restart_begin_t if process.restart_begin_t else None
        events.emit("restart_end", layer="inprocess", resumed_from_step=start_step, since_begin_s=since)
    elif events.cycle > 0:
        events.emit("restart_end", layer="launcher", resumed_from_step=start_step)
    if rank == 0:
        log.info(
            "iteration %d: %s at step %d (world %d, %s, %s)",
            iteration,
            "resumed" if loaded else "starting",
            start_step,
            world,
            runtime.backend,
            runtime.device,
        )

    accum = cfg.data.grad_accum_steps
    tokens_per_step = world * cfg.data.batch_size * cfg.data.seq_len * accum
    flops_token = flops_per_token(shape, cfg.data.seq_len)
    # MFU against a GPU's peak only: a CPU run's figure would compare with nothing.
    peak_tflops = cfg.peak_tflops_per_gpu if runtime.is_cuda else None
    interval, every_s = cfg.checkpoint.interval_steps, cfg.checkpoint.interval_seconds
    last_save_t = time.monotonic()
    stop_requested = False
    model.train()
    for step in range(start_step + 1, cfg.steps + 1):
        ping()
        if checkpointer.pending is not None:
            with ft.section("checkpointing"):
                checkpointer.poll()
        faults.at_step_start(
            step, checkpointer.corrupt_latest, local_tier.corrupt_newest if local_tier is not None else None
        )
        events.emit("step_start", step=step)
        started = time.monotonic()
        with ft.section("step"):
            # Gradient accumulation: each micro-batch's backward reduce-scatters into the sharded
            # gradients, which sum across micro-batches (FSDP2 keeps no unsharded gradient
            # between them: the memory of workloads.memory holds for any accumulation). The loader
            # advances per micro-batch and checkpoints fall between optimizer steps, so a resumed
            # run reads exactly the micro-batches the uninterrupted one would have.
            micro_inputs, loss = [], None
            for _ in range(accum):
                inputs, targets = batches.next_batch()
                micro_inputs.append(inputs)
                inputs, targets = inputs.to(runtime.device), targets.to(runtime.device)
                # The model computes the loss itself, chunk by chunk (OutputProjection): no full
                # [tokens, vocab] logits tensor is ever alive here.
                micro_loss = model(inputs, targets) / accum
                micro_loss.backward()
                loss = micro_loss.detach() if loss is None else loss + micro_loss.detach()
            fingerprint = batch_fingerprint(torch.cat(micro_inputs))
            if opt.grad_clip is not None:
                torch.nn.utils.clip_grad_norm_(model.parameters(), opt.grad_clip)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad(set_to_none=True)
            save_due = every_s is not None and time.monotonic() - last_save_t >= every_s
            # One all-reduce per step carries the loss and the decisions every rank must take at
            # the same step: stop after a SIGTERM, save because the time interval elapsed. The
            # loss stays on the device until the single host sync below (.tolist()).
            flags = torch.tensor([float(process.sigterm_received), float(save_due)])
            if runtime.is_cuda:  # a pageable host-to-device copy would itself wait for the GPU
                flags = flags.pin_memory().to(runtime.device, non_blocking=True)
            control = torch.cat([loss.detach().float().view(1), flags])
            dist.all_reduce(control)
            loss_sum, stop_votes, save_votes = control.tolist()
        mean_loss = loss_sum / world
        stop_requested = stop_votes > 0
        progress.update(step=step, last_loss=mean_loss)
        step_s = time.monotonic() - started
        speed = step_throughput(
            tokens=tokens_per_step, world_size=world, step_s=step_s, flops_token=flops_token, peak_tflops=peak_tflops
        )
        events.emit(
            "step_end",
            step=step,
            loss=mean_loss,
            lr=scheduler.get_last_lr()[0],
            step_s=step_s,
            batch_sha256=fingerprint,
            **speed.fields(),
        )
        if rank == 0 and (step % cfg.log_every == 0 or step == cfg.steps):
            log.info(
                "step %d loss %.4f lr %.2e %.3fs/step %.0f tokens/s (%.0f per GPU) MFU %s",
                step,
                mean_loss,
                scheduler.get_last_lr()[0],
                step_s,
                speed.tokens_per_s,
                speed.tokens_per_s_per_gpu,
                format_mfu(speed.mfu),
            )
        if step % interval == 0 or step == cfg.steps or stop_requested or save_votes > 0:
            with ft.section("checkpointing"):
                checkpointer.save(step, checkpoint_state())
            last_save_t = time.monotonic()
        # Also at FSx saves: a restore right after one then still finds the local tier current.
        if local_tier is not None and step % cfg.checkpoint.local.interval_steps == 0:
            with ft.section("checkpointing"):
                local_tier.save(step, checkpoint_state())
        if stop_requested:
            events.emit("sigterm", signal=int(signal.SIGTERM), step=step)
            break

    with ft.section("checkpointing"):
        if checkpointer.last_saved_step < progress["step"]:
            checkpointer.save(progress["step"], checkpoint_state())
        checkpointer.close()
        if local_tier is not None:
            local_tier.wait()
    if stop_requested:
        events.emit("run_end", status="terminated", final_step=progress["step"], final_loss=progress["last_loss"])
        dist.destroy_process_group()
        return {"status": "terminated"}

    model_sd, optim_sd = get_state_dict(model, optimizer)

    def digest_progress() -> None:
        ping()
        faults.during_digest(progress["step"])

    # Each rank hashes its own shards; pinging as it goes keeps the in-process watchdog from
    # taking a large state's digest for a hang (state_digests).
    digest, rank_digests = state_digests({"model": model_sd, "optim": optim_sd}, digest_progress)
    # The GPU memory high-water mark (reserved: what the allocator took from the device, which
    # is what must fit), next to workloads.memory's estimate in the GPU smoke test.
    peak = torch.cuda.max_memory_reserved(runtime.device) if runtime.is_cuda else None
    events.emit(
        "run_end",
        status="completed",
        final_step=progress["step"],
        final_loss=progress["last_loss"],
        state_sha256=digest,
        rank_state_sha256=rank_digests[rank],
        gpu_peak_reserved_bytes=peak,
    )
    if rank == 0:
        run_events = load_run(cfg.run_dir)
        report = summarize(run_events, rank=0)
        summary = {
            "final_step": progress["step"],
            "final_loss": progress["last_loss"],
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
            "wall_s": report.wall_s,
            "replayed_steps": report.lost_steps,
            "global_batch_tokens": tokens_per_step,
            **summarize_throughput(run_events.of("step_end", rank=0)),
        }
        tmp = Path(cfg.run_dir) / ".summary.json.tmp"
        tmp.write_text(json.dumps(summary, indent=1))
        os.replace(tmp, Path(cfg.run_dir) / "summary.json")
    dist.destroy_process_group()
    return {"status": "completed"}


def run(cfg: TrainConfig, store_port: int | None) -> int:
    from nvidia_resiliency_ext.inprocess.exception import RestartAbort

    rank = int(os.environ.get("RANK", "0"))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    for fault in parse_fault_spec(cfg.faults):
        if fault.rank >= world:
            raise ConfigError(
                f"faults: {fault.label} targets rank {fault.rank} but the world "
                f"has {world} ranks; use a rank below {world}"
            )
    if store_port is None and cfg.inprocess.enabled:
        store_port = int(os.environ["MASTER_PORT"]) + 1
    exit_bound_s(cfg)
    process = ProcessState(cfg, rank, world, store_port)

    def on_sigterm(signum, frame):
        if process.sigterm_received:
            os._exit(EXIT_TERMINATED)  # a second SIGTERM: stop now
        process.sigterm_received = True

    signal.signal(signal.SIGTERM, on_sigterm)
    process.events.emit(
        "run_start",
        world_size=world,
        preset=cfg.model.preset,
        backend=cfg.distributed.backend,
        checkpoint_backend=cfg.checkpoint.backend,
        steps=cfg.steps,
    )
    fn = train_attempt
    if cfg.inprocess.enabled:
        from workloads.device import resolved_backend
        from workloads.inprocess import TerminationRequested, build_wrapper

        fn = build_wrapper(
            cfg.inprocess,
            backend=resolved_backend(cfg),
            store_port=store_port,
            world_size=world,
            spare_nodes=cfg.distributed.spare_nodes,
            nproc_per_node=int(os.environ.get("LOCAL_WORLD_SIZE", "1")),
            run_dir=Path(cfg.run_dir),
            events=process.events,
            ft=process.ft,
            drop_iteration_state=process.drop_iteration_state,
            sigterm_received=lambda: process.sigterm_received,
        )(train_attempt)
    else:
        TerminationRequested = ()  # noqa: N806 - nothing to catch without the Wrapper
    code = 1
    try:
        outcome = fn(process)
        code = EXIT_TERMINATED if outcome and outcome.get("status") == "terminated" else 0
    except Unrecoverable as err:
        print(f"error: {err}", file=sys.stderr, flush=True)
        code = EXIT_DO_NOT_REQUEUE
    except TerminationRequested:
        code = EXIT_TERMINATED
    except RestartAbort as err:
        print(f"in-process restart gave up: {err}", file=sys.stderr, flush=True)
        code = 1
    finally:
        # Every way out: the exit is bounded from here, and nothing of NVRx's is left for the
        # interpreter's shutdown to tear down. Each step on its own: one failing (a monitor
        # connection already gone) must not keep the checkpoint worker alive.
        arm_exit_watchdog(code)
        for step in (process.ft.shutdown, stop_checkpoint_workers, process.events.close):
            try:
                step()
            except Exception:  # noqa: BLE001 - best effort on the way out; the exit is bounded
                log.exception("on the way out: %s failed", getattr(step, "__name__", step))
    return code


def stop_checkpoint_workers() -> None:
    """Stop every NVRx checkpoint worker this process still has (abort: SIGTERM, then SIGKILL
    after WRITER_ABORT_GRACE_S). After a normal end they are already closed and this does
    nothing. Left to the interpreter, NVRx's __del__ would close them at shutdown by posting to
    the worker's queue and joining it; with the worker dead or aborted that join never returns
    (seen: Py_FinalizeEx blocked in a SemLock acquire, exit code never delivered)."""
    core = sys.modules.get("nvidia_resiliency_ext.checkpointing.async_ckpt.core")
    if core is None:
        return
    core.abort_nvrx_checkpoint()
    if core.AsyncCallsQueue._warmup_persistent_caller is not None:
        core.AsyncCallsQueue._warmup_persistent_caller.close(abort=True)
        core.AsyncCallsQueue._warmup_persistent_caller = None


_exit_watchdog: threading.Timer | None = None


def exit_bound_s(cfg: TrainConfig) -> float:
    """EXIT_BOUND_S, checked against what an orderly exit waits for: the checkpoint worker's abort
    grace and the NVRx monitor's termination grace. A bound shorter than those would turn every
    orderly exit into a watchdog kill."""
    from workloads.checkpoint import WRITER_ABORT_GRACE_S

    needs = WRITER_ABORT_GRACE_S + cfg.inprocess.termination_grace_s
    if not EXIT_BOUND_S > needs:
        raise ConfigError(
            f"inprocess.termination_grace_s: {cfg.inprocess.termination_grace_s:g}s "
            f"plus the checkpoint writer's abort grace ({WRITER_ABORT_GRACE_S:g}s) "
            f"must stay below the exit bound ({EXIT_BOUND_S:g}s); lower it"
        )
    return EXIT_BOUND_S


def arm_exit_watchdog(code: int, bound_s: float = EXIT_BOUND_S) -> None:
    """Guarantee that the process exits with `code` within bound_s from now, whatever the way
    out blocks on (a barrier with a dead peer, a checkpoint worker that ignores SIGTERM). A daemon
    timer: it runs while the main thread waits in a lock or a socket. The first call wins: the
    decision to leave was taken then, and with the code it names."""
    global _exit_watchdog
    if _exit_watchdog is not None:
        return

    def fire() -> None:
        print(
            f"exit watchdog: still here {bound_s:g}s after deciding to exit; exiting {code} now",
            file=sys.stderr,
            flush=True,
        )
        _exit(code)

    _exit_watchdog = threading.Timer(bound_s, fire)
    _exit_watchdog.daemon = True
    _exit_watchdog.start()


def _exit(code: int) -> None:
    """End the process without finalizing the interpreter: flush what was written, then
    os._exit. Finalizing runs NVRx's __del__ methods and the gloo process group's destructor,
    either of which can block on a peer or a worker that is gone (see stop_checkpoint_workers,
    _leave_after_failure); there is nothing left to finish that those would do."""
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)


def preflight(cfg: TrainConfig, world_size: int) -> int:
    """Checks that need no rank: fault ranks, data path, checkpoint compatibility."""
    problems = []
    for fault in parse_fault_spec(cfg.faults):
        if fault.rank >= world_size:
            problems.append(f"faults: {fault.label} targets rank {fault.rank}; the world has {world_size} ranks")
    if cfg.data.source == "memmap":
        from workloads.shards import PREFLIGHT_HASH_BYTES, shard_files

        try:
            shard_files(cfg.data, cfg.model.shape.vocab_size, hash_bytes=PREFLIGHT_HASH_BYTES)
        except ConfigError as err:
            problems.append(str(err))
    if cfg.checkpoint.backend != "none":
        problems += _checkpoint_dir_problems(cfg, world_size)
    for problem in problems:
        print(f"error: {problem}", file=sys.stderr)
    return EXIT_DO_NOT_REQUEUE if problems else 0


def _checkpoint_dir_problems(cfg: TrainConfig, world_size: int) -> list[str]:
    """What the trainer would meet in checkpoint.dir: a pointer it cannot trust, a newest
    checkpoint from another world size or preset, storage that refuses the next save."""
    from nvrx_eks.facts import checkpoint_layout as layout

    root = Path(cfg.checkpoint_dir)
    state = layout.commit_state(root)
    if state.source == "lost":
        return [state.warning]
    if state.source == "rebuilt":
        # The trainer rebuilds the pointer the same way (and says so in its log and events).
        print(f"warning: checkpoint.dir: {state.warning}", file=sys.stderr)
    problems = []
    newest = root / state.committed[0] if state.committed else None
    manifest = layout.verified_commit(newest) if newest is not None else None
    for key, expected in (("world_size", world_size), ("preset", cfg.model.preset)):
        if manifest is not None and manifest.get(key) != expected:
            problems.append(
                f"checkpoint.dir: the newest checkpoint was written with "
                f"{key}={manifest.get(key)!r}, this run has {expected!r}; "
                "resume with the same setting or use an empty checkpoint.dir"
            )
    # The next save needs about as much as the newest one took (nothing to go by on a fresh run).
    need = layout.committed_bytes(newest) if newest is not None else 0
    refusal = layout.storage_refusal_now(root, need)
    if refusal is not None:
        problems.append(layout.storage_refusal_message(refusal, root, need))
    return problems


def main(argv: list | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m workloads.train", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--config", required=True, help="TrainConfig YAML")
    parser.add_argument(
        "--store-port",
        type=int,
        default=None,
        help="port of the in-process restart store on the rank-0 host (default MASTER_PORT+1)",
    )
    parser.add_argument("--preflight", action="store_true", help="only check config, data and checkpoint compatibility")
    parser.add_argument("--world-size", type=int, default=None, help="with --preflight")
    parser.add_argument("overrides", nargs="*", help="dotted.key=value overrides")
    args = parser.parse_args(argv)
    # Before torch is imported: NVRx's store polling makes c10d log a warning per wait timeout.
    os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")
    logging.basicConfig(
        level=logging.INFO, stream=sys.stdout, format=f"%(asctime)s [rank{os.environ.get('RANK', '0')}] %(message)s"
    )
    try:
        cfg = TrainConfig.from_yaml(args.config, args.overrides)
        if args.preflight:
            if args.world_size is None:
                raise ConfigError("--preflight needs --world-size (nnodes x nproc-per-node)")
            return preflight(cfg, args.world_size)
        return run(cfg, args.store_port)
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr, flush=True)
        return EXIT_DO_NOT_REQUEUE
    except Exception:  # noqa: BLE001 - any failure that reached here ends the rank
        _leave_after_failure()


def _leave_after_failure() -> None:
    """Exit 1 without finalizing the interpreter.

    A rank fails this way when a peer died in the middle of a collective (no in-process layer to
    catch it). Finalizing would then garbage-collect the gloo process group, whose destructor
    waits on the dead peer for the whole process-group timeout; the rank ignores ft_launcher's
    SIGTERM meanwhile (it is not in the training loop to honour it), so every launcher restart
    waited workers_stop_timeout_s for the SIGKILL. Nothing is left to finish: events are written
    line by line, the ft client was shut down by run(), the checkpoint worker dies with this
    process (parent-death signal)."""
    traceback.print_exc()
    _exit(1)


def _tie_checkpoint_worker_to_trainer() -> None:
    """Runs in NVRx's spawned checkpoint worker, which imports this module as __mp_main__.

    Own process group: ft_launcher stops a rank by signalling the rank's whole process group, and
    the worker would die with it before the rank could finish its in-flight checkpoint after a
    SIGTERM. Parent-death signal: a SIGKILLed rank would otherwise leave its worker blocked forever
    on a queue whose write end the worker itself inherited. The trainer still stops the worker
    itself (NVRx's close/abort signal its pid)."""
    import ctypes

    os.setpgid(0, 0)
    pr_set_pdeathsig = 1
    ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, int(signal.SIGKILL))
    if os.getppid() == 1:  # the trainer died before the request was made
        os._exit(1)


if __name__ == "__mp_main__" and sys.platform == "linux":
    _tie_checkpoint_worker_to_trainer()


def _main_then_exit() -> None:
    """main(), then _exit with its code, whatever way main ends (an exception the NVRx Wrapper
    re-raises may be a BaseException, e.g. DCP's CheckpointException)."""
    try:
        code = main()
    except SystemExit as err:  # argparse
        code = err.code if isinstance(err.code, int) else 1
    except BaseException:  # noqa: BLE001 - the process ends here either way
        traceback.print_exc()
        code = 1
    _exit(code)


if __name__ == "__main__":
    _main_then_exit()
