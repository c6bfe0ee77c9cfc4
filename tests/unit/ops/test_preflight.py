"""preflight against moto: every check passes on a ready account and fails, with its fix, when
the account is not ready. Operations moto does not implement are answered through tests/support/aws_gaps.py
with responses checked against botocore's service model."""

from __future__ import annotations

import datetime
import json
import urllib.error

import boto3
import pytest
from rich.console import Console

from infra.addons.install import managed_addons
from infra.config import DeploymentConfig, resolve_config
from nvrx_eks.facts.kubernetes_versions import SUPPORTED_KUBERNETES_VERSIONS
from nvrx_eks.ops import preflight
from nvrx_eks.ops.preflight import FAIL, PASS, SKIP, WARN, PreflightContext
from tests.support import cli_harness
from tests.support.aws_gaps import (
    ServiceGaps,
    addon_versions_answer,
    capacity_reservations_answer,
    cluster_versions_answer,
    list_quotas_answer,
    quotas_answer,
)
from tests.support.cli_harness import ACCOUNT, REGION, run_cli
from tests.support.profiles import config_with, profile_file

aws = cli_harness.aws
no_credentials = cli_harness.no_credentials

P_QUOTA = ("ec2", "L-417A185B")
G_QUOTA = ("ec2", "L-DB2E81BA")
LUSTRE_QUOTA = ("L-FSXLUSTRE2", "Lustre Persistent_2 storage capacity (GiB)")
RESERVATION_ID = "cr-0123456789abcdef0"

#: A profile edited the way its comments ask: a user's own account, admin role and office
#: network. Not documentation values (infra/config/placeholders.py): 198.18.0.0/15 is the
#: RFC 2544 benchmarking range, which no test machine's real address is in either.
OWN_ACCOUNT = "210987654321"
OWN_CHANGES = {
    "account": OWN_ACCOUNT,
    "admin_principal_arn": f"arn:aws:iam::{OWN_ACCOUNT}:role/Admin",
    "endpoint__public_cidrs": ["198.18.7.0/24"],
}
#: This machine's egress address, as checkip.amazonaws.com would report it: inside OWN_CHANGES's CIDR.
OWN_EGRESS = "198.18.7.9"


def own_config(profile: str = "p5", **changes) -> DeploymentConfig:
    return config_with(profile, **{**OWN_CHANGES, **changes})


#: The real one, before no_checkip replaces it in every test.
REAL_FETCH_EGRESS_IP = preflight.fetch_egress_ip


@pytest.fixture(autouse=True)
def no_checkip(monkeypatch):
    """No test reaches the network: a check that asks checkip.amazonaws.com without an injected
    answer sees it unreachable."""

    def unreachable():
        raise urllib.error.URLError("tests do not reach the network")

    monkeypatch.setattr(preflight, "fetch_egress_ip", unreachable)


def reservation(**overrides) -> dict:
    return {
        "CapacityReservationId": RESERVATION_ID,
        "InstanceType": "p5.48xlarge",
        "AvailabilityZone": "us-east-1a",
        "State": "active",
        "TotalInstanceCount": 2,
        "AvailableInstanceCount": 2,
        **overrides,
    }


def ready_account(
    session: boto3.Session,
    *,
    p_vcpus: float = 384,
    g_vcpus: float = 64,
    lustre_gib: float | None = 100_800,
    versions: dict | None = None,
    reservations: list[dict] | None = None,
    addon_offers: dict | None = None,
) -> ServiceGaps:
    gaps = ServiceGaps(session)
    quotas = {
        P_QUOTA: ("Running On-Demand P instances", p_vcpus),
        G_QUOTA: ("Running On-Demand G and VT instances", g_vcpus),
    }
    gaps.answer("service-quotas", "GetServiceQuota", quotas_answer(quotas))
    gaps.answer("service-quotas", "GetAWSDefaultServiceQuota", quotas_answer(quotas))
    fsx_quotas = [("L-FSXBACKUPS", "Lustre backups", 500.0)]
    if lustre_gib is not None:
        fsx_quotas.append((*LUSTRE_QUOTA, lustre_gib))
    gaps.answer("service-quotas", "ListServiceQuotas", list_quotas_answer({"fsx": fsx_quotas}))
    gaps.answer("eks", "DescribeClusterVersions", cluster_versions_answer(versions or {"1.35": "STANDARD_SUPPORT"}))
    gaps.answer("ec2", "DescribeCapacityReservations", capacity_reservations_answer(reservations or []))
    gaps.answer("eks", "DescribeAddonVersions", addon_versions_answer(addon_offers or offers_for_every_pin()))
    return gaps


