"""The data of a deployment, as teardown finds and deletes it: the FSx file system(s) and the
S3 buckets of the storage stack. Nothing here runs without `teardown --delete-data` except the
look-ups (find_retained_data).

Order matters for both:
- a file system is deleted and waited for until FSx has removed it: its network interfaces block
  the network stack's subnet and security group deletes;
- the data bucket goes before the bucket it sends its S3 server access logs to. S3 delivers access
  logs on a best-effort basis, minutes (or more) after the requests, so a log bucket emptied
  first refills with the logs of the data bucket's last activity before it can be deleted
  (BucketNotEmpty). Logging is turned off on every bucket first, the log bucket is deleted last,
  and a bucket that refilled between its emptying and its deletion is emptied again, a bounded
  number of times.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection
from dataclasses import dataclass, field

import boto3
from botocore.exceptions import ClientError
from rich.console import Console

from infra.config import DeploymentConfig
from nvrx_eks.deploy.stack_outputs import StackOutputs, aws_error
from nvrx_eks.facts.errors import ConfigError
from nvrx_eks.facts.names import DEPLOYMENT_TAG_KEY

#: Times a bucket is emptied and its deletion tried before teardown stops; a late access-log
#: delivery refills a log bucket seconds after its emptying at most a few times.
BUCKET_DELETE_TRIES = 5
#: Seconds between those tries: long enough for a burst of late log deliveries to land.
BUCKET_RETRY_WAIT_S = 20.0


@dataclass
class RetainedData:
    buckets: list[str] = field(default_factory=list)
    file_systems: list[str] = field(default_factory=list)


def deployment_file_systems(
    session: boto3.Session,
    config: DeploymentConfig,
    outputs: StackOutputs | None,
    *,
    subnets: Collection[str] | None = None,
) -> dict[str, dict]:
    """This deployment's FSx file systems (by tag or the cluster stack's output) by id, any
    lifecycle; with `subnets`, any file system in one of those subnets instead."""
    fsx = session.client("fsx", region_name=config.region)
    found = {}
    for page in fsx.get_paginator("describe_file_systems").paginate():
        for fs in page["FileSystems"]:
            if subnets is not None:
                if set(fs.get("SubnetIds", [])) & set(subnets):
                    found[fs["FileSystemId"]] = fs
                continue
            tags = {t["Key"]: t["Value"] for t in fs.get("Tags", [])}
            if tags.get(DEPLOYMENT_TAG_KEY) == config.name or (
                outputs and fs["FileSystemId"] == outputs.fsx_file_system_id
            ):
                found[fs["FileSystemId"]] = fs
    return found


def find_retained_data(session: boto3.Session, config: DeploymentConfig, outputs: StackOutputs | None) -> RetainedData:
    """The data bucket(s) and FSx file system(s) of this deployment, from the outputs or by tag."""
    data = RetainedData()
    for fs_id, fs in deployment_file_systems(session, config, outputs).items():
        if fs.get("Lifecycle") != "DELETING":
            data.file_systems.append(fs_id)
    s3 = session.client("s3", region_name=config.region)
    for bucket in s3.list_buckets().get("Buckets", []):
        name = bucket["Name"]
        if outputs and name == outputs.data_bucket_name:
            data.buckets.append(name)
            continue
        if not name.startswith(config.stack_name("storage")):
            continue  # CloudFormation names our buckets <stack>-<logical id>-<suffix>
        try:
            tags = {t["Key"]: t["Value"] for t in s3.get_bucket_tagging(Bucket=name)["TagSet"]}
        except ClientError:
            continue
        if tags.get(DEPLOYMENT_TAG_KEY) == config.name:
            data.buckets.append(name)
    return data


def delete_file_systems(
    session: boto3.Session,
    config: DeploymentConfig,
    file_system_ids: list[str],
    outputs: StackOutputs | None,
    console: Console,
    *,
    timeout_s: float,
    poll_s: float,
) -> list[str]:
    """Delete the file systems, then wait until the deployment has none left (including any a
    previous run left DELETING): until FSx has removed a file system's network interfaces, its
    subnet and security group cannot be deleted, so the network stack's destroy would fail."""
    fsx = session.client("fsx", region_name=config.region)
    deleted = []
    for file_system_id in file_system_ids:
        try:
            fsx.delete_file_system(FileSystemId=file_system_id)
        except ClientError as e:
            if e.response.get("Error", {}).get("Code") != "FileSystemNotFound":
                raise aws_error(e, config, f"deleting file system {file_system_id}") from None
        deleted.append(file_system_id)
        console.print(f"deleting FSx file system {file_system_id}")
    deadline = time.monotonic() + timeout_s
    announced = False
    while left := deployment_file_systems(session, config, outputs):
        for file_system_id, fs in sorted(left.items()):
            lifecycle = fs.get("Lifecycle", "")
            if lifecycle != "DELETING":
                reason = fs.get("FailureDetails", {}).get("Message", "")
                raise ConfigError(
                    f"FSx file system {file_system_id} is {lifecycle or 'still there'} after its deletion was "
                    f"requested{f' ({reason})' if reason else ''}; nothing after it was deleted. Fix the cause "
                    "(see the file system in the FSx console), or delete it there, then run teardown "
                    "--delete-data again"
                )
        if time.monotonic() > deadline:
            raise ConfigError(
                f"FSx file system {', '.join(sorted(left))} is still DELETING after {timeout_s:.0f} s; the "
                "storage and network stacks were not destroyed because they cannot go before it. Wait until "
                f"`aws fsx describe-file-systems --region {config.region}` no longer lists it, then run "
                "teardown --delete-data again"
            )
        if not announced:
            console.print(f"waiting for FSx to finish deleting {', '.join(sorted(left))} (this takes minutes)")
            announced = True
        time.sleep(poll_s)
    return deleted


