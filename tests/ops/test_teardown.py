"""teardown against moto and the loopback Kubernetes API: jobs, then the claim, then
`cdk destroy` (an injected runner), then the orphan sweep; data kept unless --delete-data;
nothing deleted without confirmation."""

from __future__ import annotations

import boto3
import pytest
from rich.console import Console

from infra.config import resolve_config
from nvrx_eks.deploy.deployment import load_deployment
from nvrx_eks.facts.errors import ConfigError
from nvrx_eks.facts.job_kinds import JOBSET
from nvrx_eks.facts.names import DEPLOYMENT_TAG_KEY
from nvrx_eks.jobs.render import render_job
from nvrx_eks.jobs.spec import build_jobspec
from nvrx_eks.ops.teardown import teardown
from tests.support import cli_harness
from tests.support.aws_gaps import PlacementGroups, ServiceGaps
from tests.support.cli_harness import REGION, add_fsx_volume, add_job_pods, deploy_fake_environment, run_cli

aws = cli_harness.aws
k8s_server = cli_harness.k8s_server

DATA_BUCKET = "nvrx-eks-storage-databucket-1a2b3c"
LOG_BUCKET = "nvrx-eks-storage-accesslogbucket-4d5e6f"
OURS = [{"Key": DEPLOYMENT_TAG_KEY, "Value": "nvrx-eks"}]


class FakeCdk:
    """Stands in for `cdk destroy`: records the command and deletes the stacks as CloudFormation
    would, after checking the Kubernetes side was emptied first."""

    def __init__(self, server=None, status: int = 0):
        self.server, self.status, self.calls = server, status, []

    def __call__(self, argv: list[str]) -> int:
        self.calls.append(argv)
        if self.server is not None:
            assert self.server.list(JOBSET.api_version, JOBSET.plural) == []
            assert self.server.list("v1", "pods") == []
            assert self.server.list("v1", "persistentvolumeclaims") == []
            assert self.server.list("v1", "persistentvolumes") == []
        if self.status == 0:
            cfn = boto3.client("cloudformation", region_name=REGION)
            for role in ("cluster", "storage", "network"):
                cfn.delete_stack(StackName=f"nvrx-eks-{role}")
        return self.status


class Leftovers:
    """What a real deployment leaves behind after `cdk destroy`, plus look-alikes that are not
    ours and must survive."""

    def __init__(self, session: boto3.Session):
        ec2 = boto3.client("ec2", region_name=REGION)
        vpc = ec2.create_vpc(CidrBlock="10.0.0.0/16")["Vpc"]["VpcId"]
        subnet = ec2.create_subnet(VpcId=vpc, CidrBlock="10.0.0.0/24", AvailabilityZone="us-east-1a")["Subnet"][
            "SubnetId"
        ]

        def eni(tags):
            spec = [{"ResourceType": "network-interface", "Tags": tags}] if tags else []
            return ec2.create_network_interface(SubnetId=subnet, TagSpecifications=spec)["NetworkInterface"][
                "NetworkInterfaceId"
            ]

        self.efa_eni = eni(OURS)
        self.cni_eni = eni([{"Key": "cluster.k8s.amazonaws.com/name", "Value": "nvrx-eks"}])
        self.foreign_eni = eni([{"Key": "cluster.k8s.amazonaws.com/name", "Value": "someone-else"}])

        def group(name, tags):
            return ec2.create_security_group(
                GroupName=name,
                Description=name,
                VpcId=vpc,
                TagSpecifications=[{"ResourceType": "security-group", "Tags": tags}],
            )["GroupId"]

        self.cluster_sg = group("eks-cluster-sg-nvrx-eks", [{"Key": "aws:eks:cluster-name", "Value": "nvrx-eks"}])
        self.foreign_sg = group("eks-cluster-sg-other", [{"Key": "aws:eks:cluster-name", "Value": "other"}])

        self.volume = ec2.create_volume(
            Size=500, AvailabilityZone="us-east-1a", TagSpecifications=[{"ResourceType": "volume", "Tags": OURS}]
        )["VolumeId"]

        self.placement_groups = PlacementGroups(
            [
                {
                    "GroupName": "nvrx-eks-cluster-PlacementGroup-1X",
                    "Strategy": "cluster",
                    "State": "available",
                    "Tags": OURS,
                },
                {"GroupName": "unrelated", "Strategy": "spread", "State": "available", "Tags": []},
            ]
        )
        self.gaps = ServiceGaps(session)
        self.placement_groups.install(self.gaps)

        logs = boto3.client("logs", region_name=REGION)
        logs.create_log_group(logGroupName="/aws/eks/nvrx-eks/cluster")
        logs.create_log_group(logGroupName="/aws/containerinsights/nvrx-eks/performance")
        logs.create_log_group(logGroupName="/aws/eks/nvrx-eks-other/cluster")

        fsx = boto3.client("fsx", region_name=REGION)
        self.file_system = fsx.create_file_system(
            FileSystemType="LUSTRE", StorageCapacity=4800, SubnetIds=[subnet], Tags=OURS
        )["FileSystem"]["FileSystemId"]
        self.backup = fsx.create_backup(FileSystemId=self.file_system, Tags=OURS)["Backup"]["BackupId"]

        s3 = boto3.client("s3", region_name=REGION)
        for bucket in (DATA_BUCKET, LOG_BUCKET, "unrelated-bucket"):
            s3.create_bucket(Bucket=bucket)
        s3.put_bucket_versioning(Bucket=DATA_BUCKET, VersioningConfiguration={"Status": "Enabled"})
        for body in (b"v1", b"v2"):
            s3.put_object(Bucket=DATA_BUCKET, Key="checkpoints/step_100/.metadata", Body=body)
        s3.delete_object(Bucket=DATA_BUCKET, Key="checkpoints/step_100/.metadata")  # leaves a delete marker
        s3.put_bucket_tagging(Bucket=LOG_BUCKET, Tagging={"TagSet": OURS})

    # -- what is still there --

    def enis(self) -> set[str]:
        return {
            e["NetworkInterfaceId"]
            for e in boto3.client("ec2", region_name=REGION).describe_network_interfaces()["NetworkInterfaces"]
        }

    def security_groups(self) -> set[str]:
        return {
            g["GroupId"] for g in boto3.client("ec2", region_name=REGION).describe_security_groups()["SecurityGroups"]
        }

    def log_groups(self) -> set[str]:
        return {g["logGroupName"] for g in boto3.client("logs", region_name=REGION).describe_log_groups()["logGroups"]}

    def buckets(self) -> set[str]:
        return {b["Name"] for b in boto3.client("s3", region_name=REGION).list_buckets()["Buckets"]}

    def file_systems(self) -> dict[str, str]:
        fsx = boto3.client("fsx", region_name=REGION)
        return {f["FileSystemId"]: f.get("Lifecycle", "") for f in fsx.describe_file_systems()["FileSystems"]}

    def backups(self) -> set[str]:
        return {b["BackupId"] for b in boto3.client("fsx", region_name=REGION).describe_backups()["Backups"]}