#: What EKS offers in these tests where a pin is None ("EKS picks its default build").
EKS_DEFAULT_BUILD = "v9.0.0-eksbuild.1"


def offers_for_every_pin() -> dict[tuple[str, str], list[str]]:
    """An account where EKS offers, for every supported minor, each build the shipped profiles
    pin (default first), or a default build where the pin leaves the choice to EKS."""
    offers: dict[tuple[str, str], list[str]] = {}
    for profile in ("p5", "p5en", "g5-smoke", "p5-capacity-block"):
        for minor in SUPPORTED_KUBERNETES_VERSIONS:
            for addon in managed_addons(config_with(profile, kubernetes_version=minor)):
                builds = offers.setdefault((minor, addon.name), [])
                build = addon.version or EKS_DEFAULT_BUILD
                if build not in builds:
                    builds.append(build)
    return offers


@pytest.fixture
def session(aws):
    return boto3.Session(region_name=REGION)


#: A role's trust policy that lets anyone in the account assume it (moto checks nothing more).
TRUST_POLICY = json.dumps(
    {
        "Version": "2012-10-17",
        "Statement": [{"Effect": "Allow", "Principal": {"AWS": "*"}, "Action": "sts:AssumeRole"}],
    }
)


def become(monkeypatch, role: str, path: str = "/", session: str = "jane") -> str:
    """Create the IAM role and make every new session's credentials its assumed-role session (as
    `aws sso login` does); returns the role's ARN, with its path."""
    arn = boto3.client("iam").create_role(RoleName=role, Path=path, AssumeRolePolicyDocument=TRUST_POLICY)["Role"][
        "Arn"
    ]
    credentials = boto3.client("sts").assume_role(RoleArn=arn, RoleSessionName=session)["Credentials"]
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", credentials["AccessKeyId"])
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", credentials["SecretAccessKey"])
    monkeypatch.setenv("AWS_SESSION_TOKEN", credentials["SessionToken"])
    return arn


@pytest.fixture
def own_session(aws, monkeypatch):
    """moto as the user's own account (OWN_ACCOUNT), for profiles with no placeholder, signed in
    as the profile's admin role."""
    monkeypatch.setenv("MOTO_ACCOUNT_ID", OWN_ACCOUNT)
    become(monkeypatch, "Admin")
    return boto3.Session(region_name=REGION)


def statuses(results) -> list[str]:
    return [r.status for r in results]


# ----- the whole run ------------------------------------------------------------------------


def test_ready_account_passes_every_check(own_session):
    ready_account(own_session)
    results = preflight.run_checks(own_config(), 2, own_session, egress_ip=lambda: OWN_EGRESS)
    assert [(r.name, r.status) for r in results] == [
        ("AWS credentials", PASS),
        ("admin principal", PASS),
        ("vCPU quota: Running On-Demand P instances", PASS),
        ("p5.48xlarge offered in us-east-1a", PASS),
        ("GPU capacity", WARN),
        ("FSx for Lustre storage quota", PASS),
        ("EKS offers Kubernetes 1.35", PASS),
        ("EKS add-on versions for 1.35", PASS),
        ("profile has no placeholders", PASS),
        ("API endpoint allows this machine", PASS),
    ]


