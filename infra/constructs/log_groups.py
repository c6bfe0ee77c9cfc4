"""Log groups the stacks own, named and given a retention before anything writes to them: a group
that a service or agent creates on first write keeps its logs forever and outlives every stack.

Each is encrypted with a rotated key of its own. The group is named, so that the key policy can
name it: CloudWatch Logs uses the key only with the log group's ARN as encryption context, and
the grant is limited to that context. Whoever writes (VPC flow logs, EKS, the CloudWatch agent)
needs no key permission of its own: CloudWatch Logs encrypts.
"""

from __future__ import annotations

from aws_cdk import Aws, RemovalPolicy, Stack
from aws_cdk import aws_iam as iam
from aws_cdk import aws_logs as logs
from constructs import Construct

from infra.constructs.secure_defaults import rotated_key


def encrypted_log_group(
    scope: Construct,
    construct_id: str,
    *,
    name: str,
    retention: logs.RetentionDays,
    description: str,
    removal_policy: RemovalPolicy = RemovalPolicy.DESTROY,
) -> logs.LogGroup:
    """The log group `name` with `retention`, encrypted with a key (construct `<id>Key`) that only
    CloudWatch Logs may use, and only for this group."""
    stack = Stack.of(scope)
    key = rotated_key(scope, f"{construct_id}Key", description)
    key.add_to_resource_policy(
        iam.PolicyStatement(
            principals=[iam.ServicePrincipal(f"logs.{stack.region}.amazonaws.com")],
            actions=["kms:Encrypt*", "kms:Decrypt*", "kms:ReEncrypt*", "kms:GenerateDataKey*", "kms:Describe*"],
            resources=["*"],
            conditions={
                "ArnEquals": {
                    "kms:EncryptionContext:aws:logs:arn": (
                        f"arn:{Aws.PARTITION}:logs:{stack.region}:{stack.account}:log-group:{name}"
                    )
                }
            },
        )
    )
    return logs.LogGroup(
        scope,
        construct_id,
        log_group_name=name,
        retention=retention,
        encryption_key=key,
        removal_policy=removal_policy,
    )
