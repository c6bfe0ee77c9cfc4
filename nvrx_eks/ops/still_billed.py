"""What stays billed after a run or a teardown, priced per month from nvrx_eks/facts/prices.py.

Default teardown keeps the data and what it needs: the FSx file system (its storage by throughput
tier), the network stack (its NAT gateway and that gateway's public address, its KMS key, its
flow-log group), the S3 buckets (current objects, and the noncurrent versions that deleted and
replaced checkpoints leave for fsx.runs_copy_days) and the control-plane log groups (the audit
log). Teardown lists each with a monthly estimate in its plan, before anything is deleted, and in
its final report; `nvrx-eks plan` says in one line what stays after a run. The figures are
estimates from list prices (their sources in the facts module); sizes come from AWS where teardown
can read them.
"""

from __future__ import annotations

from dataclasses import dataclass

import boto3
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from infra.config import DeploymentConfig
from nvrx_eks.facts.names import RUNS_COPY_PREFIX
from nvrx_eks.facts.prices import (
    CLOUDWATCH_LOGS_USD_PER_GB_MONTH,
    HOURS_PER_MONTH,
    KMS_KEY_USD_PER_MONTH,
    NAT_GATEWAY_USD_PER_HOUR,
    PRICES_SOURCE,
    PUBLIC_IPV4_USD_PER_HOUR,
    S3_STANDARD_USD_PER_GB_MONTH,
    fsx_usd_per_month,
    nat_gateway_usd_per_month,
)
from nvrx_eks.ops.teardown_data import RetainedData

#: Pages of object versions (1,000 each) read per bucket to size it; past that the sizes shown
#: are lower bounds, and said to be (a long run leaves hundreds of thousands of versions).
MAX_VERSION_PAGES = 200
GB = 1e9

#: Resources of a kept stack that bill by the month whatever runs: CloudFormation type -> (what,
#: USD per month each). Log groups are priced by their stored bytes instead.
_STACK_RESOURCE_PRICES: dict[str, tuple[str, float]] = {
    "AWS::EC2::NatGateway": ("NAT gateway", NAT_GATEWAY_USD_PER_HOUR * HOURS_PER_MONTH),
    "AWS::EC2::EIP": ("public IPv4 address (the NAT gateway's)", PUBLIC_IPV4_USD_PER_HOUR * HOURS_PER_MONTH),
    "AWS::KMS::Key": ("KMS key (+$1/month for each of its first two yearly rotations)", KMS_KEY_USD_PER_MONTH),
}


@dataclass(frozen=True)
class BilledLine:
    what: str
    size: str
    usd_per_month: float
    note: str = ""


def kept_after_run_line(config: DeploymentConfig) -> str:
    """One line for `plan`: what a default teardown keeps billing each month, from the profile."""
    fsx = config.fsx
    file_system = fsx_usd_per_month(fsx.storage_gib, fsx.throughput_per_tib)
    return (
        f"After the run: `nvrx-eks teardown` keeps the data, billed until `teardown --delete-data`: FSx "
        f"{fsx.storage_gib} GiB at {fsx.throughput_per_tib} MB/s/TiB ~${file_system:,.0f}/month, the NAT "
        f"gateway and its address ~${nat_gateway_usd_per_month():,.0f}/month, and S3 at "
        f"${S3_STANDARD_USD_PER_GB_MONTH}/GB-month, deleted checkpoints included for fsx.runs_copy_days "
        f"({fsx.runs_copy_days} days) as noncurrent versions (estimates from {PRICES_SOURCE})"
    )


def _gb(nbytes: float) -> str:
    return f"{nbytes / GB:,.1f} GB" if nbytes >= GB / 10 else f"{nbytes / 1e6:,.1f} MB"


def _file_system_lines(session: boto3.Session, config: DeploymentConfig, file_systems: list[str]) -> list[BilledLine]:
    if not file_systems:
        return []
    fsx = session.client("fsx", region_name=config.region)
    lines = []
    for fs in fsx.describe_file_systems(FileSystemIds=file_systems)["FileSystems"]:
        gib = fs.get("StorageCapacity", config.fsx.storage_gib)
        tier = fs.get("LustreConfiguration", {}).get("PerUnitStorageThroughput") or config.fsx.throughput_per_tib
        lines.append(
            BilledLine(
                f"FSx file system {fs['FileSystemId']}",
                f"{gib} GiB PERSISTENT_2 at {tier} MB/s/TiB",
                fsx_usd_per_month(gib, tier),
                "checkpoints and data; billed by capacity, not by use",
            )
        )
    return lines


