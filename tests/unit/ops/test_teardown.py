"""teardown against moto and the loopback Kubernetes API: jobs, then the claim, then `cdk destroy`
of the cluster stack (an injected runner); with --delete-data the file system (waited for), the
buckets, then the storage and network stacks; then the orphan sweep. Data and the stacks it needs
are kept unless --delete-data; a failed destroy is retried once after sweeping what blocks it;
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
from nvrx_eks.ops.teardown_sweep import find_orphans
from tests.support import cli_harness
from tests.support.aws_gaps import PlacementGroups, ServiceGaps
from tests.support.cli_harness import REGION, add_fsx_volume, add_job_pods, deploy_fake_environment, run_cli

aws = cli_harness.aws
k8s_server = cli_harness.k8s_server

DATA_BUCKET = "nvrx-eks-storage-databucket-1a2b3c"
LOG_BUCKET = "nvrx-eks-storage-accesslogbucket-4d5e6f"
OURS = [{"Key": DEPLOYMENT_TAG_KEY, "Value": "nvrx-eks"}]
CLUSTER, STORAGE, NETWORK = "nvrx-eks-cluster", "nvrx-eks-storage", "nvrx-eks-network"
STACK_NAME_TAG = "aws:cloudformation:stack-name"
#: The kubectl provider's function log groups (DeletionPolicy Retain in the synthesized template)
#: and the one Lambda creates itself for the network stack's custom resource.
CLUSTER_LAMBDA_LOGS = "/aws/lambda/nvrx-eks-cluster-KubectlProviderHandler-AbC123xYz"
NETWORK_LAMBDA_LOGS = "/aws/lambda/nvrx-eks-network-CustomVpcRestrictDefaultSGCust-QwE456rTy"
#: A function of another deployment, named "nvrx-eks-cluster": its stacks start with our cluster
#: stack's name.
FOREIGN_LAMBDA_LOGS = "/aws/lambda/nvrx-eks-cluster-network-CustomVpcRestrictDefault-ZxC789vBn"


def owned_by(stack: str) -> list[dict]:
    """The tags CloudFormation puts on a stack's resources (plus the deployment tag CDK adds)."""
    return [*OURS, {"Key": STACK_NAME_TAG, "Value": stack}]


class FakeCdk:
    """Stands in for `cdk destroy STACK --exclusively` (and `cdk destroy --all`, cluster, storage,
    network, as the CDK orders it): records what it was asked, checks the Kubernetes side was
    emptied first, and deletes a stack as CloudFormation would, with the resources it owns. Like
    CloudFormation it fails (exit 1, stack DELETE_FAILED) where AWS refuses: the network stack while
    its VPC still holds a file system, a network interface or a security group it does not own.
    `fail` makes a stack's first N destroys fail regardless."""

    def __init__(self, server=None, fail: dict[str, int] | None = None, events: list | None = None):
        self.server, self.fail, self.calls = server, dict(fail or {}), []
        #: ("destroy", stack, what blocked it, the file systems that existed then) in order; shared
        #: with other recorders in a test.
        self.events = events if events is not None else []

    @property
    def stacks(self) -> list[str]:
        return [e[1] for e in self.events if e[0] == "destroy"]

    def __call__(self, argv: list[str]) -> int:
        self.calls.append(argv)
        if self.server is not None:
            assert self.server.list(JOBSET.api_version, JOBSET.plural) == []
            assert self.server.list("v1", "pods") == []
            assert self.server.list("v1", "persistentvolumeclaims") == []
            assert self.server.list("v1", "persistentvolumes") == []
        names = [CLUSTER, STORAGE, NETWORK] if argv[2] == "--all" else [argv[2]]
        for name in names:
            if not self._destroy(name):
                return 1
        return 0

    def _destroy(self, name: str) -> bool:
        blockers = network_blockers() if name == NETWORK else []
        file_systems = boto3.client("fsx", region_name=REGION).describe_file_systems()["FileSystems"]
        self.events.append(("destroy", name, blockers, [fs["FileSystemId"] for fs in file_systems]))
        if self.fail.get(name, 0) > 0:
            self.fail[name] -= 1
            return False
        if blockers:
            return False
        ec2 = boto3.client("ec2", region_name=REGION)
        owned = [_tag_filter(STACK_NAME_TAG, name)]
        for group in ec2.describe_security_groups(Filters=owned)["SecurityGroups"]:
            ec2.delete_security_group(GroupId=group["GroupId"])
        for subnet in ec2.describe_subnets(Filters=owned)["Subnets"]:
            ec2.delete_subnet(SubnetId=subnet["SubnetId"])
        for vpc in ec2.describe_vpcs(Filters=owned)["Vpcs"]:
            ec2.delete_vpc(VpcId=vpc["VpcId"])
        boto3.client("cloudformation", region_name=REGION).delete_stack(StackName=name)
        return True