@pytest.fixture
def deployed(aws, k8s_server):
    """A deployment with a running 2-node job whose pods mount the FSx claim."""
    deploy_fake_environment(k8s_server.url)
    add_fsx_volume(k8s_server)
    # What `submit` leaves in the cluster (submit itself is tested in test_cli_jobs.py).
    for document in render_job(build_jobspec(resolve_config(), nodes=2, name="train")).documents:
        k8s_server.add(document)
    add_job_pods(k8s_server, "train", 2)
    session = boto3.Session(region_name=REGION)
    return k8s_server, session, Leftovers(session)


def _teardown(session, **kwargs):
    options = {
        "yes": True,
        "delete_data": False,
        "console": Console(width=200),
        "confirm": lambda _q: False,
        "poll_s": 0.01,
        "timeout_s": 5,
    }
    options.update(kwargs)
    return teardown(load_deployment(), session=session, **options)


def test_nothing_is_deleted_without_confirmation(deployed):
    server, session, left = deployed
    cdk = FakeCdk()
    questions = []
    result = _teardown(session, yes=False, confirm=lambda q: questions.append(q) or False, run_cdk=cdk)
    assert result.aborted and questions == ["Proceed with the teardown?"]
    assert cdk.calls == []
    assert server.get(JOBSET.api_version, JOBSET.plural, "training", "train") is not None
    assert left.efa_eni in left.enis() and left.backup in left.backups()


def test_teardown_in_order_sweeps_orphans_and_keeps_data(deployed):
    server, session, left = deployed
    cdk = FakeCdk(server)
    result = _teardown(session, run_cdk=cdk)

    assert result.jobs_deleted == ["JobSet/train"]
    assert cdk.calls[0][1:] == ["destroy", "--all", "--force", "--no-notices", "-c", "profile=p5"]
    assert cdk.calls[0][0].endswith("node_modules/.bin/cdk")
    assert result.stacks_destroyed == ["nvrx-eks-network", "nvrx-eks-storage", "nvrx-eks-cluster"]

    outcomes = {(o.kind, o.identifier): o.outcome for o in result.orphans}
    assert outcomes == {
        ("network interface", left.cni_eni): "deleted",
        ("network interface", left.efa_eni): "deleted",
        ("security group", left.cluster_sg): "deleted",
        ("placement group", "nvrx-eks-cluster-PlacementGroup-1X"): "deleted",
        ("EBS volume", left.volume): "deleted",
        # The control-plane log group holds the audit log: data, kept like the FSx backups.
        ("log group", "/aws/eks/nvrx-eks/cluster"): "kept (control-plane and audit logs; --delete-data deletes it)",
        ("log group", "/aws/containerinsights/nvrx-eks/performance"): "deleted",
        ("FSx backup", left.backup): "kept (data; --delete-data deletes it)",
    }
    # Gone: ours. Still there: the look-alikes, and all data.
    assert left.enis() == {left.foreign_eni}
    assert left.foreign_sg in left.security_groups() and left.cluster_sg not in left.security_groups()
    assert [g["GroupName"] for g in left.placement_groups.groups] == ["unrelated"]
    assert left.log_groups() == {"/aws/eks/nvrx-eks/cluster", "/aws/eks/nvrx-eks-other/cluster"}
    assert {DATA_BUCKET, LOG_BUCKET} <= left.buckets()
    assert left.file_system in left.file_systems()
    assert left.backup in left.backups()
    assert sorted(result.data_kept.buckets) == sorted([DATA_BUCKET, LOG_BUCKET])
    assert result.data_kept.file_systems == [left.file_system]


