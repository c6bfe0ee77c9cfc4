"""The job commands end to end: the real CLI entry point, stack outputs from moto's
CloudFormation, an EKS token signed with boto3, and the loopback Kubernetes API test server."""

from __future__ import annotations

import base64
import re
import subprocess
import sys
import threading
import time
from urllib.parse import parse_qs, urlsplit

import pytest
import yaml

from nvrx_eks.facts.job_kinds import JOBSET, PYTORCHJOB
from nvrx_eks.facts.stack_outputs import OutputKey
from tests.support import REPO_ROOT, cli_harness
from tests.support.cli_harness import (
    DEPLOYED_IMAGE,
    add_fsx_volume,
    add_job_pods,
    create_stack,
    deploy_fake_environment,
    run_cli,
)
from tests.support.profiles import profile_file

# Fixtures shared with the other CLI test modules.
aws = cli_harness.aws
no_credentials = cli_harness.no_credentials
k8s_server = cli_harness.k8s_server

ROOT = REPO_ROOT
JOBSETS = f"/apis/{JOBSET.api_version}/namespaces/training/{JOBSET.plural}"
CONFIGMAPS = "/api/v1/namespaces/training/configmaps"
NETWORK_POLICIES = "/apis/networking.k8s.io/v1/namespaces/training/networkpolicies"


# ----- offline: render, validate, submit --dry-run -----------------------------------------


@pytest.mark.parametrize("api", ["jobset", "pytorchjob"])
def test_render_four_nodes_passes_validate(api, tmp_path):
    """Acceptance 1: `render --nodes 4` (and the PyTorchJob variant) passes `validate`, on the
    default profile sized for 4 nodes (as shipped it holds 2: tests/unit/jobs/test_node_capacity.py)."""
    config = str(profile_file(tmp_path, gpu_nodes__max_size=4, gpu_nodes__desired_size=4))
    rendered = run_cli("render", "--config", config, "--nodes", "4", "--api", api)
    assert rendered.code == 0, rendered.output
    kinds = [d["kind"] for d in yaml.safe_load_all(rendered.stdout)]
    assert kinds == ["ConfigMap", "JobSet" if api == "jobset" else "PyTorchJob", "NetworkPolicy"]
    validated = run_cli("validate", "--config", config, "-", stdin=rendered.stdout)
    assert validated.code == 0, validated.output
    assert "checked (kubernetes, project, crd): valid" in validated.stdout


def test_render_to_a_directory_writes_one_file_per_object(tmp_path):
    result = run_cli("render", "--nodes", "2", "--out", str(tmp_path / "out"))
    assert result.code == 0, result.output
    files = sorted(p.name for p in (tmp_path / "out").iterdir())
    assert files == ["configmap-train-config.yaml", "jobset-train.yaml", "networkpolicy-train.yaml"]
    combined = "---\n".join((tmp_path / "out" / f).read_text() for f in files)
    assert run_cli("validate", "-", stdin=combined).code == 0


def test_validate_reports_a_broken_file_with_field_paths(tmp_path):
    text = run_cli("render", "--nodes", "2").stdout.replace("vpc.amazonaws.com/efa: 32", "vpc.amazonaws.com/efa: 8")
    path = tmp_path / "broken.yaml"
    path.write_text(text)
    result = run_cli("validate", str(path))
    assert result.code == 2
    assert "2 error(s)" in result.stdout  # requests and limits
    assert "failed validation" in result.stderr
    assert 'limits["vpc.amazonaws.com/efa"]' in result.stderr and 'requests["vpc.amazonaws.com/efa"]' in result.stderr
    assert "Traceback" not in result.output