def test_no_credentials_fails_first_and_skips_the_aws_checks(no_credentials):
    results = preflight.run_checks(resolve_config(), 2, boto3.Session(region_name=REGION))
    assert results[0].status == FAIL and "no credentials" in results[0].detail
    assert "AWS_PROFILE" in results[0].fix
    assert statuses(results[1:8]) == [SKIP] * 7
    # The checks that need no credentials still run: the shipped profile's placeholders fail.
    assert [(r.name, r.status) for r in results[8:]] == [
        ("profile has no placeholders", FAIL),
        ("API endpoint allows this machine", SKIP),
    ]


def test_without_credentials_each_check_of_the_table_that_needs_them_is_a_skip_row_under_its_name(
    no_credentials, monkeypatch
):
    """The SKIP rows come from the table of checks: a check added to it is skipped, in its place,
    with no second list of names to keep in step."""

    def never(ctx):
        raise AssertionError("a check that needs credentials ran without them")

    checks = preflight.ACCOUNT_CHECKS
    monkeypatch.setattr(
        preflight, "ACCOUNT_CHECKS", (*checks[:2], preflight.Check("a check added later", never), *checks[2:])
    )
    results = preflight.run_checks(resolve_config(), 2, boto3.Session(region_name=REGION))
    assert [(r.name, r.status, r.detail) for r in results[1:9]] == [
        (name, SKIP, "needs working credentials")
        for name in (
            "admin principal",
            "vCPU quota",
            "a check added later",
            "instance offered",
            "GPU capacity",
            "FSx storage quota",
            "EKS version",
            "EKS add-on versions",
        )
    ]
    assert [r.name for r in results[9:]] == ["profile has no placeholders", "API endpoint allows this machine"]


def test_a_reservation_is_described_once_for_its_row_and_the_quota_it_covers(own_session):
    gaps = ready_account(own_session, p_vcpus=0, reservations=[reservation()])
    config = own_config(gpu_nodes__capacity_reservation_id=RESERVATION_ID, gpu_nodes__placement_group=False)
    results = {r.name: r for r in preflight.run_checks(config, 2, own_session, egress_ip=lambda: OWN_EGRESS)}
    assert results[f"capacity reservation {RESERVATION_ID}"].status == PASS
    quota = results["vCPU quota: Running On-Demand P instances"]
    assert quota.status == PASS and quota.detail.endswith(f"covered by capacity reservation {RESERVATION_ID}")
    assert len(gaps.called("DescribeCapacityReservations")) == 1


def test_credentials_for_another_account_fail(session):
    ready_account(session)
    result = preflight.check_credentials(PreflightContext(config_with(account="999999999999"), 2, session))
    assert result.status == FAIL
    assert f"credentials are for account {ACCOUNT}, the profile deploys to 999999999999" == result.detail


# ----- vCPU quota -----------------------------------------------------------------------------


def test_vcpu_quota_counts_instances_already_running(session):
    gaps = ready_account(session, p_vcpus=384)
    ctx = PreflightContext(resolve_config(), 2, session)
    assert preflight.check_vcpu_quota(ctx).status == PASS
    boto3.client("ec2", region_name=REGION).run_instances(
        ImageId="ami-12c6146b", InstanceType="p5.48xlarge", MinCount=1, MaxCount=1
    )
    result = preflight.check_vcpu_quota(ctx)
    assert result.status == FAIL
    assert result.detail == "need 384 (2 x 192), quota 384, in use 192 (a limit, not capacity)"
    assert "at least 576 vCPUs" in result.fix and "L-417A185B" in result.fix
    assert gaps.called("GetServiceQuota")[0] == {"ServiceCode": "ec2", "QuotaCode": "L-417A185B"}


