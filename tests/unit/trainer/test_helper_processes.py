"""workloads.helper_processes: a helper the rank spawns outlives a SIGTERM sent while it starts,
and once it imported the trainer it ignores SIGTERM in a process group of its own, tied to its rank.

Each case runs in a fresh interpreter: the resource tracker that multiprocessing starts at the
first spawn is part of what is tested, and a SIGTERM must not reach pytest."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

from tests.support.trainer_fixtures import REPO

#: SigBlk of a child spawned inside or outside spawning_rank_helpers, its spawner's mask before and
#: after, on the interpreter's first spawn (which also starts the resource tracker).
MASKS = textwrap.dedent(
    """
    import multiprocessing as mp, signal, sys
    from workloads.helper_processes import spawning_rank_helpers

    def blocked():
        return signal.SIGTERM in signal.pthread_sigmask(signal.SIG_BLOCK, set())

    def report(queue):
        queue.put(blocked())

    def child_blocked(queue):
        process = mp.get_context("spawn").Process(target=report, args=(queue,))
        process.start()
        process.join()
        return queue.get()

    if __name__ == "__main__":
        queue = mp.get_context("spawn").SimpleQueue()
        if sys.argv[1] == "held":
            with spawning_rank_helpers():
                inside = blocked()
                child = child_blocked(queue)
        else:
            inside, child = blocked(), child_blocked(queue)
        print(inside, child, blocked())
    """
)

#: NVRx's write-results queue started while a thread sends SIGTERM to every child process of this
#: one as soon as it appears: its Manager is then in the seconds of its start-up (a node's SIGTERM
#: landing during the rank's first save).
MANAGER_UNDER_FIRE = textwrap.dedent(
    """
    import os, signal, sys, threading, time
    import psutil

    def snipe(stop):
        me, hit = psutil.Process(), set()
        while not stop.is_set():
            for child in me.children(recursive=True):
                if child.pid not in hit:
                    hit.add(child.pid)
                    os.kill(child.pid, signal.SIGTERM)
            time.sleep(0.002)

    if __name__ == "__main__":
        from nvidia_resiliency_ext.checkpointing.async_ckpt import filesystem_async
        from workloads.checkpoint.writers import _start_results_queue

        stop = threading.Event()
        threading.Thread(target=snipe, args=(stop,), daemon=True).start()
        try:
            if sys.argv[1] == "held":
                _start_results_queue()
            else:
                filesystem_async.get_write_results_queue()
            time.sleep(0.5)  # every SIGTERM delivered
            queue = filesystem_async.get_write_results_queue()
            queue.put("written")
            print(queue.get(timeout=10))
        except Exception as err:
            print(type(err).__name__)
        finally:
            stop.set()
    """
)

#: What a helper that imported the trainer (as multiprocessing's spawn does) has set up.
TRAINER_AS_HELPER = textwrap.dedent(
    """
    import ctypes, os, runpy, signal
    runpy.run_module("workloads.train", run_name="__mp_main__")
    pdeathsig = ctypes.c_int()
    ctypes.CDLL(None).prctl(2, ctypes.byref(pdeathsig))  # PR_GET_PDEATHSIG
    print(signal.getsignal(signal.SIGTERM) == signal.SIG_IGN, os.getpgid(0) == os.getpid(),
          pdeathsig.value == signal.SIGKILL)
    """
)


def _python(tmp_path: Path, script: str, *args: str) -> str:
    """Runs `script` as a file: a spawned child imports its parent's main module from its path."""
    path = tmp_path / "script.py"
    path.write_text(script)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    command = [sys.executable, str(path), *args]
    done = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout.strip()


def test_helpers_spawned_in_the_hold_start_with_sigterm_blocked_and_the_spawner_gets_its_mask_back(tmp_path):
    # inside the hold / the child / the spawner afterwards
    assert _python(tmp_path, MASKS, "held") == "True True False"
    # Outside the hold a child starts with SIGTERM deliverable: what the hold changes.
    assert _python(tmp_path, MASKS, "plain") == "False False False"


def test_the_results_queue_started_in_the_hold_outlives_a_sigterm_that_meets_its_manager_starting(tmp_path):
    assert _python(tmp_path, MANAGER_UNDER_FIRE, "held") == "written"
    # Started by NVRx as before, the same SIGTERM ends the Manager and the queue is gone: the
    # rank's save failed, an in-process restart followed, and the stop-save was lost.
    assert _python(tmp_path, MANAGER_UNDER_FIRE, "plain") != "written"


def test_the_trainer_imported_as_a_helper_ignores_sigterm_in_its_own_process_group_and_dies_with_its_rank(tmp_path):
    assert _python(tmp_path, TRAINER_AS_HELPER) == "True True True"