def test_submit_dry_run_needs_no_cluster_and_no_credentials(no_credentials, monkeypatch):
    import nvrx_eks.jobs.commands as job_commands

    def no_aws(*_args, **_kwargs):
        raise AssertionError("submit --dry-run must not read stack outputs")

    monkeypatch.setattr(job_commands, "read_stack_outputs", no_aws)
    monkeypatch.setattr(job_commands, "connect", no_aws)
    result = run_cli("submit", "--dry-run", "--nodes", "2", "--faults", "sigkill@20:3")
    assert result.code == 0, result.output
    documents = list(yaml.safe_load_all(result.stdout))
    assert [d["kind"] for d in documents] == ["ConfigMap", "JobSet", "NetworkPolicy"]
    assert "sigkill@20:3" in documents[0]["data"]["train.yaml"]
    assert "nothing was sent to a cluster" in result.stderr


def test_fabric_test_renders_and_validates():
    result = run_cli("render", "--fabric-test", "--nodes", "2", "--image", "example.com/nccl-tests:2.16.9")
    assert result.code == 0, result.output
    assert run_cli("validate", "-", stdin=result.stdout).code == 0


# ----- user mistakes: exit 2, one message, no traceback ------------------------------------


@pytest.mark.parametrize(
    "args, message",
    [
        (["render", "--api", "mpijob"], "--api 'mpijob': use jobset (default) or pytorchjob"),
        (["render", "--name", "Train"], "--name: 'Train' must be lower-case"),
        (["render", "--name", ""], "--name: '' must be lower-case"),  # not silently the default
        (["render", "--nodes", "two"], "Invalid value for '--nodes'"),
        (["render", "--train-config", "no-such.yaml"], "--train-config no-such.yaml does not exist"),
        (["render", "--set", "checkpoint.intervall_steps=3"], "checkpoint.intervall_steps: unknown field"),
        (["render", "--faults", "explode@3"], "fault 'explode@3'"),
        (["render", "--fabric-test", "--faults", "sigkill@3"], "--fabric-test runs nccl-tests"),
        (["render", "--profile", "p6"], "unknown profile 'p6'"),
        (["validate", "no-such.yaml"], "no-such.yaml does not exist"),
        (["logs", "train", "--node", "0", "--rank", "1"], "give either --node or --rank"),
    ],
)
def test_bad_flags_exit_2_with_a_message(args, message, no_credentials):
    result = run_cli(*args)
    assert result.code == 2, result.output
    assert message in result.stderr
    assert "Traceback" not in result.output


def test_console_script_exit_code_and_no_traceback():
    """The installed entry point, in a fresh process: the exit code a shell sees."""
    result = subprocess.run(
        [sys.executable, "-m", "nvrx_eks.cli", "render", "--api", "nope"], cwd=ROOT, capture_output=True, text=True
    )
    assert result.returncode == 2
    assert "error:" in result.stderr and "Traceback" not in result.stderr


def test_submit_without_credentials_exits_2(no_credentials):
    result = run_cli("submit", "--nodes", "2")
    assert result.code == 2
    assert "no AWS credentials found" in result.stderr and "Traceback" not in result.output


def test_commands_without_a_stack_tell_the_user_to_deploy(aws):
    for args in (["submit"], ["status", "train"], ["logs", "train"], ["delete", "train"], ["kubeconfig"]):
        result = run_cli(*args)
        assert result.code == 2, args
        assert "stack nvrx-eks-cluster does not exist" in result.stderr
        assert "deploy it first with `nvrx-eks deploy`" in result.stderr


def test_stack_without_an_output_asks_for_a_redeploy(aws, k8s_server):
    deploy_fake_environment(k8s_server.url)
    import boto3

    boto3.client("cloudformation").delete_stack(StackName="nvrx-eks-cluster")
    outputs = {k: v for k, v in _outputs(k8s_server.url).items() if k != OutputKey.IMAGE_URI.value}
    create_stack("nvrx-eks-cluster", outputs)
    result = run_cli("status", "train")
    assert result.code == 2
    assert "lacks the outputs TrainerImageUri" in result.stderr


def _outputs(endpoint):
    from tests.support.cli_harness import cluster_outputs

    return cluster_outputs(endpoint)