def test_vcpu_quota_falls_back_to_the_default_value(session):
    gaps = ServiceGaps(session)
    gaps.answer("service-quotas", "GetServiceQuota", quotas_answer({}))  # never raised in this account
    gaps.answer(
        "service-quotas", "GetAWSDefaultServiceQuota", quotas_answer({P_QUOTA: ("Running On-Demand P instances", 0)})
    )
    result = preflight.check_vcpu_quota(PreflightContext(resolve_config(), 2, session))
    assert result.status == FAIL and "quota 0" in result.detail


def test_g5_profile_uses_the_g_instance_quota(session):
    gaps = ready_account(session, g_vcpus=32)
    result = preflight.check_vcpu_quota(PreflightContext(resolve_config("g5-smoke"), 2, session))
    assert result.status == FAIL and result.detail.startswith("need 64 (2 x 32), quota 32")
    assert gaps.called("GetServiceQuota")[0]["QuotaCode"] == "L-DB2E81BA"


def test_a_capacity_reservation_covers_the_vcpu_quota(session):
    ready_account(session, p_vcpus=0)
    ctx = PreflightContext(
        config_with(gpu_nodes__capacity_reservation_id=RESERVATION_ID, gpu_nodes__placement_group=False), 2, session
    )
    result = preflight.check_vcpu_quota(ctx, reservation())
    assert result.status == PASS and RESERVATION_ID in result.detail


# ----- instance offering ----------------------------------------------------------------------


def test_instance_type_offered_in_the_az(session):
    assert preflight.check_instance_offered(PreflightContext(resolve_config(), 2, session)).status == PASS


def test_instance_type_not_offered_in_the_az(session):
    config = config_with("g5-smoke", gpu_availability_zone="us-east-1e")
    result = preflight.check_instance_offered(PreflightContext(config, 2, session))
    assert result.status == FAIL
    assert result.detail.startswith("not offered in us-east-1e; offered in us-east-1a")
    assert result.fix.startswith("set gpu_availability_zone to one of us-east-1a")


# ----- capacity reservation -------------------------------------------------------------------


def _reservation_ctx(session, profile="p5", **changes):
    if profile == "p5":
        changes = {"gpu_nodes__capacity_reservation_id": RESERVATION_ID, "gpu_nodes__placement_group": False, **changes}
    return PreflightContext(config_with(profile, **changes), 2, session)


def test_reservation_that_matches_passes(session):
    ready_account(session, reservations=[reservation()])
    found, result = preflight.describe_reservation(_reservation_ctx(session))
    assert result.status == PASS and found["CapacityReservationId"] == RESERVATION_ID


@pytest.mark.parametrize(
    "overrides, problem",
    [
        ({"AvailabilityZone": "us-east-1b"}, "is in us-east-1b, not us-east-1a"),
        ({"InstanceType": "p5en.48xlarge"}, "is for p5en.48xlarge, not p5.48xlarge"),
        ({"State": "expired"}, "is expired"),
        ({"AvailableInstanceCount": 1}, "has 1 of 2 instances free, need 2"),
    ],
)
def test_reservation_that_does_not_match_fails(session, overrides, problem):
    ready_account(session, reservations=[reservation(**overrides)])
    _, result = preflight.describe_reservation(_reservation_ctx(session))
    assert result.status == FAIL and problem in result.detail
    assert "remove capacity_reservation_id" in result.fix


def test_reservation_that_does_not_exist_fails(session):
    ready_account(session, reservations=[])
    _, result = preflight.describe_reservation(_reservation_ctx(session))
    assert result.status == FAIL and result.detail == "does not exist in us-east-1"


#: A purchased Capacity Block before its start, as EC2 describes it: no capacity shows until it
#: starts; the instances it will hold are in a tag (EC2 User Guide, "View Capacity Blocks").
START = datetime.datetime(2026, 12, 8, 11, 30, tzinfo=datetime.UTC)
END = datetime.datetime(2026, 12, 15, 11, 30, tzinfo=datetime.UTC)


