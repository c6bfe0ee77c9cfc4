"""The processes a rank spawns, and what a SIGTERM to the whole node does to them.

A rank spawns two kinds of helper, both with multiprocessing's spawn, so both import this trainer
(workloads.train) as __mp_main__ before they run: NVRx's checkpoint worker
(workloads.checkpoint.nvrx_worker), and the multiprocessing Manager that serves NVRx's
write-results queue, which the rank's first save starts (filesystem_async.get_write_results_queue).
A SIGTERM may reach them while the rank still needs them for its stop-save: ft_launcher stops a
rank by signalling the rank's whole process group, and a node shutdown signals every process.
So a helper, once it imported the trainer, leaves the rank's process group, dies with the rank
(parent-death signal) and ignores SIGTERM (become_rank_helper).

Importing the trainer takes seconds (torch), and a SIGTERM within them used to end the helper: when
the rank's first save, which starts the Manager, met a stop, the save failed on the dead Manager
(EOFError from its proxy), the rank restarted in process and left with 143 and no stop-save (2 of
12 repetitions of the stop to every process in tests/runs/local/test_local_signals.py, 0 of 12
with the hold below: BENCHMARKS.md, "A stop that meets the rank's first save"). So helpers are
spawned with SIGTERM blocked (spawning_rank_helpers): a signal mask survives fork and exec, and a
blocked signal stays pending whatever its disposition. It stays blocked in the Manager, which
ignores it anyway; the checkpoint worker lets it through once its own handler is in place
(workloads.checkpoint.nvrx_worker), so a SIGTERM that came meanwhile reaches that handler, never
the default action. SIGKILL ends a helper at any time.

NVRx's in-process monitor is forked, not spawned: it keeps the rank's own handler, and runs none
of this.

No torch: the helpers import this before anything else of the trainer's.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
from collections.abc import Iterator


@contextlib.contextmanager
def spawning_rank_helpers() -> Iterator[None]:
    """Spawn the rank's helpers in here: they start with SIGTERM blocked. The calling thread blocks
    it meanwhile (the mask a child inherits is its spawning thread's); a SIGTERM to the rank is
    taken by another of its threads, and its Python handler runs as always."""
    # multiprocessing starts its resource tracker at the first spawn, and unblocks SIGTERM in the
    # calling thread when it does (resource_tracker.ensure_running): have it running first.
    from multiprocessing import resource_tracker

    resource_tracker.ensure_running()
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def let_sigterm_through() -> None:
    """In a helper spawned by spawning_rank_helpers, once its own SIGTERM handler is in place."""
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})


def become_rank_helper() -> None:
    """Runs in every helper the rank spawns, as it imports the trainer.

    Own process group: ft_launcher signals the rank's process group, and the helper would die
    before the rank could finish its in-flight checkpoint. Parent-death signal: a SIGKILLed rank
    would otherwise leave its worker blocked forever on a queue whose write end the worker itself
    inherited, or its Manager serving no one. SIGTERM ignored: the rank stops its helpers itself
    (NVRx's abort signals the worker's pid; the checkpoint worker installs its own handler for
    that), and a SIGTERM sent to every process of the node must not end them while the rank makes
    its stop-save. SIGTERM stays blocked, as it was spawned (see the module doc)."""
    if sys.platform == "linux":
        import ctypes

        os.setpgid(0, 0)
        pr_set_pdeathsig = 1
        ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, int(signal.SIGKILL))
        if os.getppid() == 1:  # the rank died before the request was made
            os._exit(1)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