def _empty_bucket(s3, name: str) -> None:
    """Versioned bucket: every object version and delete marker must go before the bucket can."""
    for page in s3.get_paginator("list_object_versions").paginate(Bucket=name):
        keys = [
            {"Key": v["Key"], "VersionId": v["VersionId"]}
            for v in page.get("Versions", []) + page.get("DeleteMarkers", [])
        ]
        for start in range(0, len(keys), 1000):
            s3.delete_objects(Bucket=name, Delete={"Objects": keys[start : start + 1000], "Quiet": True})


def _error_code(error: ClientError) -> str:
    return error.response.get("Error", {}).get("Code", "")


def log_buckets_last(s3, buckets: list[str]) -> list[str]:
    """`buckets` with access logging turned off, the ones the others log into moved last."""
    targets = set()
    for bucket in buckets:
        logging = s3.get_bucket_logging(Bucket=bucket).get("LoggingEnabled")
        if logging:
            targets.add(logging["TargetBucket"])
            s3.put_bucket_logging(Bucket=bucket, BucketLoggingStatus={})
    return [b for b in buckets if b not in targets] + [b for b in buckets if b in targets]


def delete_buckets(
    session: boto3.Session,
    config: DeploymentConfig,
    buckets: list[str],
    console: Console,
    *,
    on_deleted: Callable[[str], None],
    tries: int = BUCKET_DELETE_TRIES,
    wait_s: float = BUCKET_RETRY_WAIT_S,
) -> None:
    """Empty and delete every bucket, a log bucket after the buckets that log into it (module
    docstring); `on_deleted(name)` after each, so a stop halfway still reports what went."""
    s3 = session.client("s3", region_name=config.region)
    for bucket in log_buckets_last(s3, buckets):
        console.print(f"emptying and deleting bucket {bucket}")
        for attempt in range(1, tries + 1):
            _empty_bucket(s3, bucket)
            try:
                s3.delete_bucket(Bucket=bucket)
                break
            except ClientError as e:
                if _error_code(e) != "BucketNotEmpty":
                    raise
                if attempt == tries:
                    raise ConfigError(
                        f"bucket {bucket} filled again after each of {tries} emptyings (S3 delivers access logs "
                        "late; logging into it is off now), so it and the storage and network stacks are still "
                        "there; what came before it is deleted: run `nvrx-eks teardown --delete-data` again in "
                        "an hour to finish"
                    ) from None
                console.print(f"  bucket {bucket} received objects while it was emptied (late access logs); again")
                time.sleep(wait_s)
        on_deleted(bucket)