def scheduled_block(quantity: int = 2) -> dict:
    return reservation(
        State="scheduled",
        StartDate=START,
        EndDate=END,
        TotalInstanceCount=0,
        AvailableInstanceCount=0,
        Tags=[{"Key": "aws:ec2capacityreservation:incrementalRequestedQuantity", "Value": str(quantity)}],
    )


def test_scheduled_capacity_block_passes_on_the_size_it_will_have(session):
    """(deploy review, risk) A block reports 0 available until it starts: preflight failed a valid
    block. Its size is the quantity tag; so are the vCPU quota's and `capacity up`'s."""
    ready_account(session, p_vcpus=0, reservations=[scheduled_block()])
    ctx = PreflightContext(resolve_config("p5-capacity-block"), 2, session)
    found, result = preflight.describe_reservation(ctx)
    assert result.status == PASS
    assert result.detail.startswith(
        "scheduled: starts 2026-12-08 11:30 UTC, then holds 2 x p5.48xlarge in us-east-1a until 2026-12-15 11:30 UTC"
    )
    assert preflight.check_vcpu_quota(ctx, found).status == PASS


def test_scheduled_capacity_block_smaller_than_the_job_fails(session):
    ready_account(session, reservations=[scheduled_block(quantity=1)])
    _, result = preflight.describe_reservation(PreflightContext(resolve_config("p5-capacity-block"), 2, session))
    assert result.status == FAIL and "has 1 of 1 instances free, need 2" in result.detail


def test_no_reservation_says_quota_is_not_capacity(session):
    _, result = preflight.describe_reservation(PreflightContext(resolve_config(), 2, session))
    assert (result.name, result.status) == ("GPU capacity", WARN)
    assert result.detail.startswith("not reserved: the vCPU quota is a limit, not capacity; 2 x p5.48xlarge start")
    assert "Capacity Block or an On-Demand Capacity Reservation" in result.fix


# ----- FSx quota ------------------------------------------------------------------------------


def test_fsx_quota_passes_with_room(session):
    ready_account(session, lustre_gib=9600)
    result = preflight.check_fsx_quota(PreflightContext(resolve_config(), 2, session))
    assert result.status == PASS
    assert result.detail == "need 4800 GiB, quota 9600 GiB (Lustre Persistent_2 storage capacity (GiB)), in use 0 GiB"


def test_fsx_quota_counts_existing_file_systems(session):
    ready_account(session, lustre_gib=9600)
    ec2 = boto3.client("ec2", region_name=REGION)
    vpc = ec2.create_vpc(CidrBlock="10.1.0.0/16")["Vpc"]["VpcId"]
    subnet = ec2.create_subnet(VpcId=vpc, CidrBlock="10.1.0.0/24", AvailabilityZone="us-east-1a")["Subnet"]["SubnetId"]
    boto3.client("fsx", region_name=REGION).create_file_system(
        FileSystemType="LUSTRE", StorageCapacity=7200, SubnetIds=[subnet]
    )
    result = preflight.check_fsx_quota(PreflightContext(resolve_config(), 2, session))
    assert result.status == FAIL and "in use 7200 GiB" in result.detail
    assert "to at least 12000 GiB" in result.fix and "L-FSXLUSTRE2" in result.fix


def test_fsx_quota_not_found_is_a_warning(session):
    ready_account(session, lustre_gib=None)
    assert preflight.check_fsx_quota(PreflightContext(resolve_config(), 2, session)).status == WARN


# ----- Kubernetes version ---------------------------------------------------------------------


def test_kubernetes_version_offered(session):
    ready_account(session, versions={"1.34": "EXTENDED_SUPPORT", "1.35": "STANDARD_SUPPORT"})
    result = preflight.check_kubernetes_version(PreflightContext(resolve_config(), 2, session))
    assert result.status == PASS and result.detail == "standard support"


def test_kubernetes_version_not_offered(session):
    ready_account(session, versions={"1.33": "STANDARD_SUPPORT"})
    result = preflight.check_kubernetes_version(PreflightContext(resolve_config(), 2, session))
    assert result.status == FAIL and result.detail == "1.35 is not offered in us-east-1"


