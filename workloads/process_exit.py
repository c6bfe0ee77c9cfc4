"""Ending a process that used a process group: flush, then os._exit, never a finalized interpreter.

Finalizing runs NVRx's __del__ methods and the gloo process group's destructor. After a fault
either can block on a peer or a worker that is gone (workloads.checkpoint.writers
stop_checkpoint_workers, workloads.train _leave_after_failure). Even after a clean
`destroy_process_group()` on every rank, a process that had used gloo aborts now and then while
its interpreter is torn down, with all of its work done and written: "terminate called without an
active exception", SIGABRT, no Python frame on the stack (torch 2.13 CPU, three ranks saving a
sharded model: 6 of 100 rounds had such a rank, 0 of 100 ending here; BENCHMARKS.md, "Ending a
process that used gloo"). By the time a process calls this there is nothing left to finish that
finalizing would do. No torch: the checkpoint worker imports it (through workloads.train).
"""

from __future__ import annotations

import logging
import os
import sys
from typing import NoReturn


def exit_without_finalizing(code: int) -> NoReturn:
    """Flush what was logged or printed, then end this process with `code` at once."""
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)
