"""teardown's data side against moto: with --delete-data the data bucket goes before the bucket
it logs into, through late access-log deliveries; what a default teardown keeps is listed with a
monthly estimate, before confirmation and in the final report. Fixtures: test_teardown.py."""

from __future__ import annotations

import json

import boto3
import pytest
from rich.console import Console

from nvrx_eks.deploy.deployment import load_deployment
from nvrx_eks.facts.errors import ConfigError
from nvrx_eks.facts.prices import HOURS_PER_MONTH, NAT_GATEWAY_USD_PER_HOUR, PUBLIC_IPV4_USD_PER_HOUR
from nvrx_eks.ops.teardown_data import BUCKET_DELETE_TRIES
from tests.support.cli_harness import REGION
from tests.unit.ops import test_teardown
from tests.unit.ops.test_teardown import CLUSTER, DATA_BUCKET, LOG_BUCKET, NETWORK, STORAGE, FakeCdk, _teardown

aws = test_teardown.aws
k8s_server = test_teardown.k8s_server
deployed = test_teardown.deployed


def log_data_bucket_accesses(s3) -> None:
    """The storage stack's set-up: the data bucket logs into the access-log bucket, whose policy
    lets S3's logging service write (CDK writes that policy for a bucket with ACLs off)."""
    policy = {
        "Version": "2012-10-17",
        "Statement": [
            {
                "Effect": "Allow",
                "Principal": {"Service": "logging.s3.amazonaws.com"},
                "Action": "s3:PutObject",
                "Resource": f"arn:aws:s3:::{LOG_BUCKET}/*",
            }
        ],
    }
    s3.put_bucket_policy(Bucket=LOG_BUCKET, Policy=json.dumps(policy))
    s3.put_bucket_logging(
        Bucket=DATA_BUCKET,
        BucketLoggingStatus={"LoggingEnabled": {"TargetBucket": LOG_BUCKET, "TargetPrefix": "data-bucket/"}},
    )


class LateLogDelivery:
    """S3 delivering the data bucket's access logs late: every DeleteBucket of the log bucket is
    preceded by a new log object, `deliveries` times, so that delete finds it not empty."""

    def __init__(self, session: boto3.Session, deliveries: int):
        self.left, self.deleted, self.logging_off = deliveries, [], []
        self.s3 = boto3.client("s3", region_name=REGION)
        session.events.register("before-parameter-build.s3.DeleteBucket", self._delete)
        session.events.register("before-parameter-build.s3.PutBucketLogging", self._logging)

    def _delete(self, params, **_):
        self.deleted.append(params["Bucket"])
        if params["Bucket"] == LOG_BUCKET and self.left:
            self.left -= 1
            self.s3.put_object(Bucket=LOG_BUCKET, Key=f"data-bucket/late-{self.left}", Body=b"REST.GET.OBJECT ...")

    def _logging(self, params, **_):
        if not params["BucketLoggingStatus"]:
            self.logging_off.append((params["Bucket"], len(self.deleted)))


def text_of(console_text: str) -> str:
    """Printed text with table rules and runs of spaces collapsed, for row assertions."""
    return " ".join(console_text.replace("│", " ").split())


def test_delete_data_deletes_the_log_bucket_last_through_late_deliveries(deployed):
    """(first-contact 6) list_buckets names the access-log bucket first; deleted first, it refills
    with the data bucket's late access logs and BucketNotEmpty stops the teardown halfway. Now:
    logging off, the data bucket, then the log bucket, emptied again when a late log lands."""
    server, session, left = deployed
    log_data_bucket_accesses(boto3.client("s3", region_name=REGION))
    late = LateLogDelivery(session, deliveries=2)
    result = _teardown(session, delete_data=True, run_cdk=FakeCdk(server), bucket_retry_wait_s=0.01)

    assert late.logging_off == [(DATA_BUCKET, 0)]  # before any bucket was deleted
    assert late.deleted == [DATA_BUCKET, LOG_BUCKET, LOG_BUCKET, LOG_BUCKET]
    assert {DATA_BUCKET, LOG_BUCKET}.isdisjoint(left.buckets())
    assert result.data_deleted.buckets == [DATA_BUCKET, LOG_BUCKET]
    assert result.stacks_destroyed == [CLUSTER, STORAGE, NETWORK]


def test_a_log_bucket_that_keeps_refilling_stops_the_teardown_after_a_bounded_number_of_tries(deployed):
    server, session, left = deployed
    log_data_bucket_accesses(boto3.client("s3", region_name=REGION))
    late = LateLogDelivery(session, deliveries=10**6)
    cdk = FakeCdk(server)
    with pytest.raises(ConfigError) as error:
        _teardown(session, delete_data=True, run_cdk=cdk, bucket_retry_wait_s=0.01)
    message = str(error.value)
    assert "\n" not in message
    assert message.startswith(f"bucket {LOG_BUCKET} filled again after each of {BUCKET_DELETE_TRIES} emptyings")
    assert message.endswith("run `nvrx-eks teardown --delete-data` again in an hour to finish")
    assert late.deleted == [DATA_BUCKET] + [LOG_BUCKET] * BUCKET_DELETE_TRIES
    assert DATA_BUCKET not in left.buckets() and LOG_BUCKET in left.buckets()
    assert cdk.stacks == [CLUSTER] and left.stacks() == {STORAGE, NETWORK}


