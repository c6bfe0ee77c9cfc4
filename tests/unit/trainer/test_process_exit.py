"""workloads.process_exit: a process ends with its code and everything it printed or logged, and
nothing of the interpreter's teardown runs (an atexit handler stands in for it)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

from tests.support.trainer_fixtures import REPO

CHILD = textwrap.dedent(
    """
    import atexit, logging, sys
    from workloads.process_exit import exit_without_finalizing

    atexit.register(lambda: print("finalized", flush=True))
    logging.basicConfig(stream=sys.stderr, format="%(message)s")
    logging.getLogger("child").warning("logged")
    print("torch" in sys.modules, end=" ")
    print("printed, not flushed", end="")
    exit_without_finalizing(7)
    """
)


def test_the_process_ends_with_its_code_and_its_output_without_finalizing():
    done = subprocess.run([sys.executable, "-c", CHILD], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert done.returncode == 7, done.stderr
    assert done.stdout == "False printed, not flushed"  # no torch imported, no "finalized"
    assert done.stderr == "logged\n"