@pytest.mark.parametrize(
    ("operation", "check"),
    [("DescribeClusterVersions", "check_kubernetes_version"), ("DescribeAddonVersions", "check_addon_versions")],
)
def test_permission_denied_names_the_permission(session, operation, check):
    gaps = ready_account(session)
    from tests.support.aws_gaps import ServiceError

    def denied(_params):
        raise ServiceError("AccessDeniedException", f"not authorized to perform eks:{operation}")

    gaps.answer("eks", operation, denied)
    result = getattr(preflight, check)(PreflightContext(resolve_config(), 2, session))
    assert result.status == FAIL and result.fix == f"grant eks:{operation}"


# ----- EKS add-on versions -------------------------------------------------------------------


def test_addon_versions_pinned_for_the_minor_are_offered(session):
    gaps = ready_account(session)
    config = config_with(kubernetes_version="1.34")
    result = preflight.check_addon_versions(PreflightContext(config, 2, session))
    assert result.status == PASS
    assert "kube-proxy v1.34.6-eksbuild.2" in result.detail
    asked = {(p["kubernetesVersion"], p["addonName"]) for p in gaps.called("DescribeAddonVersions")}
    assert asked == {("1.34", a.name) for a in managed_addons(config)}


def test_addon_left_to_eks_reports_the_default_build(session):
    ready_account(session)
    result = preflight.check_addon_versions(PreflightContext(config_with(kubernetes_version="1.36"), 2, session))
    assert result.status == PASS
    assert f"kube-proxy (EKS default {EKS_DEFAULT_BUILD})" in result.detail


def test_addon_build_not_offered_for_the_minor_fails_with_the_fix(session):
    offers = offers_for_every_pin()
    offers[("1.35", "coredns")] = ["v1.14.7-eksbuild.1"]  # the pinned build withdrawn
    ready_account(session, addon_offers=offers)
    result = preflight.check_addon_versions(PreflightContext(resolve_config(), 2, session))
    assert result.status == FAIL
    assert result.detail == (
        "coredns v1.13.2-eksbuild.4 is not offered for Kubernetes 1.35 (EKS default: v1.14.7-eksbuild.1)"
    )
    assert result.fix.startswith("set addons.versions.coredns: v1.14.7-eksbuild.1 in the profile")


# ----- documentation placeholders ---------------------------------------------------------------


def test_shipped_profile_placeholders_fail_naming_each_field_and_its_fix(session):
    result = preflight.check_placeholders(PreflightContext(resolve_config(), 2, session))
    assert result.status == FAIL
    assert result.detail.splitlines() == [
        f"account: {ACCOUNT} is a documentation placeholder",
        f"admin_principal_arn: arn:aws:iam::{ACCOUNT}:role/Admin is a documentation placeholder",
        "endpoint.public_cidrs: 203.0.113.0/24 is a documentation placeholder",
    ]
    fixes = result.fix.splitlines()
    assert fixes[0].startswith("account: set it to the 12-digit id of the account you deploy to")
    assert fixes[1].startswith("admin_principal_arn: set it to the IAM role or user")
    assert fixes[2].startswith("endpoint.public_cidrs: list the networks you reach the Kubernetes API from")


@pytest.mark.parametrize(
    "changes, field",
    [
        ({"account": "123456789012"}, "account"),
        ({"admin_principal_arn": "arn:aws:iam::444455556666:role/Admin"}, "admin_principal_arn"),
        ({"endpoint__public_cidrs": ["198.18.7.0/24", "192.0.2.10/32"]}, "endpoint.public_cidrs: 192.0.2.10/32 "),
        ({"endpoint__public_cidrs": ["198.51.100.128/25"]}, "endpoint.public_cidrs: 198.51.100.128/25 "),
    ],
)
def test_one_placeholder_left_fails_naming_that_field(session, changes, field):
    result = preflight.check_placeholders(PreflightContext(own_config(**changes), 2, session))
    assert result.status == FAIL and result.detail.startswith(field) and len(result.detail.splitlines()) == 1


