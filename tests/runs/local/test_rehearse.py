"""`nvrx-eks rehearse`: the rendered JobSet's pods run in podman, under their own security context
and containerd's RuntimeDefault seccomp profile, from the CPU twin of the trainer image.

Without podman (or where it cannot run) these tests skip with one line saying why; `make setup`
installs it where it can (as root with apt). The JobSet semantics and the pod's translation into
podman's arguments are tested without it: tests/unit/local/test_rehearse.py.
"""

from __future__ import annotations

import io
import json
import os
import re
from pathlib import Path

import pytest
import yaml
from rich.console import Console

from nvrx_eks.rehearse.pods import SUBSTITUTIONS
from nvrx_eks.rehearse.runner import execute, prepare
from nvrx_eks.rehearse.runtime import CONTAINERD_SECCOMP, REHEARSAL_LABEL, Podman
from tests.support.named_runs import named_summary
from tests.support.trainer_fixtures import exclusive_trainer_runs


@pytest.fixture(scope="session")
def podman() -> Podman:
    engine = Podman()
    if reason := engine.unusable():
        pytest.skip(f"no container runtime for rehearsals: {reason}")
    return engine


def _prepare(tmp_path: Path, podman: Podman, **kwargs) -> object:
    options = {"profile": None, "nodes": 2, "nproc": 1, "steps": 30, "faults": "", "run_dir": tmp_path / "r"}
    return prepare(**{**options, **kwargs}, console=Console(file=io.StringIO()), podman=podman)


def _inspect_container_of(prepared, podman: Podman) -> dict:
    name = prepared.run.create(0, 0)
    try:
        return podman.inspect(name)
    finally:
        podman.run(["rm", "-f", name], check=False)


