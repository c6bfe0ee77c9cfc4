"""A capacity reservation (an On-Demand Capacity Reservation or a Capacity Block) as EC2
describes it, read the same way by preflight, submit and `nvrx-eks capacity`.

EC2 shows a Capacity Block's instances only once the block starts: "Before a Capacity Block
reservation begins, the available capacity appears as zero. You can see how many instances will
be available in your Capacity Block by the tag value for the tag key
aws:ec2capacityreservation:incrementalRequestedQuantity" (EC2 User Guide, "View Capacity Blocks",
read 2026-12-02). So a `scheduled` block is sized by that tag, never by AvailableInstanceCount,
which would fail a valid block; its state goes `scheduled` -> `active` at StartDate, and EC2
begins terminating its instances 30 minutes before EndDate.
"""

from __future__ import annotations

import datetime

import boto3
from botocore.exceptions import ClientError

#: The tag a Capacity Block carries with the number of instances it will hold once it starts.
BLOCK_QUANTITY_TAG = "aws:ec2capacityreservation:incrementalRequestedQuantity"
SCHEDULED, ACTIVE = "scheduled", "active"
#: EC2 begins terminating a Capacity Block's instances this long before its EndDate.
BLOCK_END_TERMINATION = datetime.timedelta(minutes=30)
#: The errors EC2 gives for a reservation id that names nothing in the region.
_NOT_FOUND = {"InvalidCapacityReservationId.NotFound", "InvalidCapacityReservationId.Malformed"}


def describe(session: boto3.Session, region: str, reservation_id: str) -> dict | None:
    """The reservation as DescribeCapacityReservations gives it; None where it does not exist.
    Other errors (permissions, throttling) are raised for the caller to word."""
    ec2 = session.client("ec2", region_name=region)
    try:
        found = ec2.describe_capacity_reservations(CapacityReservationIds=[reservation_id])["CapacityReservations"]
    except ClientError as e:
        if e.response.get("Error", {}).get("Code") in _NOT_FOUND:
            return None
        raise
    return found[0] if found else None


def reserved_instances(reservation: dict) -> int:
    """The instances it holds, or, for a Capacity Block not started yet, will hold."""
    if reservation.get("State") == SCHEDULED:
        tags = {t["Key"]: t["Value"] for t in reservation.get("Tags", [])}
        if tags.get(BLOCK_QUANTITY_TAG, "").isdigit():
            return int(tags[BLOCK_QUANTITY_TAG])
    return reservation.get("TotalInstanceCount", 0)


def free_instances(reservation: dict) -> int:
    """Instances that can still launch into it: a scheduled block's whole size, else what EC2
    reports available (instances already running in it use the rest)."""
    if reservation.get("State") == SCHEDULED:
        return reserved_instances(reservation)
    return reservation.get("AvailableInstanceCount", 0)


def utc_text(moment: datetime.datetime | None) -> str:
    return "an unknown time" if moment is None else moment.astimezone(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")


def duration_text(delta: datetime.timedelta) -> str:
    """A time span as `capacity` messages say it: days and hours, or minutes under an hour."""
    minutes = int(delta.total_seconds() // 60)
    if minutes < 60:
        return f"{max(minutes, 0)} min"
    days, hours = divmod(minutes // 60, 24)
    return f"{days} d {hours} h" if days else f"{hours} h {minutes % 60} min"
