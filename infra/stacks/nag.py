"""cdk-nag (AwsSolutions) on every synth, and every accepted finding with its reason.

Each acknowledgment names one granular finding id on one construct and says why it is accepted.
Any other finding fails synth (exit 1), and the tests assert the validation report is clean.
"""

from __future__ import annotations

from aws_cdk import Acknowledgment, App, Stack, Validations
from cdk_nag import AwsSolutionsChecks
from constructs import IConstruct

from infra.stacks.environment import TrainingEnvironment

_MANAGED = "AwsSolutions-IAM4[Policy::arn:<AWS::Partition>:iam::aws:policy/{}]"

_NODE_ROLE_POLICIES = {
    "AmazonEKSWorkerNodePolicy": "required by every EKS worker node to register with the cluster",
    "AmazonEC2ContainerRegistryPullOnly": "the narrowest AWS policy that lets the kubelet pull images from ECR",
    "AmazonEKS_CNI_Policy": (
        "the VPC CNI must attach ENIs and IPs before any pod (including the Pod Identity agent) "
        "can run, so it uses the node role as EKS documents"
    ),
    "AmazonSSMManagedInstanceCore": "Session Manager access to debug nodes without SSH keys or open ports",
}

#: (construct path inside the cluster stack, finding id, reason)
CLUSTER_STACK_ACKNOWLEDGMENTS: list[tuple[str, str, str]] = [
    (
        "Cluster/Role",
        _MANAGED.format("AmazonEKSClusterPolicy"),
        "the EKS service role must carry the AWS-managed AmazonEKSClusterPolicy; EKS documents no custom alternative",
    ),
    *[
        (
            f"Cluster/KubectlProvider/{fn}/ServiceRole",
            _MANAGED.format(f"service-role/{policy}"),
            "role of the aws-cdk-lib managed kubectl provider Lambda; it runs in the VPC to reach the "
            "private API endpoint and needs exactly the Lambda basic/VPC execution permissions",
        )
        for fn in ("Handler", "Provider/framework-onEvent")
        for policy in ("AWSLambdaBasicExecutionRole", "AWSLambdaVPCAccessExecutionRole")
    ],
    (
        "Cluster/KubectlProvider/Handler/ServiceRole",
        _MANAGED.format("AmazonEC2ContainerRegistryReadOnly"),
        "the kubectl provider pulls OCI Helm charts (JobSet) and must read ECR; set by aws-cdk-lib",
    ),
    (
        "Cluster/KubectlProvider/Handler/ServiceRole",
        'AwsSolutions-IAM4[Policy::{"Fn::If":["ClusterKubectlProviderHandlerHasEcrPublic69E09706",'
        '{"Fn::Join":["",["arn:",{"Ref":"AWS::Partition"},'
        '":iam::aws:policy/AmazonElasticContainerRegistryPublicReadOnly"]]},{"Ref":"AWS::NoValue"}]}]',
        "conditional ECR Public read for OCI charts hosted on public.ecr.aws; set by aws-cdk-lib",
    ),
    (
        "Cluster/KubectlProvider/Handler",
        "AwsSolutions-L1",
        "aws-cdk-lib pins the kubectl handler's runtime to the one the kubectl/helm layers are built for",
    ),
    (
        "Cluster/KubectlProvider/Provider/framework-onEvent/ServiceRole/DefaultPolicy",
        "AwsSolutions-IAM5[Resource::<ClusterKubectlProviderHandler2E05C68A.Arn>:*]",
        "the custom-resource framework invokes the kubectl handler and its versions (ARN:*), nothing else",
    ),
    *[
        (role, _MANAGED.format(policy), f"EKS worker node role: {reason}")
        for role in ("SystemNodeRole", "GpuNodeRole")
        for policy, reason in _NODE_ROLE_POLICIES.items()
    ],
    (
        "PodIdentityRole-aws-fsx-csi-driver/DefaultPolicy",
        "AwsSolutions-IAM5[Resource::*]",
        "fsx:DescribeFileSystems supports no resource-level permissions; it is the only action granted",
    ),
    (
        "PodIdentityRole-amazon-cloudwatch-observability",
        _MANAGED.format("CloudWatchAgentServerPolicy"),
        "the policy AWS documents for the CloudWatch Observability add-on's agent (metrics and logs only)",
    ),
]


def enable_nag(app: App) -> None:
    Validations.of(app).add_plugins(AwsSolutionsChecks(app, verbose=True))


def acknowledge_findings(environment: TrainingEnvironment) -> int:
    """Apply the table; returns how many acknowledgments applied to this configuration."""
    return _acknowledge(environment.cluster, CLUSTER_STACK_ACKNOWLEDGMENTS)


def _acknowledge(stack: Stack, entries: list[tuple[str, str, str]]) -> int:
    applied = 0
    for path, finding_id, reason in entries:
        scope: IConstruct = stack
        for part in path.split("/"):
            child = scope.node.try_find_child(part)
            if child is None:
                # Constructs that the config leaves out (e.g. the CloudWatch add-on) have nothing
                # to acknowledge; anything else missing means this table went stale.
                if path.startswith("PodIdentityRole-"):
                    break
                raise LookupError(
                    f"cdk-nag acknowledgment for a construct that does not exist: {stack.stack_name}/{path}"
                )
            scope = child
        else:
            Validations.of(scope).acknowledge(Acknowledgment(id=finding_id, reason=reason))
            applied += 1
    return applied