def _rendered_pod(root: Path) -> dict:
    jobset = next(d for d in yaml.safe_load_all((root / "rendered.yaml").read_text()) if d and d["kind"] == "JobSet")
    return jobset["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]


def _differences(rendered: dict, inspected: dict, image_env: set[str]) -> set[str]:
    """What of the rendered pod's container the created container does not carry as written, by
    SUBSTITUTIONS key; anything else is named by its field."""
    (container,) = rendered["spec"]["containers"]
    found: set[str] = set()
    if inspected["ImageName"] != container["image"]:
        found.add("image")
    ran_args = inspected["Config"]["Cmd"]
    if ran_args != container["args"]:
        # Only the rank count may differ: --nproc-per-node and --world-size.
        normalize = lambda s: re.sub(r"(--nproc-per-node|--world-size) \d+", r"\1 N", s)  # noqa: E731
        assert [normalize(a) for a in ran_args] == [normalize(a) for a in container["args"]], "args"
        found.add("ranks per node")
    ran_env = dict(e.split("=", 1) for e in inspected["Config"]["Env"])
    for var in container["env"]:
        if "value" in var and "$(" not in var["value"] and ran_env.get(var["name"]) != var["value"]:
            found.add(f"env {var['name']}")
    rendered_names = {v["name"] for v in container["env"]}
    kubelet_added = {"JOB_COMPLETION_INDEX", "HOSTNAME", "container", "TERM", "HOME"}
    for name in set(ran_env) - rendered_names - image_env - kubelet_added:
        found.add(f"env {name}")
    host_config = inspected["HostConfig"]
    caps = container["securityContext"]["capabilities"]
    assert set(host_config["CapAdd"] or []) == {f"CAP_{c}" for c in caps["add"]}, "capabilities"
    assert f"seccomp={CONTAINERD_SECCOMP}" in " ".join(host_config["SecurityOpt"]), "seccomp"
    assert "no-new-privileges" in " ".join(host_config["SecurityOpt"]), "allowPrivilegeEscalation"
    if host_config["NetworkMode"] == "host":
        found.add("network")
    if not host_config.get("Devices"):
        found.add("resources")
    mounted = {m["Destination"] for m in inspected["Mounts"]} | set(host_config.get("Tmpfs") or {})
    assert mounted == {m["mountPath"] for m in container["volumeMounts"]}, "volume mounts"
    assert inspected["Config"]["Hostname"] == "train-worker-0-0"
    assert inspected["Config"]["StopTimeout"] == rendered["spec"]["terminationGracePeriodSeconds"]
    return found


@pytest.mark.slow
@pytest.mark.xdist_group("trainer_runs")
def test_the_rehearsed_pod_differs_from_the_rendered_one_only_by_the_substitutions(tmp_path, podman):
    prepared = _prepare(tmp_path, podman)
    inspected = _inspect_container_of(prepared, podman)
    image = json.loads(podman.run(["image", "inspect", prepared.run.image]).stdout)[0]
    image_env = {e.split("=", 1)[0] for e in image["Config"]["Env"]}
    assert _differences(_rendered_pod(prepared.run.root), inspected, image_env) == set(SUBSTITUTIONS)


def _no_container_left(podman: Podman) -> None:
    left = podman.run(["ps", "-a", "--filter", f"label={REHEARSAL_LABEL}", "--format", "{{.Names}}"]).stdout
    assert left.split() == []


@pytest.mark.slow
@pytest.mark.xdist_group("trainer_runs")
def test_rehearsals_of_the_p5_pods_end_as_the_bare_process_run_does(tmp_path, tmp_path_factory, podman):
    """Acceptance: a rehearsal with a trainer fault, a deleted pod and a killed pod ends with the
    state of `nvrx-eks local` on the same world (its clean run); each fault is recovered by its
    layer; the p5 pod's ranks start under containerd's profile (they bind to their NUMA node
    themselves); no container is left."""
    expected = named_summary(tmp_path_factory, "clean-2x1-40")["state_sha256"]
    with exclusive_trainer_runs(tmp_path_factory):
        # 40 steps: past the pod-kill's step 25 the run still has 15 steps (about 1.5 s), time
        # for the runner's poll to see it before the run ends.
        faults = "exception@9:1,pod-stop@15:1,pod-kill@25:0"
        faulted = _prepare(tmp_path / "faults", podman, steps=40, faults=faults)
        assert execute(faulted) == 0
    _no_container_left(podman)
    log = (faulted.run.root / "pod-logs" / "train-worker-0-0-a0.log").read_text()
    assert "numa: local rank 0 bound to NUMA node 0" in log
    summary = json.loads((faulted.trainer_dir / "summary.json").read_text())
    assert summary["state_sha256"] == expected
    layers = {f["fault"]: f.get("layer") for f in summary["faults"]}
    assert layers == {"exception@9:1": "inprocess", "pod-stop@15:1": "kubernetes", "pod-kill@25:0": "kubernetes"}
    record = json.loads((faulted.run.root / "rehearsal.json").read_text())
    assert record["attempts"] == 3 and record["pod_faults_not_fired"] == []


@pytest.mark.slow
@pytest.mark.xdist_group("trainer_runs")
def test_ft_launchers_numactl_binding_cannot_start_a_rank_under_the_pods_seccomp_profile(
    tmp_path, tmp_path_factory, podman
):
    """The render before the fix set NVRX_GPUS_PER_NUMA: ft_launcher then starts each rank as
    `numactl --cpunodebind N --membind N`, which containerd's RuntimeDefault refuses without
    CAP_SYS_NICE. The same pod with that variable fails, numactl's EPERM in its log. One pod,
    and no launcher restarts: the first start of its rank shows it."""
    prepared = _prepare(tmp_path, podman, steps=5, nodes=1, overrides=["fault_tolerance.max_restarts=0"])
    container = prepared.run.pod_template["spec"]["containers"][0]
    container["env"].append({"name": "NVRX_GPUS_PER_NUMA", "value": "4"})
    prepared.run.jobset["spec"]["failurePolicy"]["maxRestarts"] = 0
    with exclusive_trainer_runs(tmp_path_factory):
        assert execute(prepared) != 0
    log = (prepared.run.root / "pod-logs" / "train-worker-0-0-a0.log").read_text()
    assert "Operation not permitted" in log and "membind" in log
    assert not os.path.exists(prepared.trainer_dir / "summary.json")
    _no_container_left(podman)
