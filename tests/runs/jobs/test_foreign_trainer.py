"""The contract of workloads/README.md ("Bring your own trainer"), held by a trainer that is not
ours (tests/support/foreign_trainer.py: no NVRx Wrapper, no torch) run in the rendered trainer pod.

The pod runs as `nvrx-eks rehearse` runs pods: in podman, from the CPU twin of the trainer image,
with the rendered args, env (downward API included), security context and mounts (the claim, the
trainer ConfigMap, /dev/shm), and only the rehearsal's substitutions (nvrx_eks/rehearse/pods.py:
no GPU or EFA, the host's network). The foreign trainer sits on the claim, where `--trainer`
names it; the image's ft_launcher starts its ranks.

Without podman (or where it cannot run) the pod tests skip with one line saying why; what the
entry does to the rendered pod is tested without it: tests/unit/jobs/test_foreign_trainer_entry.py.
"""

from __future__ import annotations

import io
import json
import shutil
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from rich.console import Console

from nvrx_eks.deploy.deployment import load_deployment
from nvrx_eks.facts.exit_codes import EXIT_DO_NOT_REQUEUE
from nvrx_eks.facts.names import FSX_MOUNT_PATH
from nvrx_eks.jobs.commands import build_spec
from nvrx_eks.jobs.options import JobOptions
from nvrx_eks.jobs.render import render_job
from nvrx_eks.rehearse.image import build_twin
from nvrx_eks.rehearse.runner import Rehearsal
from nvrx_eks.rehearse.runtime import Podman
from tests.support import REPO_ROOT
from tests.support.trainer_fixtures import exclusive_trainer_runs

FOREIGN_TRAINER = REPO_ROOT / "tests" / "support" / "foreign_trainer.py"
#: Where the job finds it: on the claim, which every pod mounts at /fsx.
TRAINER_IN_POD = f"{FSX_MOUNT_PATH}/code/foreign_trainer.py"
#: One pod's run: ft_launcher's start-up and one short rank, well inside it.
POD_TIMEOUT_S = 180


@pytest.fixture(scope="module")
def twin(tmp_path_factory) -> tuple[Podman, str]:
    podman = Podman()
    if reason := podman.unusable():
        pytest.skip(f"no container runtime for the pod: {reason}")
    return podman, build_twin(podman, Console(file=io.StringIO()))


@dataclass
class PodRun:
    exit_code: int
    log: str
    run_dir: Path  # the job's run directory, as the host sees the claim


def job_name() -> str:
    """A name of its own: the pod's container is named after it, beside other runs' pods."""
    return f"byo{uuid.uuid4().hex[:8]}"


def run_pod(
    root: Path, twin: tuple[Podman, str], tmp_path_factory, *, name: str | None = None, data: str | None = None
) -> PodRun:
    """Render a 1-node job running the foreign trainer (one rank) and run its pods as a rehearsal
    starts them, to the end of the trainer pod."""
    podman, image = twin
    (root / "fsx" / "code").mkdir(parents=True, exist_ok=True)
    shutil.copy(FOREIGN_TRAINER, root / "fsx" / "code" / FOREIGN_TRAINER.name)
    config = root / "train.yaml"  # only what differs from the defaults: the run directory stays the job's
    config.write_text(yaml.safe_dump({"model": {"preset": "tiny"}, "steps": 4, "fault_tolerance": {"max_restarts": 0}}))
    options = JobOptions(
        nodes=1, name=name or job_name(), train_config=str(config), trainer=TRAINER_IN_POD, ranks_per_node=1, data=data
    )
    rendered = render_job(build_spec(load_deployment("g5-smoke"), options, None))
    for config_map in (d for d in rendered.documents if d["kind"] == "ConfigMap"):
        for key, value in config_map["data"].items():
            (root / "configmaps" / config_map["metadata"]["name"]).mkdir(parents=True, exist_ok=True)
            (root / "configmaps" / config_map["metadata"]["name"] / key).write_text(value)
    rehearsal = Rehearsal(podman, root, rendered.job_document, image, Console(file=io.StringIO()))
    port = int(rendered.spec.rendezvous_endpoint.rsplit(":", 1)[1])
    # The pods listen on the host's network (the rendezvous port): one run at a time.
    with exclusive_trainer_runs(tmp_path_factory):
        names, coordinator = rehearsal.start_attempt(0, port)
        try:
            waited = podman.run(["wait", names[0]], timeout=POD_TIMEOUT_S)
            logs = [podman.run(["logs", n], check=False) for n in names]
        finally:
            podman.run(["rm", "-f", "-t", "0", *names, *([coordinator] if coordinator else [])], check=False)
    run_dir = root / "fsx" / Path(rendered.spec.train.run_dir).relative_to(FSX_MOUNT_PATH)
    return PodRun(int(waited.stdout.strip()), "".join(log.stdout + log.stderr for log in logs), run_dir)


@pytest.mark.slow
@pytest.mark.xdist_group("trainer_runs")
def test_a_foreign_trainer_runs_to_the_end_under_the_rendered_pod(tmp_path, twin, tmp_path_factory):
    run = run_pod(tmp_path, twin, tmp_path_factory)
    assert run.exit_code == 0, run.log
    assert "preflight ok for world size 1" in run.log
    result = json.loads((run.run_dir / "result-rank0.json").read_text())
    # It read the config file the pod mounts, and ran as rank 0 of a world of 1 under ft_launcher.
    assert {k: result[k] for k in ("rank", "world_size", "steps", "model")} == {
        "rank": 0,
        "world_size": 1,
        "steps": 4,
        "model": "tiny",
    }
    assert result["attempt"].endswith("-0")  # <JobSet uid>-<restart attempt>, from the downward API
    assert (run.run_dir / "checkpoints" / "latest_step").read_text() == "4"


@pytest.mark.slow
@pytest.mark.xdist_group("trainer_runs")
def test_exit_93_in_the_preflight_fails_the_pod_with_93_before_any_rank(tmp_path, twin, tmp_path_factory):
    run = run_pod(tmp_path, twin, tmp_path_factory, data="no-such-shards")
    assert run.exit_code == EXIT_DO_NOT_REQUEUE, run.log
    assert f"data.path {FSX_MOUNT_PATH}/no-such-shards does not exist" in run.log
    assert not run.run_dir.exists() or not list(run.run_dir.glob("result-rank*.json"))


@pytest.mark.slow
@pytest.mark.xdist_group("trainer_runs")
def test_a_rank_that_records_do_not_requeue_makes_the_pod_exit_93(tmp_path, twin, tmp_path_factory):
    """ft_launcher restarts a rank whatever it exits with; the record in the run directory is what
    turns the launcher's end into the pod's 93 (the entrypoint reads it with the image's
    workloads.do_not_requeue)."""
    name = job_name()
    run_dir = tmp_path / "fsx" / "runs" / name  # where the job's run directory is placed on the claim
    run_dir.mkdir(parents=True)
    (run_dir / "foreign-state.json").write_text(json.dumps({"model": "another"}))
    run = run_pod(tmp_path, twin, tmp_path_factory, name=name)
    assert run.exit_code == EXIT_DO_NOT_REQUEUE, run.log
    assert "was written for another model than tiny" in run.log
    [record] = (run_dir / "do-not-requeue").iterdir()
    assert json.loads(record.read_text())["rank"] == 0