def test_own_values_pass_even_around_a_documentation_range(session):
    """A real network that merely contains a documentation range is not a placeholder."""
    config = own_config(endpoint__public_cidrs=["203.0.0.0/16"])
    assert preflight.check_placeholders(PreflightContext(config, 2, session)).status == PASS


# ----- API endpoint access from this machine -------------------------------------------------


def _endpoint_check(config: DeploymentConfig, answer) -> preflight.CheckResult:
    return preflight.check_endpoint_reachable(PreflightContext(config, 2, boto3.Session(), answer))


def test_egress_address_inside_public_cidrs_passes():
    result = _endpoint_check(own_config(), lambda: OWN_EGRESS)
    assert result.status == PASS and result.detail == "this machine's egress address 198.18.7.9 is in 198.18.7.0/24"


def test_egress_address_outside_public_cidrs_fails_with_the_fix():
    result = _endpoint_check(own_config(), lambda: "198.19.1.1")
    assert result.status == FAIL
    assert result.detail.startswith("this machine's egress address 198.19.1.1 is in none of endpoint.public_cidrs")
    assert result.fix.startswith("add 198.19.1.1/32 (or your network's range) to endpoint.public_cidrs")


def test_checkip_unreachable_is_not_run_not_failed():
    def timeout():
        raise urllib.error.URLError(TimeoutError("timed out"))

    result = _endpoint_check(own_config(), timeout)
    assert result.status == SKIP
    assert result.detail == "not run: could not reach https://checkip.amazonaws.com (timed out)"
    assert "curl https://checkip.amazonaws.com" in result.fix


def test_checkip_answer_that_is_no_ipv4_address_is_not_run():
    result = _endpoint_check(own_config(), lambda: "<html>captive portal</html>")
    assert result.status == SKIP and "not an IPv4 address" in result.detail


def test_private_endpoint_needs_no_egress_check():
    def never():
        raise AssertionError("a private endpoint must not ask checkip")

    config = own_config(endpoint__access="private", endpoint__public_cidrs=None)
    assert _endpoint_check(config, never).status == SKIP


def test_fetch_egress_ip_asks_checkip_with_a_short_timeout(monkeypatch):
    import io

    asked = {}

    def urlopen(url, timeout):
        asked.update(url=url, timeout=timeout)
        return io.BytesIO(b"198.18.7.9\n")

    monkeypatch.setattr(preflight.urllib.request, "urlopen", urlopen)
    assert REAL_FETCH_EGRESS_IP() == "198.18.7.9"
    assert asked == {"url": "https://checkip.amazonaws.com", "timeout": preflight.CHECKIP_TIMEOUT_S}
    assert asked["timeout"] <= 10


# ----- the command ----------------------------------------------------------------------------


@pytest.fixture
def cli_sessions(own_session, monkeypatch):
    """Sessions the CLI creates get the same gap answers, in the user's own account; this
    machine's egress address is inside the own profile's public CIDR."""
    real_session = boto3.Session
    settings: dict = {}

    def make(*args, **kwargs):
        session = real_session(*args, **kwargs)
        ready_account(session, **settings)
        return session

    monkeypatch.setattr(boto3, "Session", make)
    monkeypatch.setattr(preflight, "fetch_egress_ip", lambda: OWN_EGRESS)
    return settings


@pytest.fixture
def own_profile(tmp_path) -> str:
    return str(profile_file(tmp_path, **OWN_CHANGES))


def test_preflight_command_passes_on_a_ready_account(cli_sessions, own_profile):
    result = run_cli("preflight", "--config", own_profile)
    assert result.code == 0, result.output
    assert "Preflight" in result.stdout and result.stdout.count("PASS") == 9


