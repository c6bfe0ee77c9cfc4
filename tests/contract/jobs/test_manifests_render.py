"""Rendering: golden manifests for 1/2/4/16 nodes x JobSet/PyTorchJob x p5/g5 (plus the fabric
test), and the properties the job relies on, asserted on the parsed objects."""

from __future__ import annotations

import shlex

import jinja2
import pytest

from infra.config import resolve_config
from nvrx_eks.facts import names as conventions
from nvrx_eks.facts.errors import ConfigError
from nvrx_eks.facts.instances import facts_for
from nvrx_eks.facts.job_kinds import JOBSET
from nvrx_eks.jobs.render import _ENV, render_job
from nvrx_eks.jobs.spec import OFFLINE_PLACEHOLDER_IMAGE, TRAIN_CONFIG_PATH, build_jobspec
from nvrx_eks.rehearse.jobset import JobState, jobset_action
from tests.support.manifest_cases import GOLDEN_CASES, UPDATE_GOLDEN, Case
from workloads.config import TrainConfig
from workloads.launch import build_ft_launcher_argv


@pytest.mark.parametrize("case", GOLDEN_CASES, ids=lambda c: c.id)
def test_render_matches_golden(case: Case):
    text = case.render().text
    if UPDATE_GOLDEN:
        case.golden_path.parent.mkdir(exist_ok=True)
        case.golden_path.write_text(text)
    assert case.golden_path.is_file(), f"missing {case.golden_path}; run with NVRX_EKS_UPDATE_GOLDEN=1"
    assert text == case.golden_path.read_text(), f"{case.id} differs from its golden file (see module docstring)"


def _pods(job: dict) -> list[dict]:
    if job["kind"] == "JobSet":
        return [rj["template"]["spec"]["template"] for rj in job["spec"]["replicatedJobs"]]
    return [rs["template"] for rs in job["spec"]["pytorchReplicaSpecs"].values()]


def _launcher_argv(pod: dict) -> list[str]:
    script = pod["spec"]["containers"][0]["args"][2]
    line = next(line for line in script.splitlines() if "ft_launcher" in line and not line.lstrip().startswith("#"))
    tokens = shlex.split(line)
    return tokens[:-1] if tokens[-1] == "&" else tokens


