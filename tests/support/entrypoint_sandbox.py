"""The rendered container entrypoint in a sandbox: stand-ins for `python` and `ft_launcher` on
PATH (the real ft_launcher where a test puts it there), the entrypoint of either API, SIGTERM as
the image's tini delivers it, and do-not-requeue records of other attempts."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from infra.config import resolve_config
from nvrx_eks.jobs.render import render_job
from nvrx_eks.jobs.spec import build_jobspec
from tests.support import REPO_ROOT
from workloads import do_not_requeue

FAKE_PYTHON = """\
#!/bin/sh
# `python -c <dns wait> HOST` and `python -m workloads.train ... --preflight`; the do-not-requeue
# check is the real one.
case " $* " in
  *" --preflight "*) exit "${PREFLIGHT_EXIT:-0}" ;;
  *" workloads.do_not_requeue "*) exec "$REAL_PYTHON" "$@" ;;
  *) echo "$@" | grep -q getaddrinfo && exit "${DNS_EXIT:-0}"; exit 0 ;;
esac
"""


FAKE_LAUNCHER = """\
#!/bin/sh
echo "$@" > "$WORK/launcher-args"
trap 'echo term >> "$WORK/launcher-signals"; sleep 0.3; exit "${LAUNCHER_TERM_EXIT:-143}"' TERM
if [ -n "${LAUNCHER_SLEEP:-}" ]; then
  touch "$WORK/launcher-started"
  i=0; while [ $i -lt 100 ]; do sleep 0.1; i=$((i+1)); done
fi
exit "${LAUNCHER_EXIT:-0}"
"""


def trainer_pod(api: str) -> dict:
    job = render_job(build_jobspec(resolve_config(), nodes=2, name="train", api=api)).job_document
    if api == "jobset":
        return job["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    return job["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]


def entrypoint(api: str) -> str:
    args = trainer_pod(api)["containers"][0]["args"]
    assert args[:2] == ["/bin/sh", "-c"]
    return args[2]


@pytest.fixture
def sandbox(tmp_path: Path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, body in (("python", FAKE_PYTHON), ("ft_launcher", FAKE_LAUNCHER)):
        path = bin_dir / name
        path.write_text(textwrap.dedent(body))
        path.chmod(0o755)
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "WORK": str(tmp_path), "REAL_PYTHON": sys.executable}
    return tmp_path, env


def stale_records(run_dir: Path, attempt: str) -> None:
    """A record of another attempt, and one of this attempt id but older than the pod (an earlier
    submission under the same name)."""
    do_not_requeue.write_record(run_dir, "uid-0-3", reason="an earlier attempt", rank=0)
    old = do_not_requeue.write_record(run_dir, attempt, reason="earlier", rank=0)
    record = json.loads(old.read_text())
    old.write_text(json.dumps({**record, "time": record["time"] - 3600}))


DOCKERFILE = REPO_ROOT / "workloads" / "Dockerfile"


def tini_signals_the_group() -> bool:
    """`tini -g` signals the child's whole process group, plain tini the child alone."""
    (line,) = [line for line in DOCKERFILE.read_text().splitlines() if line.startswith("ENTRYPOINT")]
    return "-g" in json.loads(line.removeprefix("ENTRYPOINT"))


def deliver_sigterm_like_tini(process: subprocess.Popen) -> None:
    # The test starts the entrypoint in its own session, as tini's child is: pid == pgid.
    if tini_signals_the_group():
        os.killpg(process.pid, signal.SIGTERM)
    else:
        os.kill(process.pid, signal.SIGTERM)