def _tag_filter(key: str, value: str) -> dict:
    return {"Name": f"tag:{key}", "Values": [value]}


def network_blockers() -> list[str]:
    """What keeps CloudFormation from deleting the network stack's subnets, security groups and
    VPC: file systems in its subnets (their ENIs, which moto does not create), network interfaces,
    and security groups the stack does not own."""
    ec2 = boto3.client("ec2", region_name=REGION)
    found = []
    for vpc in ec2.describe_vpcs(Filters=[_tag_filter(STACK_NAME_TAG, NETWORK)])["Vpcs"]:
        in_vpc = [{"Name": "vpc-id", "Values": [vpc["VpcId"]]}]
        subnets = {s["SubnetId"] for s in ec2.describe_subnets(Filters=in_vpc)["Subnets"]}
        for fs in boto3.client("fsx", region_name=REGION).describe_file_systems()["FileSystems"]:
            if subnets & set(fs["SubnetIds"]):
                found.append(fs["FileSystemId"])
        found += [e["NetworkInterfaceId"] for e in ec2.describe_network_interfaces(Filters=in_vpc)["NetworkInterfaces"]]
        for group in ec2.describe_security_groups(Filters=in_vpc)["SecurityGroups"]:
            tags = {t["Key"]: t["Value"] for t in group.get("Tags", [])}
            if group["GroupName"] != "default" and tags.get(STACK_NAME_TAG) != NETWORK:
                found.append(group["GroupId"])
    return found