def _assert_coordinator(job: dict, coordinator: dict, *, launcher_argv: list[str]) -> None:
    """The coordinator replicated job: one pod on a system node, serving the endpoint, node count
    and rendezvous id the launchers join, with no privilege; its loss restarts the JobSet."""
    assert coordinator["name"] == "coordinator" and coordinator["replicas"] == 1
    spec = coordinator["template"]["spec"]
    assert (spec["parallelism"], spec["completions"], spec["backoffLimit"]) == (1, 1, 0)
    pod = spec["template"]["spec"]
    assert pod["nodeSelector"] == {"nvrx-eks.io/node-pool": "system"} and "tolerations" not in pod
    [container] = pod["containers"]
    args = container["args"]
    assert args[:3] == ["python", "-m", "workloads.coordinator"]
    for flag in ("--nnodes", "--rdzv-endpoint", "--rdzv-id"):
        assert args[args.index(flag) + 1] == launcher_argv[launcher_argv.index(flag) + 1], flag
    assert {p["containerPort"] for p in container["ports"]} == {29500, 29501}
    assert container["securityContext"]["runAsNonRoot"] is True
    assert container["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert "nvidia.com/gpu" not in container["resources"]["requests"]
    assert job["spec"]["coordinator"]["replicatedJob"] == "coordinator"
    # A failed coordinator Job matches no rule (they target the workers): the JobSet restarts.
    state = JobState(spec)
    state.pod_ended(0, 1, disrupted=False)
    assert jobset_action(job["spec"], state.failure_reason, 0, state.failure_message) == "restart"


def test_four_node_jobset_acceptance():
    """Acceptance 2: the coordinator's DNS name is every worker's rendezvous endpoint; 8 GPUs and
    32 EFA devices per pod; exit 93 fails the job without restart."""
    rendered = render_job(build_jobspec(resolve_config(), nodes=4, name="train"))
    job = rendered.job_document
    assert job["kind"] == "JobSet" and job["apiVersion"] == JOBSET.api_version
    replicated, coordinator = job["spec"]["replicatedJobs"]
    job_spec = replicated["template"]["spec"]
    assert (replicated["replicas"], job_spec["parallelism"], job_spec["completions"]) == (1, 4, 4)
    assert job_spec["completionMode"] == "Indexed"
    # One pod template serves all four pods, so all of them carry the same endpoint.
    argv = _launcher_argv(job_spec["template"])
    assert argv[argv.index("--rdzv-endpoint") + 1] == "train-coordinator-0-0.train:29500"
    assert argv[argv.index("--nnodes") + 1] == "4" and argv[argv.index("--nproc-per-node") + 1] == "8"
    assert argv[-2:] == ["--store", "train-coordinator-0-0.train:29501"]
    assert job["spec"]["network"]["enableDNSHostnames"] is True
    _assert_coordinator(job, coordinator, launcher_argv=argv)

    container = job_spec["template"]["spec"]["containers"][0]
    for section in ("requests", "limits"):
        assert container["resources"][section]["nvidia.com/gpu"] == 8
        assert container["resources"][section]["vpc.amazonaws.com/efa"] == 32

    # Exit 93 -> the Job fails through its pod failure policy -> the JobSet fails, no restart.
    assert {"action": "FailJob", "onExitCodes": {"containerName": "trainer", "operator": "In", "values": [93]}} in (
        job_spec["podFailurePolicy"]["rules"]
    )
    assert job_spec["backoffLimit"] == 0
    assert job_spec["template"]["spec"]["restartPolicy"] == "Never"
    # The JobSet's answer, as its controller reads the rules (nvrx_eks/rehearse/jobset.py): exit 93
    # fails it; a pod the cluster disrupted restarts it without counting against maxRestarts.
    for disrupted, exit_code, answer in ((False, 93, "fail"), (True, 143, "restart-uncounted")):
        state = JobState(job_spec)
        state.pod_ended(1, exit_code, disrupted=disrupted)
        assert jobset_action(job["spec"], state.failure_reason, 0, state.failure_message) == answer
    # Other failures restart the whole set, up to the configured count.
    assert job["spec"]["failurePolicy"]["maxRestarts"] == 3
    assert job["spec"]["failurePolicy"]["restartStrategy"] == "Recreate"


@pytest.mark.parametrize("nodes", [1, 3, 16])
def test_pytorchjob_master_is_rendezvous_host_for_any_node_count(nodes):
    job = render_job(build_jobspec(resolve_config(), nodes=nodes, name="llm", api="pytorchjob")).job_document
    specs = job["spec"]["pytorchReplicaSpecs"]
    assert specs["Master"]["replicas"] == 1
    assert specs.get("Worker", {"replicas": 0})["replicas"] == nodes - 1
    for spec in specs.values():
        assert spec["restartPolicy"] == "ExitCode"
        argv = _launcher_argv(spec["template"])
        assert argv[argv.index("--rdzv-endpoint") + 1] == "llm-master-0:29500"
        container = spec["template"]["spec"]["containers"][0]
        assert container["name"] == "pytorch"
        assert {"name": "pytorchjob-port", "containerPort": 29500, "protocol": "TCP"} in container["ports"]
    assert job["spec"]["runPolicy"]["backoffLimit"] == 3
    # The coordinator is a sidecar of the master pod (an init container that keeps running), and of
    # no worker pod: it serves the endpoint every launcher joins.
    [sidecar] = specs["Master"]["template"]["spec"]["initContainers"]
    assert sidecar["name"] == "coordinator" and sidecar["restartPolicy"] == "Always"
    assert sidecar["args"][sidecar["args"].index("--rdzv-endpoint") + 1] == "llm-master-0:29500"
    assert "initContainers" not in specs.get("Worker", {"template": {"spec": {}}})["template"]["spec"]


def test_pytorchjob_entrypoint_keeps_93_and_makes_other_failures_retryable():
    """The training operator retries only 130/137/138/143 under restartPolicy ExitCode; the
    entrypoint keeps 93 permanent and maps other launcher failures to 138."""
    job = render_job(build_jobspec(resolve_config(), nodes=2, name="llm", api="pytorchjob")).job_document
    script = job["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0]["args"][2]
    assert "0|93|130|137|143) exit" in script
    assert "exit 138" in script
    # The wrapper survives SIGTERM (tini delivers it to the wrapper alone), passes it on to the
    # launcher and waits for it.
    assert 'kill -TERM "$launcher_pid"' in script and 'wait "$launcher_pid"' in script


def test_command_is_the_trainers_launch_command():
    train = TrainConfig.from_dict({"steps": 500, "checkpoint": {"finalize_timeout_s": 600}}, "test")
    spec = build_jobspec(resolve_config(), nodes=2, name="run1", train=train)
    pod = _pods(render_job(spec).job_document)[0]
    expected = build_ft_launcher_argv(
        spec.train,
        config_path=TRAIN_CONFIG_PATH,
        nnodes=2,
        nproc_per_node=8,
        rdzv_endpoint="run1-coordinator-0-0.run1:29500",
        rdzv_id="run1",
    )
    assert _launcher_argv(pod) == expected
    # The grace period follows the trainer's checkpoint finalize timeout.
    assert pod["spec"]["terminationGracePeriodSeconds"] == spec.train.recommended_termination_grace_period_s()
    assert pod["spec"]["terminationGracePeriodSeconds"] > 600


def test_configmap_carries_the_trainer_config_with_paths_on_fsx():
    train = TrainConfig.from_dict({"data": {"source": "memmap", "path": "datasets/tokens"}}, "test")
    rendered = render_job(build_jobspec(resolve_config(), nodes=2, name="run1", train=train))
    config_map = rendered.documents[0]
    assert config_map["kind"] == "ConfigMap" and config_map["metadata"]["name"] == "run1-config"
    import yaml

    loaded = TrainConfig.from_dict(yaml.safe_load(config_map["data"]["train.yaml"]), "configmap")
    assert loaded.run_dir == "/fsx/runs/run1"
    assert loaded.checkpoint_dir == "/fsx/runs/run1/checkpoints"
    assert loaded.data.path == "/fsx/datasets/tokens"


def test_fault_spec_passes_through_to_the_trainer(tmp_path):
    from nvrx_eks.jobs.spec import load_train_config

    train = load_train_config(None, ["steps=100"], "sigkill@20:3,hang@40:0")
    rendered = render_job(build_jobspec(resolve_config(), nodes=2, name="chaos", train=train))
    import yaml

    assert yaml.safe_load(rendered.documents[0]["data"]["train.yaml"])["faults"] == "sigkill@20:3,hang@40:0"


@pytest.mark.parametrize("profile", ["p5", "g5-smoke", "p5en"])
def test_pod_resources_and_scheduling_come_from_the_facts_table(profile):
    config = resolve_config(profile)
    facts = facts_for(config.gpu_nodes.instance_type)
    pod = _pods(render_job(build_jobspec(config, nodes=2, name="train")).job_document)[0]
    container = pod["spec"]["containers"][0]
    requests = container["resources"]["requests"]
    assert requests[conventions.GPU_RESOURCE] == facts.gpus
    assert requests[conventions.EFA_RESOURCE] == facts.efa_interfaces
    assert requests["cpu"] == facts.allocatable_vcpus
    assert requests["memory"] == f"{facts.allocatable_memory_gib}Gi"
    assert pod["spec"]["nodeSelector"] == {
        conventions.GPU_NODE_LABEL_KEY: conventions.GPU_NODE_LABEL_VALUE,
        conventions.INSTANCE_TYPE_LABEL_KEY: facts.instance_type,
    }
    assert {"key": conventions.GPU_TAINT_KEY, "operator": "Equal", "value": "present", "effect": "NoSchedule"} in (
        pod["spec"]["tolerations"]
    )
    assert "IPC_LOCK" in container["securityContext"]["capabilities"]["add"]
    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    assert volumes["dshm"]["emptyDir"] == {"medium": "Memory", "sizeLimit": f"{facts.allocatable_memory_gib // 2}Gi"}
    assert volumes["fsx"]["persistentVolumeClaim"]["claimName"] == conventions.FSX_PVC_NAME
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["FI_PROVIDER"] == "efa"
    # GPUDirect RDMA only where the EFA supports RDMA read (not on g5).
    assert env["FI_EFA_USE_DEVICE_RDMA"] == ("0" if facts.family == "g5" else "1")
    assert ("NCCL_BUFFSIZE" in env) == facts.family.startswith("p5")


def test_offline_render_uses_profile_image_or_a_placeholder():
    config = resolve_config()
    assert config.image.uri is None
    spec = build_jobspec(config, nodes=1, name="train")
    assert spec.image == OFFLINE_PLACEHOLDER_IMAGE and spec.image.startswith("localhost/")
    pinned = config.model_copy(
        update={"image": config.image.model_copy(update={"build": False, "uri": "r.example.com/t:1"})}
    )
    assert build_jobspec(pinned, nodes=1, name="train").image == "r.example.com/t:1"
    assert build_jobspec(config, nodes=1, name="train", image="r.example.com/t:2").image == "r.example.com/t:2"


def test_fabric_test_renders_nccl_tests_over_all_nodes():
    rendered = render_job(build_jobspec(resolve_config(), nodes=4, name="nccl-test", workload="nccl-test"))
    assert [d["kind"] for d in rendered.documents] == ["JobSet", "NetworkPolicy"]
    job = rendered.job_document
    pod = job["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]
    script = pod["spec"]["containers"][0]["command"][2]
    assert "-np 32 -N 8" in script and "all_reduce_perf -b 8 -e 16G" in script
    assert "nccl-test-worker-0-$node.nccl-test slots=8" in script
    assert "NET/OFI Selected provider is efa" in script
    assert job["spec"]["failurePolicy"]["maxRestarts"] == 0


@pytest.mark.parametrize(
    "kwargs, flag",
    [
        ({"name": "Train_1"}, "--name"),
        ({"name": "x" * 41}, "--name"),
        ({"nodes": 0}, "--nodes"),
        ({"image": "has space:1"}, "--image"),
        ({"api": "pytorchjob", "workload": "nccl-test"}, "job"),
    ],
)
def test_bad_job_options_name_the_flag(kwargs, flag):
    options = {"nodes": 2, "name": "train", **kwargs}
    with pytest.raises(ConfigError) as info:
        build_jobspec(resolve_config(), **options)
    assert f"  {flag}: " in str(info.value)


def test_templates_refuse_undefined_variables():
    with pytest.raises(jinja2.UndefinedError):
        _ENV.get_template("trainer-configmap.yaml.j2").render(job=None)