def test_preflight_command_fails_with_the_fix_and_exit_2(cli_sessions, own_profile):
    cli_sessions["p_vcpus"] = 96
    result = run_cli("preflight", "--config", own_profile, "--nodes", "2")
    assert result.code == 2
    assert "FAIL" in result.stdout and "request a quota increase" in result.stdout
    assert "1 preflight check(s) failed (vCPU quota: Running On-Demand P instances)" in result.stderr
    assert "Traceback" not in result.output


def test_preflight_command_on_a_shipped_profile_fails_on_its_placeholders(cli_sessions, monkeypatch):
    """The account moto answers as is the example one, so only the placeholder check fails; the
    egress address is outside 203.0.113.0/24, as every real address is."""
    monkeypatch.setenv("MOTO_ACCOUNT_ID", ACCOUNT)
    result = run_cli("preflight")
    assert result.code == 2
    table = " ".join(result.stdout.split())
    for field in ("account", "admin_principal_arn", "endpoint.public_cidrs"):
        assert f"{field}:" in table
    assert "set it to the 12-digit id of the account you deploy to" in table
    assert "add 198.18.7.9/32 (or your network's range) to endpoint.public_cidrs" in table
    # The placeholder admin role does not exist in the account either.
    assert (
        "3 preflight check(s) failed (admin principal, profile has no placeholders, API endpoint allows this "
        "machine)" in result.stderr
    )
    assert "Traceback" not in result.output


def test_preflight_command_prints_the_addon_fix(cli_sessions, own_profile):
    offers = offers_for_every_pin()
    offers[("1.35", "kube-proxy")] = ["v1.35.9-eksbuild.1"]
    cli_sessions["addon_offers"] = offers
    result = run_cli("preflight", "--config", own_profile)
    assert result.code == 2
    assert "set addons.versions.kube_proxy: v1.35.9-eksbuild.1" in " ".join(result.stdout.split())
    assert "(EKS add-on versions for 1.35)" in result.stderr
    assert "Traceback" not in result.output


def test_a_control_sequence_in_a_check_prints_escaped_not_to_the_terminal():
    """A kubeconfig context named with an escape sequence (the reliability probe's K1) is shown,
    never obeyed: the terminal's colours stay as they were."""
    console = Console(record=True, width=200, force_terminal=True)
    detail = "context 'ctx\x1b[31mRED\x1b[0m' not found"
    preflight.print_results([preflight.CheckResult("kubeconfig context", FAIL, detail, "fix\x07 it")], console)
    text = console.export_text(styles=False)
    assert "ctx\\x1b[31mRED\\x1b[0m" in text and "fix\\x07 it" in text
    assert "\x1b[31mRED" not in console.export_text(styles=True)


# ----- an existing cluster ----------------------------------------------------------------------


def test_without_a_usable_context_each_cluster_check_of_the_table_is_a_skip_row_under_its_name(tmp_path, monkeypatch):
    from nvrx_eks.ops import preflight_cluster

    def never(*_args):
        raise AssertionError("a cluster check ran without a usable kubeconfig context")

    checks = preflight_cluster.CLUSTER_CHECKS
    monkeypatch.setattr(preflight_cluster, "CLUSTER_CHECKS", (*checks, preflight.Check("a check added later", never)))
    cluster = {"context": "team-a", "namespace": "ml-jobs", "pvc": "shared", "image": "registry.example.com/t:1"}
    cluster["kubeconfig"] = str(tmp_path / "no-such-kubeconfig")
    results = preflight_cluster.cluster_checks(config_with(cluster=cluster), 2)
    assert (results[0].name, results[0].status) == ("kubeconfig context team-a", FAIL)
    assert [(r.name, r.status, r.detail) for r in results[1:]] == [
        (name, SKIP, "needs a usable kubeconfig context")
        for name in ("Kubernetes version", "namespace", "claim", "job API", "GPU nodes", "a check added later")
    ]