def test_unreachable_cluster_exits_2(aws):
    deploy_fake_environment("http://127.0.0.1:9")  # discard port: nothing listens
    result = run_cli("status", "train")
    assert result.code == 2
    assert "cannot reach the Kubernetes API" in result.stderr and "Traceback" not in result.output


# ----- live: submit, status, logs, delete against the test API server ----------------------


cluster = cli_harness.deployed_cluster


def test_submit_dry_runs_on_the_server_then_creates(cluster):
    result = run_cli("submit", "--nodes", "2")
    assert result.code == 0, result.output
    assert "created JobSet train in training" in result.stderr

    posts = [r for r in cluster.requests if r.method == "POST"]
    # The NetworkPolicy first: no pod of the job may start reachable from the whole cluster.
    assert [(r.path, r.param("dryRun")) for r in posts] == [
        (NETWORK_POLICIES, "All"),
        (CONFIGMAPS, "All"),
        (JOBSETS, "All"),
        (NETWORK_POLICIES, None),
        (CONFIGMAPS, None),
        (JOBSETS, None),
    ]
    assert all(r.param("fieldValidation") == "Strict" for r in posts)

    jobset = cluster.get(JOBSET.api_version, JOBSET.plural, "training", "train")
    container = jobset["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]["containers"][0]
    assert container["image"] == DEPLOYED_IMAGE  # live submit takes the image from the stack
    config_map = cluster.get("v1", "configmaps", "training", "train-config")
    assert config_map["metadata"]["ownerReferences"][0]["uid"] == jobset["metadata"]["uid"]
    policy = cluster.get("networking.k8s.io/v1", "networkpolicies", "training", "train")
    assert policy["metadata"]["ownerReferences"][0]["uid"] == jobset["metadata"]["uid"]


def test_requests_carry_an_eks_token_signed_for_the_cluster(cluster):
    assert run_cli("submit", "--nodes", "2").code == 0
    header = cluster.requests[0].headers["authorization"]
    assert header.startswith("Bearer k8s-aws-v1.")
    encoded = header.removeprefix("Bearer k8s-aws-v1.")
    url = base64.urlsafe_b64decode(encoded + "=" * (-len(encoded) % 4)).decode()
    parts = urlsplit(url)
    query = parse_qs(parts.query)
    assert parts.netloc == "sts.us-east-1.amazonaws.com"
    assert query["Action"] == ["GetCallerIdentity"]
    assert "x-k8s-aws-id" in query["X-Amz-SignedHeaders"][0].split(";")
    assert query["X-Amz-Expires"] == ["60"]


def test_submit_refused_by_the_server_dry_run_creates_nothing(cluster):
    cluster.inject_error(
        "POST", JOBSETS, 422, "Invalid", f'JobSet.{JOBSET.group} "train" is invalid: denied by webhook'
    )
    result = run_cli("submit", "--nodes", "2")
    assert result.code == 2
    assert "denied by webhook" in result.stderr and "dry-run creating JobSet train" in result.stderr
    assert [r.param("dryRun") for r in cluster.requests if r.method == "POST"] == ["All", "All", "All"]
    assert cluster.list("v1", "configmaps") == [] and cluster.list(JOBSET.api_version, JOBSET.plural) == []
    assert cluster.list("networking.k8s.io/v1", "networkpolicies") == []


def test_failed_job_creation_rolls_back_the_configmap(cluster):
    cluster.inject_error("POST", JOBSETS, 500, "InternalError", "etcdserver: request timed out", dry_run=None)
    result = run_cli("submit", "--nodes", "2")
    assert result.code == 2
    assert "etcdserver: request timed out" in result.stderr
    assert cluster.requests_to("DELETE", f"{CONFIGMAPS}/train-config")
    assert cluster.list("v1", "configmaps") == []
    assert cluster.list("networking.k8s.io/v1", "networkpolicies") == []


def test_submit_refuses_an_existing_job(cluster):
    assert run_cli("submit", "--nodes", "2").code == 0
    result = run_cli("submit", "--nodes", "2")
    assert result.code == 2
    assert "JobSet 'train' already exists" in result.stderr and "nvrx-eks delete train" in result.stderr


def test_submit_without_the_jobset_controller(cluster):
    cluster.installed.clear()
    result = run_cli("submit", "--nodes", "2")
    assert result.code == 2
    assert "does not serve JobSet" in result.stderr
    assert not [r for r in cluster.requests if r.method == "POST"]


def test_pytorchjob_needs_the_training_operator(cluster):
    result = run_cli("submit", "--nodes", "2", "--api", "pytorchjob")
    assert result.code == 2
    assert "install_training_operator: true" in result.stderr
    cluster.installed.add(PYTORCHJOB.api_version)
    assert run_cli("submit", "--nodes", "2", "--api", "pytorchjob").code == 0
    assert cluster.get(PYTORCHJOB.api_version, PYTORCHJOB.plural, "training", "train") is not None


def test_forbidden_identity_gets_the_access_entry_hint(cluster):
    cluster.inject_error("GET", f"/apis/{JOBSET.api_version}$", 403, "Forbidden", "User cannot get resource")
    result = run_cli("submit", "--nodes", "2")
    assert result.code == 2 and "EKS access entry" in result.stderr


def test_unauthenticated_identity_is_told_the_access_entry_is_the_likely_cause(cluster):
    """(first-contact 1) EKS answers 401 to a valid token whose principal no access entry names."""
    cluster.inject_error("GET", f"/apis/{JOBSET.api_version}$", 401, "Unauthorized", "Unauthorized")
    result = run_cli("submit", "--nodes", "2")
    message = " ".join(result.stderr.split())
    assert result.code == 2 and "most likely no EKS access entry names it" in message
    assert "admin_principal_arn" in message and "aws sts get-caller-identity" in message


def test_status_shows_phase_pods_and_restarts_per_layer(cluster):
    assert run_cli("submit", "--nodes", "2").code == 0
    jobset = cluster.objects[(JOBSET.api_version, JOBSET.plural, "training", "train")]
    jobset["status"] = {"restarts": 2, "conditions": []}
    add_job_pods(cluster, "train", 2, restart_attempt=2)
    result = run_cli("status", "train")
    assert result.code == 0, result.output
    assert "JobSet train: Running" in result.stdout
    assert "2 of 3" in result.stdout  # Kubernetes-layer restarts of maxRestarts
    assert "train-worker-0-0-x2" in result.stdout and "train-worker-0-1-x2" in result.stdout
    assert "ft_launcher" in result.stdout and "in-process" in result.stdout


def test_status_shows_active_spare_and_lost_nodes_with_hot_spares(aws, k8s_server, tmp_path):
    """3 active + 1 spare node; node 1's pod failed: node 2 and 3 move up (ranks 8-15, 16-23), no
    spare is left, and the pods of an earlier attempt get no role."""
    path = profile_file(tmp_path, gpu_nodes__max_size=4, gpu_nodes__desired_size=4)
    config = str(path)
    deploy_fake_environment(k8s_server.url, path)
    add_fsx_volume(k8s_server)
    cluster = k8s_server
    # 3 active nodes do not divide the default job's 2 Mi-token global batch: give one they do.
    three_nodes = ("--set", f"data.global_batch_tokens={3 * 8 * 2 * 8192 * 8}")
    assert run_cli("submit", "--config", config, "--nodes", "3", "--spare-nodes", "1", *three_nodes).code == 0
    jobset = cluster.objects[(JOBSET.api_version, JOBSET.plural, "training", "train")]
    jobset["status"] = {"restarts": 1, "conditions": []}
    add_job_pods(cluster, "train", 1, restart_attempt=0, phase="Failed", exit_code=1)  # old attempt
    add_job_pods(cluster, "train", 4, restart_attempt=1)
    failed = cluster.objects[("v1", "pods", "training", "train-worker-0-1-x1")]
    failed["status"]["phase"] = "Failed"
    result = run_cli("status", "--config", config, "train")
    assert result.code == 0, result.output
    assert "Nodes (hot spares): active 0, 2, 3; spare none; lost 1" in result.stdout
    pod = re.compile(r"train-worker-0-\d-x\d")
    rows = {m.group(): line for line in result.stdout.splitlines() if (m := pod.search(line))}
    assert "active, ranks 0-7" in rows["train-worker-0-0-x1"]
    assert "lost" in rows["train-worker-0-1-x1"]
    assert "active, ranks 8-15" in rows["train-worker-0-2-x1"]
    assert "active, ranks 16-23" in rows["train-worker-0-3-x1"]
    assert "active" not in rows["train-worker-0-0-x0"] and "lost" not in rows["train-worker-0-0-x0"]


def test_status_without_spares_has_no_role_column(cluster):
    assert run_cli("submit", "--nodes", "2").code == 0
    add_job_pods(cluster, "train", 2)
    result = run_cli("status", "train")
    assert result.code == 0 and "hot spares" not in result.stdout and "role" not in result.stdout


def test_status_reports_a_failed_job_with_exit_93(cluster):
    assert run_cli("submit", "--nodes", "2").code == 0
    jobset = cluster.objects[(JOBSET.api_version, JOBSET.plural, "training", "train")]
    jobset["status"] = {
        "restarts": 0,
        "conditions": [
            {
                "type": "Failed",
                "status": "True",
                "reason": "FailedJobs",
                "message": "jobset failed due to FailJobSet rule",
            }
        ],
    }
    add_job_pods(cluster, "train", 2, phase="Failed", exit_code=93)
    result = run_cli("status", "train")
    assert "JobSet train: Failed" in result.stdout and "93 (Error)" in result.stdout


def test_status_without_a_name_lists_jobs(cluster):
    assert run_cli("submit", "--nodes", "2", "--name", "first").code == 0
    assert run_cli("submit", "--nodes", "2", "--name", "second").code == 0
    result = run_cli("status")
    assert result.code == 0 and "first" in result.stdout and "second" in result.stdout


def test_logs_of_all_nodes_one_node_and_one_rank(cluster):
    assert run_cli("submit", "--nodes", "2").code == 0
    pods = add_job_pods(cluster, "train", 2)
    cluster.set_log("training", pods[0], ["launcher: starting 8 ranks", "[rank0] step 10 loss 2.1"])
    cluster.set_log("training", pods[1], ["launcher: starting 8 ranks", "[rank9] step 10 loss 2.1"])

    everything = run_cli("logs", "train")
    assert everything.code == 0, everything.output
    assert "node0 | [rank0] step 10" in everything.stdout and "node1 | [rank9] step 10" in everything.stdout

    one_node = run_cli("logs", "train", "--node", "1")
    assert one_node.stdout.splitlines() == ["launcher: starting 8 ranks", "[rank9] step 10 loss 2.1"]

    one_rank = run_cli("logs", "train", "--rank", "9")
    assert one_rank.stdout.splitlines() == ["[rank9] step 10 loss 2.1"]

    missing = run_cli("logs", "train", "--node", "5")
    assert missing.code == 2 and "node 5 does not exist" in missing.stderr


def test_logs_follow_streams_until_the_pod_ends(cluster):
    assert run_cli("submit", "--nodes", "1").code == 0
    [pod] = add_job_pods(cluster, "train", 1)
    cluster.set_log("training", pod, ["[rank0] step 1"])

    def training_goes_on():
        # Once the client is streaming: one more line, then the pod ends.
        deadline = time.monotonic() + 60
        while not cluster.requests_to("GET", "/log") and time.monotonic() < deadline:
            time.sleep(0.02)
        time.sleep(0.2)
        cluster.append_log("training", pod, "[rank0] step 2")
        time.sleep(0.2)
        cluster.objects.pop(("v1", "pods", "training", pod))

    threading.Thread(target=training_goes_on, daemon=True).start()
    result = run_cli("logs", "train", "-f")
    assert result.code == 0
    assert result.stdout.splitlines() == ["[rank0] step 1", "[rank0] step 2"]
    assert cluster.requests_to("GET", "/log")[0].param("follow").lower() == "true"


def test_delete_removes_the_job_its_config_and_pods(cluster):
    assert run_cli("submit", "--nodes", "2").code == 0
    add_job_pods(cluster, "train", 2)
    result = run_cli("delete", "train", "--wait")
    assert result.code == 0, result.output
    assert "deleted JobSet train and its pods" in result.stdout
    delete = cluster.requests_to("DELETE", f"{JOBSETS}/train")[0]
    assert delete.body["propagationPolicy"] == "Foreground"
    assert cluster.list(JOBSET.api_version, JOBSET.plural) == []
    assert cluster.list("v1", "configmaps") == [] and cluster.list("v1", "pods") == []
    assert cluster.list("networking.k8s.io/v1", "networkpolicies") == []
    # The claim (checkpoints, data) is untouched.
    assert cluster.get("v1", "persistentvolumeclaims", "training", "fsx-lustre") is not None


def test_delete_of_an_unknown_job(cluster):
    result = run_cli("delete", "nope")
    assert result.code == 2 and "no training job named 'nope'" in result.stderr


def test_token_and_kubeconfig(cluster):
    import json

    token = run_cli("token")
    assert token.code == 0
    credential = json.loads(token.stdout)
    assert credential["kind"] == "ExecCredential" and credential["status"]["token"].startswith("k8s-aws-v1.")
    kubeconfig = yaml.safe_load(run_cli("kubeconfig").stdout)
    assert kubeconfig["clusters"][0]["cluster"]["server"] == cluster.url
    assert kubeconfig["users"][0]["user"]["exec"]["command"] == "nvrx-eks"
    assert kubeconfig["contexts"][0]["context"]["namespace"] == "training"


@pytest.mark.parametrize(
    "data, rendered_path",
    [("s3://any-bucket/data/corpus-v1", "/fsx/s3/corpus-v1"), ("s3/corpus-v1", "/fsx/s3/corpus-v1")],
)
def test_data_in_the_data_bucket_maps_to_where_the_pods_read_it(data, rendered_path):
    """Offline the bucket's name is unknown, so any bucket maps; a live submit compares it with
    the stack's data bucket."""
    result = run_cli("render", "--data", data)
    assert result.code == 0, result.stderr
    train = next(
        yaml.safe_load(d["data"]["train.yaml"])
        for d in yaml.safe_load_all(result.stdout)
        if d and d.get("kind") == "ConfigMap"
    )
    assert train["data"]["path"] == rendered_path


@pytest.mark.parametrize(
    "data, message",
    [
        ("gs://bucket/data/x", "--data: gs://bucket/data/x is not where the pods can read it"),
        ("/etc/x", "--data: /etc/x is not where the pods can read it"),
        ("s3://bucket/other/x", "prefix 'other/x' is outside 'data/'"),
    ],
)
def test_data_the_pods_cannot_read_is_refused_with_the_fix(data, message):
    result = run_cli("render", "--data", data)
    assert result.code == 2 and message in result.stderr and "Traceback" not in result.output


@pytest.mark.parametrize(
    "faults, message",
    [
        ("exception@5:999", "--faults: exception@5:999 targets rank 999, but --nodes 2 gives 16 active ranks"),
        ("node-loss@5:2", "--faults: node-loss@5:2 targets node 2, but --nodes 2 gives 2 active nodes"),
    ],
)
def test_faults_outside_the_rendered_world_are_refused(faults, message):
    result = run_cli("render", "--faults", faults)
    assert result.code == 2 and message in result.stderr
