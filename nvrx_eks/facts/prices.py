"""What the parts of a deployment that outlive a training run cost, us-east-1 list prices.

`nvrx-eks teardown` prices what it keeps with these, and `nvrx-eks plan` says in one line what
stays billed after a run; the GPU node prices are in nvrx_eks/facts/instances.py. Every figure
is an ESTIMATE for a cost line, not a bill: it leaves out requests, data transfer and taxes, and
AWS changes prices without notice. Sources, read 2026-12-02:
- FSx for Lustre PERSISTENT_2 SSD storage, per GB-month by throughput tier (MB/s/TiB):
  https://aws.amazon.com/fsx/lustre/pricing/. 125: $0.145, confirmed by a third-party estimator
  that reads AWS's price list (c3x.dev: "1.2 TB at 125 MB/s/TiB is ~$174/month"). 250: $0.210,
  500: $0.340, 1000: $0.600 are the page's figures as remembered, NOT confirmed from here: a
  2022 ap-northeast-1 table (per-hour prices by tier) has the same tier ratios within 10%, which
  would put 1000 MB/s/TiB at up to ~$0.65 in us-east-1. Metadata IOPS beyond AUTOMATIC's are extra.
- S3 Standard, first 50 TB: $0.023 per GB-month (https://aws.amazon.com/s3/pricing/).
- NAT gateway: $0.045 per hour plus $0.045 per GB processed; a public IPv4 address (the NAT
  gateway's Elastic IP): $0.005 per hour (https://aws.amazon.com/vpc/pricing/; third-party 2026
  guides quote the same us-east-1 rates).
- KMS customer managed key: $1 per month, plus $1 per month for each of its first two automatic
  rotations; none for a key scheduled for deletion (https://aws.amazon.com/kms/pricing/).
- CloudWatch Logs storage: $0.03 per GB-month (https://aws.amazon.com/cloudwatch/pricing/, as
  remembered; not confirmed from here).
"""

from __future__ import annotations

#: The month AWS's pricing pages use to turn hourly prices into monthly ones.
HOURS_PER_MONTH = 730

#: FSx for Lustre PERSISTENT_2 SSD storage, USD per GB-month, by throughput tier (MB/s/TiB).
FSX_PERSISTENT_2_USD_PER_GB_MONTH: dict[int, float] = {125: 0.145, 250: 0.210, 500: 0.340, 1000: 0.600}
S3_STANDARD_USD_PER_GB_MONTH = 0.023
NAT_GATEWAY_USD_PER_HOUR = 0.045
PUBLIC_IPV4_USD_PER_HOUR = 0.005
KMS_KEY_USD_PER_MONTH = 1.0
CLOUDWATCH_LOGS_USD_PER_GB_MONTH = 0.03
#: Where the figures above come from, as the cost lines name it.
PRICES_SOURCE = "us-east-1 list prices read 2026-12-02, nvrx_eks/facts/prices.py"


def fsx_usd_per_month(storage_gib: int, throughput_per_tib: int) -> float:
    """A PERSISTENT_2 SSD file system's storage per month. FSx prices its capacity in GB-months
    and counts the capacity you provision (GiB) as that many GB, as AWS's own examples do."""
    return storage_gib * FSX_PERSISTENT_2_USD_PER_GB_MONTH[throughput_per_tib]


def nat_gateway_usd_per_month() -> float:
    """One NAT gateway and its public IPv4 address, idle (processing is per GB on top)."""
    return (NAT_GATEWAY_USD_PER_HOUR + PUBLIC_IPV4_USD_PER_HOUR) * HOURS_PER_MONTH