def _bucket_bytes(s3, bucket: str) -> tuple[int, int, bool]:
    """(current bytes, noncurrent bytes, whether every version was read)."""
    current = noncurrent = 0
    pages = s3.get_paginator("list_object_versions").paginate(Bucket=bucket)
    for number, page in enumerate(pages, start=1):
        for version in page.get("Versions", []):
            if version.get("IsLatest"):
                current += version.get("Size", 0)
            else:
                noncurrent += version.get("Size", 0)
        if number >= MAX_VERSION_PAGES and page.get("IsTruncated"):
            return current, noncurrent, False
    return current, noncurrent, True


def _bucket_lines(session: boto3.Session, config: DeploymentConfig, buckets: list[str]) -> list[BilledLine]:
    s3 = session.client("s3", region_name=config.region)
    lines = []
    for bucket in buckets:
        current, noncurrent, complete = _bucket_bytes(s3, bucket)
        at_least = "" if complete else "at least "
        lines.append(
            BilledLine(f"S3 bucket {bucket}", at_least + _gb(current), current / GB * S3_STANDARD_USD_PER_GB_MONTH)
        )
        if noncurrent:
            lines.append(
                BilledLine(
                    "  its noncurrent versions (deleted or replaced files)",
                    at_least + _gb(noncurrent),
                    noncurrent / GB * S3_STANDARD_USD_PER_GB_MONTH,
                    f"S3 expires those under {RUNS_COPY_PREFIX}/ {config.fsx.runs_copy_days} days after the "
                    "deletion (fsx.runs_copy_days); a running job adds more",
                )
            )
    return lines


def _log_group_line(logs, name: str, note: str) -> BilledLine | None:
    groups = [g for g in logs.describe_log_groups(logGroupNamePrefix=name)["logGroups"] if g["logGroupName"] == name]
    if not groups:
        return None
    stored = groups[0].get("storedBytes", 0)
    retention = groups[0].get("retentionInDays")
    kept = f"kept {retention} days" if retention else "kept forever (no retention)"
    return BilledLine(
        f"log group {name}", _gb(stored), stored / GB * CLOUDWATCH_LOGS_USD_PER_GB_MONTH, f"{note}; {kept}"
    )


def _stack_lines(session: boto3.Session, config: DeploymentConfig, stacks: list[str]) -> list[BilledLine]:
    cfn = session.client("cloudformation", region_name=config.region)
    logs = session.client("logs", region_name=config.region)
    lines = []
    for stack in stacks:
        counts: dict[str, int] = {}
        log_groups: list[str] = []
        for page in cfn.get_paginator("list_stack_resources").paginate(StackName=stack):
            for resource in page["StackResourceSummaries"]:
                kind = resource["ResourceType"]
                if resource.get("ResourceStatus", "").startswith("DELETE"):
                    continue
                if kind in _STACK_RESOURCE_PRICES:
                    counts[kind] = counts.get(kind, 0) + 1
                elif kind == "AWS::Logs::LogGroup":
                    log_groups.append(resource["PhysicalResourceId"])
        for kind, count in counts.items():
            what, usd = _STACK_RESOURCE_PRICES[kind]
            lines.append(BilledLine(f"{count}x {what}", f"in stack {stack}", count * usd))
        for name in log_groups:
            line = _log_group_line(logs, name, f"in stack {stack}")
            if line is not None:
                lines.append(line)
    return lines


def still_billed(
    session: boto3.Session,
    config: DeploymentConfig,
    *,
    kept: RetainedData,
    kept_stacks: list[str],
    keeps_audit_logs: bool,
) -> list[BilledLine]:
    """Each thing a teardown leaves that bills by the month, with its size and estimate: `kept`,
    the data it keeps; `kept_stacks`, the stacks it leaves; `keeps_audit_logs`, whether the
    control-plane log groups stay (without --delete-data)."""
    lines = _file_system_lines(session, config, kept.file_systems) + _bucket_lines(session, config, kept.buckets)
    lines += _stack_lines(session, config, kept_stacks)
    if keeps_audit_logs:
        logs = session.client("logs", region_name=config.region)
        prefix = f"/aws/eks/{config.cluster_name}/"
        for page in logs.get_paginator("describe_log_groups").paginate(logGroupNamePrefix=prefix):
            for group in page["logGroups"]:
                line = _log_group_line(logs, group["logGroupName"], "EKS control-plane and audit log")
                if line is not None:
                    lines.append(line)
    return lines


def print_still_billed(console: Console, lines: list[BilledLine], title: str) -> None:
    if not lines:
        console.print(f"{title}: nothing teardown found of this deployment")
        return
    table = Table(title=f"{title} (monthly estimates from {PRICES_SOURCE})", title_justify="left")
    for column in ("still billed", "size", "$/month", "note"):
        table.add_column(column, justify="right" if column == "$/month" else "left")
    for line in lines:
        table.add_row(escape(line.what), escape(line.size), f"{line.usd_per_month:,.2f}", escape(line.note))
    table.add_row("[bold]total[/]", "", f"[bold]{sum(line.usd_per_month for line in lines):,.2f}[/]", "")
    console.print(table)
