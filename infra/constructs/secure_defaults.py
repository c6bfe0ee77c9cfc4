"""Resources with the project's security defaults stated once: rotated KMS keys, private S3 buckets."""

from __future__ import annotations

from typing import Any

from aws_cdk import RemovalPolicy
from aws_cdk import aws_kms as kms
from aws_cdk import aws_s3 as s3
from constructs import Construct


def rotated_key(scope: Construct, construct_id: str, description: str) -> kms.Key:
    """A customer-managed key with yearly rotation. It goes with its stack: what it encrypts
    (cluster secrets, flow logs) is deleted with the stack too."""
    return kms.Key(
        scope,
        construct_id,
        enable_key_rotation=True,
        description=description,
        removal_policy=RemovalPolicy.DESTROY,
    )


def private_bucket(scope: Construct, construct_id: str, *, removal_policy: RemovalPolicy, **props: Any) -> s3.Bucket:
    """An S3 bucket that is encrypted, unreachable from the public and TLS-only. It is never
    emptied on delete: with removal_policy destroy, a non-empty bucket makes the delete fail rather
    than lose data silently (teardown --delete-data empties it)."""
    return s3.Bucket(
        scope,
        construct_id,
        encryption=s3.BucketEncryption.S3_MANAGED,
        block_public_access=s3.BlockPublicAccess.BLOCK_ALL,
        enforce_ssl=True,
        removal_policy=removal_policy,
        auto_delete_objects=False,
        **props,
    )