class Leftovers:
    """What a real deployment leaves behind after `cdk destroy` of its cluster stack, the network
    stack's VPC with the file system in it, plus look-alikes that are not ours and must survive."""

    def __init__(self, session: boto3.Session):
        ec2 = boto3.client("ec2", region_name=REGION)

        def vpc_and_subnet(tags):
            spec = [{"ResourceType": "vpc", "Tags": tags}] if tags else []
            vpc = ec2.create_vpc(CidrBlock="10.0.0.0/16", TagSpecifications=spec)["Vpc"]["VpcId"]
            spec = [{"ResourceType": "subnet", "Tags": tags}] if tags else []
            subnet = ec2.create_subnet(
                VpcId=vpc, CidrBlock="10.0.0.0/24", AvailabilityZone="us-east-1a", TagSpecifications=spec
            )["Subnet"]["SubnetId"]
            return vpc, subnet

        # The network stack's VPC and GPU subnet; another deployment's VPC for the look-alikes.
        self.vpc, subnet = vpc_and_subnet(owned_by(NETWORK))
        self.other_vpc, other_subnet = vpc_and_subnet([])

        def eni(tags, subnet_id=subnet, description=""):
            spec = [{"ResourceType": "network-interface", "Tags": tags}] if tags else []
            return ec2.create_network_interface(SubnetId=subnet_id, Description=description, TagSpecifications=spec)[
                "NetworkInterface"
            ]["NetworkInterfaceId"]

        self.efa_eni = eni(OURS)
        self.cni_eni = eni([{"Key": "cluster.k8s.amazonaws.com/name", "Value": "nvrx-eks"}])
        # Released by Lambda after the kubectl provider's function is gone, carrying no tag of ours.
        self.lambda_eni = eni([], description="AWS Lambda VPC ENI-nvrx-eks-cluster-KubectlProviderHandler-AbC123xYz")
        self.foreign_eni = eni([{"Key": "cluster.k8s.amazonaws.com/name", "Value": "someone-else"}], other_subnet)
        self.foreign_lambda_eni = eni([], other_subnet, "AWS Lambda VPC ENI-someone-elses-function")

        def group(name, tags, vpc=self.vpc):
            return ec2.create_security_group(
                GroupName=name,
                Description=name,
                VpcId=vpc,
                TagSpecifications=[{"ResourceType": "security-group", "Tags": tags}],
            )["GroupId"]

        self.cluster_sg = group("eks-cluster-sg-nvrx-eks", [{"Key": "aws:eks:cluster-name", "Value": "nvrx-eks"}])
        # The network stack's own: attached to the file system, so gone only with the stack.
        self.fsx_sg = group("nvrx-eks-network-FsxSecurityGroup-1A2B", owned_by(NETWORK))
        self.foreign_sg = group(
            "eks-cluster-sg-other", [{"Key": "aws:eks:cluster-name", "Value": "other"}], self.other_vpc
        )

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
        for name in (CLUSTER_LAMBDA_LOGS, NETWORK_LAMBDA_LOGS, FOREIGN_LAMBDA_LOGS):
            logs.create_log_group(logGroupName=name)

        fsx = boto3.client("fsx", region_name=REGION)
        self.file_system = fsx.create_file_system(
            FileSystemType="LUSTRE", StorageCapacity=4800, SubnetIds=[subnet], Tags=owned_by(STORAGE)
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

    def stacks(self) -> set[str]:
        cfn = boto3.client("cloudformation", region_name=REGION)
        return {s["StackName"] for s in cfn.describe_stacks()["Stacks"] if s["StackStatus"] != "DELETE_COMPLETE"}


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
        "file_system_timeout_s": 5,
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


def test_keeping_data_destroys_only_the_cluster_stack(deployed):
    """(F3) The file system in the network stack's VPC would fail that stack's deletion; without
    --delete-data teardown destroys the cluster stack only, and finishes."""
    server, session, left = deployed
    assert left.file_system in network_blockers()  # what would fail `cdk destroy` of the network stack
    cdk = FakeCdk(server)
    result = _teardown(session, run_cdk=cdk)

    assert result.jobs_deleted == ["JobSet/train"]
    assert [argv[1:] for argv in cdk.calls] == [
        ["destroy", CLUSTER, "--exclusively", "--force", "--no-notices", "-c", "profile=p5"]
    ]
    assert cdk.calls[0][0].endswith("node_modules/.bin/cdk")
    assert result.stacks_destroyed == [CLUSTER]
    assert result.stacks_kept == [STORAGE, NETWORK]
    assert left.stacks() == {STORAGE, NETWORK}

    outcomes = {(o.kind, o.identifier): o.outcome for o in result.orphans}
    assert outcomes == {
        ("network interface", left.cni_eni): "deleted",
        ("network interface", left.efa_eni): "deleted",
        ("network interface", left.lambda_eni): "deleted",
        ("security group", left.cluster_sg): "deleted",
        ("placement group", "nvrx-eks-cluster-PlacementGroup-1X"): "deleted",
        ("EBS volume", left.volume): "deleted",
        # The control-plane log group holds the audit log: data, kept like the FSx backups.
        ("log group", "/aws/eks/nvrx-eks/cluster"): "kept (control-plane and audit logs; --delete-data deletes it)",
        ("log group", "/aws/containerinsights/nvrx-eks/performance"): "deleted",
        ("log group", CLUSTER_LAMBDA_LOGS): "deleted",
        ("FSx backup", left.backup): "kept (data; --delete-data deletes it)",
    }
    # Gone: ours. Still there: the look-alikes, all data, and what the kept network stack owns
    # (the file system's security group) or still uses (its function's log group).
    assert left.enis() == {left.foreign_eni, left.foreign_lambda_eni}
    assert left.cluster_sg not in left.security_groups()
    assert {left.foreign_sg, left.fsx_sg} <= left.security_groups()
    assert [g["GroupName"] for g in left.placement_groups.groups] == ["unrelated"]
    assert left.log_groups() == {
        "/aws/eks/nvrx-eks/cluster",
        "/aws/eks/nvrx-eks-other/cluster",
        NETWORK_LAMBDA_LOGS,
        FOREIGN_LAMBDA_LOGS,
    }
    assert {DATA_BUCKET, LOG_BUCKET} <= left.buckets()
    assert left.file_system in left.file_systems()
    assert left.backup in left.backups()
    assert sorted(result.data_kept.buckets) == sorted([DATA_BUCKET, LOG_BUCKET])
    assert result.data_kept.file_systems == [left.file_system]


def test_the_plan_says_what_goes_what_stays_and_what_delete_data_adds(deployed):
    _, session, left = deployed
    console = Console(width=400, record=True)
    _teardown(session, yes=False, console=console, run_cdk=FakeCdk())
    plan = console.export_text()
    assert f"  - cdk destroy {CLUSTER}\n" in plan
    assert f"cdk destroy {STORAGE}" not in plan.split("--delete-data would")[0]
    assert f"  - keep FSx file system {left.file_system}\n" in plan
    assert f"  - keep buckets {DATA_BUCKET}, {LOG_BUCKET}\n" in plan
    assert (
        f"  - keep stacks {STORAGE} and {NETWORK}: the file system needs their VPC, subnet and security group" in plan
    )
    assert (
        f"    --delete-data would also delete FSx file system {left.file_system} (waiting until it is gone), "
        f"buckets {DATA_BUCKET}, {LOG_BUCKET}, the FSx backups and control-plane log groups, "
        f"then cdk destroy {STORAGE}, then {NETWORK}\n"
    ) in plan

    console = Console(width=400, record=True)
    _teardown(session, yes=False, delete_data=True, console=console, run_cdk=FakeCdk())
    plan = console.export_text()
    assert f"  - DELETE FSx file system {left.file_system}, and wait until it is gone\n" in plan
    assert f"  - DELETE buckets {DATA_BUCKET}, {LOG_BUCKET} (every object version)\n" in plan
    assert f"  - cdk destroy {CLUSTER}\n" in plan and f"  - cdk destroy {STORAGE}, then {NETWORK}\n" in plan
    assert "keep" not in plan


def test_delete_data_deletes_the_file_system_before_its_stacks(deployed):
    """(F3) With --delete-data the file system is gone before the storage and network stacks'
    destroys are issued, so they can finish."""
    server, session, left = deployed
    events: list = []
    session.events.register(
        "before-parameter-build.fsx.DeleteFileSystem",
        lambda params, **_: events.append(("delete file system", params["FileSystemId"])),
    )
    cdk = FakeCdk(server, events=events)
    result = _teardown(session, delete_data=True, run_cdk=cdk)

    assert [e[:2] for e in events[:3]] == [
        ("destroy", CLUSTER),
        ("delete file system", left.file_system),
        ("destroy", STORAGE),
    ]
    # Every destroy after the cluster stack's found the file system gone.
    assert [(e[1], e[3]) for e in events[2:]] == [(STORAGE, []), (NETWORK, []), (NETWORK, [])]
    assert result.stacks_destroyed == [CLUSTER, STORAGE, NETWORK] and result.stacks_kept == []
    assert left.stacks() == set()

    assert {DATA_BUCKET, LOG_BUCKET}.isdisjoint(left.buckets()) and "unrelated-bucket" in left.buckets()
    assert sorted(result.data_deleted.buckets) == sorted([DATA_BUCKET, LOG_BUCKET])
    assert result.data_deleted.file_systems == [left.file_system]
    assert left.file_systems() == {}
    assert left.backup not in left.backups()
    assert left.log_groups() == {"/aws/eks/nvrx-eks-other/cluster", FOREIGN_LAMBDA_LOGS}


def test_failed_destroy_is_retried_once_after_sweeping_what_blocks_it(deployed):
    """(F7) Leftover CNI, EFA and Lambda ENIs and the EKS cluster security group in the VPC fail the
    network stack's destroy; the sweep of ENIs and security groups runs then, not only after a
    successful destroy, and one retry succeeds."""
    server, session, left = deployed
    cdk = FakeCdk(server)
    result = _teardown(session, delete_data=True, run_cdk=cdk)

    assert cdk.stacks == [CLUSTER, STORAGE, NETWORK, NETWORK]
    first_try, retry = cdk.events[-2][2], cdk.events[-1][2]
    assert set(first_try) == {left.efa_eni, left.cni_eni, left.lambda_eni, left.cluster_sg}
    assert retry == []
    # The retry's sweep comes first in the report; the final sweep found nothing more of these.
    swept = sorted((o.kind, o.identifier, o.outcome) for o in result.orphans[:4])
    assert swept == sorted(
        [
            ("network interface", left.cni_eni, "deleted"),
            ("network interface", left.efa_eni, "deleted"),
            ("network interface", left.lambda_eni, "deleted"),
            ("security group", left.cluster_sg, "deleted"),
        ]
    )
    assert not any(o.kind in ("network interface", "security group") for o in result.orphans[4:])
    assert result.stacks_destroyed == [CLUSTER, STORAGE, NETWORK]


def test_destroy_failing_again_after_the_sweep_names_the_stack_and_what_is_left(deployed):
    """An ENI someone made by hand in the VPC is not ours to delete: the retry fails too, and the
    error is one line naming the stack, what is still in the VPC, and the fix."""
    server, session, left = deployed
    ec2 = boto3.client("ec2", region_name=REGION)
    subnet = ec2.describe_subnets(Filters=[{"Name": "vpc-id", "Values": [left.vpc]}])["Subnets"][0]["SubnetId"]
    by_hand = ec2.create_network_interface(SubnetId=subnet, Description="debug box")["NetworkInterface"][
        "NetworkInterfaceId"
    ]
    cdk = FakeCdk(server)
    with pytest.raises(ConfigError) as error:
        _teardown(session, delete_data=True, run_cdk=cdk)
    message = str(error.value)
    assert "\n" not in message
    assert message.startswith(f"cdk destroy of stack {NETWORK} failed again after the sweep")
    # The network stack's own security group is listed too: it is what the ENI keeps from going.
    assert (
        f"; still in the deployment's VPC {left.vpc}: {by_hand} (available, debug box), "
        f"{left.fsx_sg} (nvrx-eks-network-FsxSecurityGroup-1A2B); "
    ) in message
    assert message.endswith("then run teardown again (it skips what is already gone)")
    assert cdk.stacks == [CLUSTER, STORAGE, NETWORK, NETWORK]  # exactly one retry
    assert by_hand in left.enis() and left.efa_eni not in left.enis()


def test_cluster_destroy_failing_twice_stops_before_the_data(deployed):
    server, session, left = deployed
    cdk = FakeCdk(server, fail={CLUSTER: 2})
    with pytest.raises(ConfigError, match=f"^cdk destroy of stack {CLUSTER} failed again after the sweep") as error:
        _teardown(session, delete_data=True, run_cdk=cdk)
    assert "\n" not in str(error.value)
    assert cdk.stacks == [CLUSTER, CLUSTER]
    # The file system and its security group are meant to be in the VPC while their stacks stay.
    assert str(error.value).endswith(
        "(exit 1); no file system, network interface or security group that could block it is left in the VPC; "
        "the cause is elsewhere: read the cdk output above and the stack's DELETE_FAILED events, then run teardown "
        "again (it skips what is already gone)"
    )
    # The blockers were swept; the data and everything else stayed.
    assert left.efa_eni not in left.enis() and left.cluster_sg not in left.security_groups()
    assert left.file_system in left.file_systems() and DATA_BUCKET in left.buckets()
    assert CLUSTER_LAMBDA_LOGS in left.log_groups() and left.backup in left.backups()


def test_lambda_log_groups_of_destroyed_stacks_are_swept(deployed):
    """(F7) The kubectl provider's log groups outlive the cluster stack (DeletionPolicy Retain);
    a living stack's are left alone, and another deployment's never match."""
    _, session, left = deployed
    from infra.config import resolve_config as config_of

    config = config_of()
    names = lambda living: {o.identifier for o in find_orphans(session, config, living_stacks=living)}  # noqa: E731
    assert CLUSTER_LAMBDA_LOGS in names([STORAGE, NETWORK])
    assert NETWORK_LAMBDA_LOGS not in names([STORAGE, NETWORK])
    assert {CLUSTER_LAMBDA_LOGS, NETWORK_LAMBDA_LOGS} <= names([])
    assert FOREIGN_LAMBDA_LOGS not in names([])

    result = _teardown(session, delete_data=True, run_cdk=FakeCdk())
    lambda_logs = {o.identifier: o.outcome for o in result.orphans if o.identifier.startswith("/aws/lambda/")}
    assert lambda_logs == {CLUSTER_LAMBDA_LOGS: "deleted", NETWORK_LAMBDA_LOGS: "deleted"}
    assert FOREIGN_LAMBDA_LOGS in left.log_groups()


class SlowDeletion:
    """DescribeFileSystems as FSx answers while it deletes a file system: DELETING for
    `deleting_polls` answers after DeleteFileSystem, then gone (moto drops it at once)."""

    def __init__(self, session: boto3.Session, file_system_id: str, deleting_polls: int):
        self.file_system_id, self.left, self.deleted, self.polls = file_system_id, deleting_polls, False, 0
        session.events.register("after-call.fsx.DeleteFileSystem", self._deleted)
        ServiceGaps(session).answer("fsx", "DescribeFileSystems", self._describe)

    def _deleted(self, **_):
        self.deleted = True

    def _describe(self, params: dict) -> dict:
        fs = {"FileSystemId": self.file_system_id, "FileSystemType": "LUSTRE", "Tags": OURS, "SubnetIds": []}
        if not self.deleted:
            return {"FileSystems": [{**fs, "Lifecycle": "AVAILABLE"}]}
        self.polls += 1
        if self.left == 0:
            return {"FileSystems": []}
        self.left -= 1
        return {"FileSystems": [{**fs, "Lifecycle": "DELETING"}]}


def test_delete_data_waits_until_the_file_system_is_gone(deployed):
    server, session, left = deployed
    slow = SlowDeletion(session, left.file_system, deleting_polls=3)
    cdk = FakeCdk(server)
    result = _teardown(session, delete_data=True, run_cdk=cdk)
    assert slow.polls == 4  # three DELETING answers, then gone
    assert result.stacks_destroyed == [CLUSTER, STORAGE, NETWORK]


def test_a_file_system_that_takes_too_long_to_delete_stops_before_its_stacks(deployed):
    server, session, left = deployed
    SlowDeletion(session, left.file_system, deleting_polls=10**6)
    cdk = FakeCdk(server)
    with pytest.raises(ConfigError) as error:
        _teardown(session, delete_data=True, run_cdk=cdk, file_system_timeout_s=0.2)
    message = str(error.value)
    assert "\n" not in message
    assert message.startswith(f"FSx file system {left.file_system} is still DELETING after 0 s")
    assert "run teardown --delete-data again" in message
    assert cdk.stacks == [CLUSTER]
    assert left.stacks() == {STORAGE, NETWORK} and DATA_BUCKET in left.buckets()


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