#: What CDK's network stack holds that bills by the month: the NAT gateway with its Elastic IP, the
#: flow-log key and log group (beside the VPC).
NETWORK_TEMPLATE = {
    "Resources": {
        "Vpc": {"Type": "AWS::EC2::VPC", "Properties": {"CidrBlock": "10.9.0.0/16"}},
        "Public": {"Type": "AWS::EC2::Subnet", "Properties": {"VpcId": {"Ref": "Vpc"}, "CidrBlock": "10.9.0.0/24"}},
        "NatAddress": {"Type": "AWS::EC2::EIP", "Properties": {"Domain": "vpc"}},
        "Nat": {
            "Type": "AWS::EC2::NatGateway",
            "Properties": {
                "SubnetId": {"Ref": "Public"},
                "AllocationId": {"Fn::GetAtt": ["NatAddress", "AllocationId"]},
            },
        },
        "FlowLogKey": {
            "Type": "AWS::KMS::Key",
            "Properties": {"KeyPolicy": {"Version": "2012-10-17", "Statement": []}, "EnableKeyRotation": True},
        },
        "FlowLogs": {
            "Type": "AWS::Logs::LogGroup",
            "Properties": {"LogGroupName": "/nvrx-eks/vpc-flow-logs", "RetentionInDays": 30},
        },
    }
}


def test_the_plan_and_the_report_price_what_a_default_teardown_keeps(deployed):
    """(first-contact 7, deploy N5) The FSx file system by capacity and throughput tier, the
    network stack's NAT gateway, address and key, the buckets with their noncurrent versions (with
    the expiry fsx.runs_copy_days gives them), the audit log group: each with a monthly estimate,
    printed before the confirmation and again after the teardown."""
    server, session, left = deployed
    boto3.client("cloudformation", region_name=REGION).update_stack(
        StackName=NETWORK, TemplateBody=json.dumps(NETWORK_TEMPLATE)
    )
    s3 = boto3.client("s3", region_name=REGION)
    for body in (b"x" * 3_000_000, b"y" * 2_000_000):  # a checkpoint shard replaced: 3 MB noncurrent
        s3.put_object(Bucket=DATA_BUCKET, Key="runs/train/step_100/shard_0.distcp", Body=body)

    console = Console(width=250, record=True)
    questions = []
    _teardown(session, yes=False, console=console, confirm=lambda q: questions.append(console.export_text()) or False)
    before = text_of(questions[0])
    nat = (NAT_GATEWAY_USD_PER_HOUR * HOURS_PER_MONTH, PUBLIC_IPV4_USD_PER_HOUR * HOURS_PER_MONTH)
    for row in (
        f"FSx file system {left.file_system} 4800 GiB PERSISTENT_2 at 1000 MB/s/TiB 2,880.00",
        f"1x NAT gateway in stack {NETWORK} {nat[0]:,.2f}",
        f"1x public IPv4 address (the NAT gateway's) in stack {NETWORK} {nat[1]:,.2f}",
        f"in stack {NETWORK} 1.00",  # the KMS key
        "log group /nvrx-eks/vpc-flow-logs 0.0 MB 0.00 in stack nvrx-eks-network; kept 30 days",
        f"S3 bucket {DATA_BUCKET} 2.0 MB 0.00",
        "its noncurrent versions (deleted or replaced files) 3.0 MB 0.00 S3 expires those under runs/ "
        f"{load_deployment().config.fsx.runs_copy_days} days",
        "log group /aws/eks/nvrx-eks/cluster 0.0 MB 0.00 EKS control-plane and audit log; kept forever",
    ):
        assert row in before, row
    assert "Still billed after this teardown (monthly estimates from us-east-1 list prices read 2026-12-02" in before
    assert f"total {2880 + sum(nat) + 1:,.2f}" in before

    console = Console(width=250, record=True)
    _teardown(session, console=console, run_cdk=FakeCdk(server))
    report = text_of(console.export_text().split("Leftover resources")[1])
    assert f"FSx file system {left.file_system} 4800 GiB PERSISTENT_2 at 1000 MB/s/TiB 2,880.00" in report
    assert f"total {2880 + sum(nat) + 1:,.2f}" in report
    assert "teardown --delete-data deletes the data and its stacks, and with them these charges" in report


def test_delete_data_keeps_nothing_billed(deployed):
    server, session, _ = deployed
    console = Console(width=250, record=True)
    result = _teardown(session, delete_data=True, console=console, run_cdk=FakeCdk(server))
    assert result.still_billed == []
    assert console.export_text().count("Still billed after this teardown: nothing teardown found") == 2