def test_delete_data_removes_buckets_file_system_and_backups(deployed):
    server, session, left = deployed
    result = _teardown(session, delete_data=True, run_cdk=FakeCdk(server))
    assert {DATA_BUCKET, LOG_BUCKET}.isdisjoint(left.buckets()) and "unrelated-bucket" in left.buckets()
    assert sorted(result.data_deleted.buckets) == sorted([DATA_BUCKET, LOG_BUCKET])
    assert result.data_deleted.file_systems == [left.file_system]
    assert left.file_systems().get(left.file_system) in (None, "DELETING")
    assert left.backup not in left.backups()
    assert left.log_groups() == {"/aws/eks/nvrx-eks-other/cluster"}


def test_profile_that_destroys_data_needs_delete_data(aws, k8s_server):
    deploy_fake_environment(k8s_server.url, profile="g5-smoke")
    cdk = FakeCdk()
    with pytest.raises(ConfigError, match="fsx.removal_policy: destroy.*--delete-data"):
        teardown(
            load_deployment("g5-smoke"),
            yes=True,
            delete_data=False,
            console=Console(),
            confirm=lambda _q: True,
            run_cdk=cdk,
            session=boto3.Session(region_name=REGION),
        )
    assert cdk.calls == []


def test_failed_cdk_destroy_stops_before_the_sweep(deployed):
    server, session, left = deployed
    with pytest.raises(ConfigError, match=r"cdk destroy failed \(exit 1\).*run teardown again"):
        _teardown(session, run_cdk=FakeCdk(server, status=1))
    assert left.efa_eni in left.enis()


def test_second_run_after_the_stacks_are_gone_only_sweeps(deployed):
    server, session, left = deployed
    _teardown(session, run_cdk=FakeCdk(server))
    # The first run kept the control-plane log group; the second keeps it too.
    cdk = FakeCdk()
    result = _teardown(session, run_cdk=cdk)
    assert cdk.calls == [] and result.stacks_destroyed == [] and result.jobs_deleted == []
    assert [(o.kind, o.outcome) for o in result.orphans if o.kind == "log group"] == [
        ("log group", "kept (control-plane and audit logs; --delete-data deletes it)")
    ]
    assert "/aws/eks/nvrx-eks/cluster" in left.log_groups()


def test_claim_still_in_use_times_out_with_a_hint(deployed):
    server, session, _ = deployed
    # A pod outside any job keeps the claim mounted.
    server.add(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "debug-shell", "namespace": "training"},
            "spec": {
                "containers": [{"name": "sh", "image": "busybox:1.36"}],
                "volumes": [{"name": "fsx", "persistentVolumeClaim": {"claimName": "fsx-lustre"}}],
            },
        }
    )
    cdk = FakeCdk()
    with pytest.raises(ConfigError, match="PersistentVolumeClaim fsx-lustre still exists .* a pod still uses it"):
        _teardown(session, run_cdk=cdk, timeout_s=0.5)
    assert cdk.calls == []


def test_cli_teardown_asks_and_aborts(deployed):
    server, _, left = deployed
    result = run_cli("teardown", stdin="n\n")
    assert result.code == 1
    assert "Proceed with the teardown?" in result.stdout and "aborted; nothing was deleted" in result.stdout
    assert server.get(JOBSET.api_version, JOBSET.plural, "training", "train") is not None
    assert left.efa_eni in left.enis()


def test_cli_teardown_yes_runs_cdk_through_the_runner(deployed, monkeypatch):
    server, session, left = deployed
    import nvrx_eks.ops.teardown as teardown_module

    cdk = FakeCdk(server)
    monkeypatch.setattr(teardown_module, "run_command", cdk)
    real_session = boto3.Session

    def session_with_gaps(*args, **kwargs):
        new = real_session(*args, **kwargs)
        left.placement_groups.install(ServiceGaps(new))
        return new

    monkeypatch.setattr(boto3, "Session", session_with_gaps)
    result = run_cli("teardown", "--yes")
    assert result.code == 0, result.output
    assert len(cdk.calls) == 1
    assert "still billed" in result.stdout and DATA_BUCKET in result.stdout
