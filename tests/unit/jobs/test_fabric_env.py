"""The environment rendered into training pods (fabric, the NCCL settings NVRx's in-process
restart needs, NUMA binding) and the fabric test's EFA assertion, run for real under bash."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from infra.config import resolve_config
from nvrx_eks.jobs.render import MPIRUN, render_job
from nvrx_eks.jobs.spec import NCCL_TESTS_IMAGE, build_jobspec
from workloads.numa import GPUS_PER_NUMA_ENV
from workloads.process_env import NCCL_RESTART_ENV
from workloads.transport import NET_PLUGIN


def _container(profile: str, **kwargs) -> dict:
    job = render_job(build_jobspec(resolve_config(profile), nodes=2, name="train", **kwargs)).job_document
    if job["kind"] == "PyTorchJob":
        pod = job["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]
    else:
        pod = job["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]
    return pod["spec"]["containers"][0]


def _env(container: dict) -> dict[str, str]:
    return {e["name"]: e["value"] for e in container["env"] if "value" in e}


@pytest.mark.parametrize("api", ["jobset", "pytorchjob"])
def test_trainer_pod_env_carries_the_nccl_settings_nvrx_needs(api):
    env = _env(_container("p5", api=api))
    # ft_launcher would otherwise inject 1 (TearDown): the watchdog kills ranks NVRx could restart.
    assert env["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "2"
    assert env["TORCH_NCCL_RETHROW_CUDA_ERRORS"] == "0"
    assert env["NCCL_NVLS_ENABLE"] == "0"
    assert {k: env[k] for k in NCCL_RESTART_ENV} == NCCL_RESTART_ENV
    assert env["FI_EFA_USE_HUGE_PAGE"] == "0"  # no huge pages on the nodes, none requested


def test_numa_binding_follows_the_instance_facts():
    assert _env(_container("p5"))[GPUS_PER_NUMA_ENV] == "4"  # 8 GPUs over 2 sockets
    assert GPUS_PER_NUMA_ENV not in _env(_container("g5-smoke"))  # one socket: nothing to bind


@pytest.mark.parametrize("profile", ["p5", "p5en", "g5-smoke"])
def test_no_pod_asks_ft_launcher_for_numactl(profile):
    """NVRX_GPUS_PER_NUMA makes ft_launcher run each rank under `numactl --membind`, which the
    pod's RuntimeDefault seccomp profile refuses without CAP_SYS_NICE (workloads/numa.py)."""
    assert "NVRX_GPUS_PER_NUMA" not in _env(_container(profile))


def test_pods_and_image_name_the_same_nccl_net_plugin():
    """NCCL opens the library NCCL_NET_PLUGIN names; the image build checked that one."""
    assert _env(_container("p5"))["NCCL_NET_PLUGIN"] == NET_PLUGIN
    container, _ = _fabric_script(2)
    assert _env(container)["NCCL_NET_PLUGIN"] == NET_PLUGIN


def _fabric_script(nodes: int) -> tuple[dict, str]:
    job = render_job(build_jobspec(resolve_config("p5"), nodes=nodes, name="nccl", workload="nccl-test")).job_document
    container = job["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]["containers"][0]
    return container, container["command"][2]


def test_fabric_test_uses_a_pinned_image_and_mpirun_by_absolute_path():
    container, script = _fabric_script(2)
    assert container["image"] == NCCL_TESTS_IMAGE and not NCCL_TESTS_IMAGE.endswith(":latest")
    assert ":" in NCCL_TESTS_IMAGE.rsplit("/", 1)[1]
    assert f"{{ {MPIRUN} --allow-run-as-root" in script and MPIRUN.startswith("/")
    env = _env(container)
    assert env["NCCL_DEBUG"] == "INFO" and "NET" in env["NCCL_DEBUG_SUBSYS"].split(",")


def _run_efa_check(script: str, log: str, tmp_path: Path) -> subprocess.CompletedProcess:
    """The rendered per-node check, on `log` as mpirun's tagged output."""
    start = script.index("# Without EFA")
    end = script.index("\ndone\n", start) + len("\ndone\n")
    log_path = tmp_path / "nccl-tests.log"
    log_path.write_text(log)
    block = script[start:end].replace("/tmp/nccl-tests.log", str(log_path))
    return subprocess.run(["bash", "-c", f'status=0\n{block}exit "$status"\n'], capture_output=True, text=True)


def _line(node: int, provider: str) -> str:
    return f"[1,{node * 8}]<stdout>:nccl-worker-0-{node}:41:41 [0] NCCL INFO NET/OFI Selected provider is {provider}\n"


def test_fabric_test_requires_efa_on_every_node(tmp_path):
    _, script = _fabric_script(3)
    ok = _run_efa_check(script, "".join(_line(n, "efa") for n in range(3)), tmp_path)
    assert ok.returncode == 0, ok.stderr
    # One node fell back: the other two logging efa must not hide it.
    one_missing = _run_efa_check(script, _line(0, "efa") + _line(2, "efa"), tmp_path)
    assert one_missing.returncode == 1 and "nccl-worker-0-1 did not select the EFA provider" in one_missing.stderr
    tcp = _run_efa_check(script, "".join(_line(n, "tcp") for n in range(3)), tmp_path)
    assert tcp.returncode == 1
    # Host names are matched whole: node 1 is not satisfied by node 11's line.
    _, script12 = _fabric_script(12)
    lines = [_line(n, "efa") for n in range(12) if n != 1]
    assert _run_efa_check(script12, "".join(lines), tmp_path).returncode == 1
