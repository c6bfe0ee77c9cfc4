"""A cluster this project did not create (the config's `cluster:` section): its Kubernetes API
client from the user's own kubeconfig context, and the GPU nodes its job pods can land on.

Our own cluster is reached through the cluster stack's outputs and an EKS token signed here
(nvrx_eks/deploy/kube.py); an existing one is reached as kubectl reaches it, with whatever
credentials its kubeconfig context holds (a token, a client certificate, an exec plugin such as
`aws eks get-token`), so nothing here needs AWS.
"""

from __future__ import annotations

import os
from pathlib import Path

import urllib3
import yaml
from kubernetes import client as k8s
from kubernetes import config as kubeconfig
from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import HTTPError as Urllib3Error

from infra.config import DeploymentConfig
from infra.config.sections import ExistingClusterConfig
from nvrx_eks.facts import names as conventions
from nvrx_eks.facts.errors import ConfigError
from nvrx_eks.jobs.capacity import NodeLimit
from nvrx_eks.jobs.client import api_error

#: As for our own cluster (nvrx_eks/deploy/kube.py): fail fast on an unreachable API server,
#: never time out a read (`logs -f`).
CONNECT_TIMEOUT_S = 15


def kubeconfig_path(cluster: ExistingClusterConfig) -> str:
    """The kubeconfig file kubectl would read: cluster.kubeconfig, else $KUBECONFIG's first
    file, else ~/.kube/config."""
    if cluster.kubeconfig:
        return os.path.expanduser(cluster.kubeconfig)
    listed = [p for p in os.environ.get("KUBECONFIG", "").split(os.pathsep) if p]
    return listed[0] if listed else str(Path.home() / ".kube" / "config")


def api_client(cluster: ExistingClusterConfig) -> k8s.ApiClient:
    """An ApiClient for the kubeconfig context cluster.context; ConfigError naming the field."""
    path = kubeconfig_path(cluster)
    if not Path(path).is_file():
        raise ConfigError(
            f"cluster.kubeconfig: {path} does not exist; give the kubeconfig file that holds context "
            f"{cluster.context!r} (or set KUBECONFIG)"
        )
    try:
        client = kubeconfig.new_client_from_config(config_file=path, context=cluster.context, persist_config=False)
    except kubeconfig.ConfigException as e:
        raise ConfigError(
            f"cluster.context: {cluster.context!r} cannot be used from {path} ({e}); `kubectl config "
            "get-contexts` lists the contexts there"
        ) from None
    except (yaml.YAMLError, AttributeError, KeyError, TypeError, ValueError, RecursionError) as e:
        # What the client's loader raises for a file that is YAML but no kubeconfig (a list, a
        # number where a list goes) or that its recursive parser cannot take.
        raise ConfigError(
            f"cluster.kubeconfig: {path} is not a kubeconfig the Kubernetes client can read "
            f"({type(e).__name__}: {str(e)[:200]}); check it with `kubectl --kubeconfig {path} config view`"
        ) from None
    client.rest_client.pool_manager.connection_pool_kw["timeout"] = urllib3.Timeout(
        connect=CONNECT_TIMEOUT_S, read=None
    )
    return client


def node_selector(config: DeploymentConfig) -> dict[str, str]:
    """Every label the job pods select on (nvrx_eks/jobs/spec.py renders the same three parts)."""
    assert config.cluster is not None
    return {
        conventions.GPU_NODE_LABEL_KEY: conventions.GPU_NODE_LABEL_VALUE,
        conventions.INSTANCE_TYPE_LABEL_KEY: config.gpu_nodes.instance_type,
        **config.cluster.node_selector,
    }


def selector_text(selector: dict[str, str]) -> str:
    return ",".join(f"{key}={value}" for key, value in selector.items())


def matching_nodes(client: k8s.ApiClient, config: DeploymentConfig) -> list[k8s.V1Node]:
    """The nodes the job pods can be scheduled on (all their selector labels match)."""
    try:
        return k8s.CoreV1Api(client).list_node(label_selector=selector_text(node_selector(config))).items
    except (ApiException, Urllib3Error) as e:
        raise api_error(e, "listing the GPU nodes") from None


def label_command(config: DeploymentConfig) -> str:
    """How a user makes their GPU nodes eligible: the pool label on nodes of the instance type."""
    assert config.cluster is not None
    return (
        f"kubectl --context {config.cluster.context} label nodes -l "
        f"{conventions.INSTANCE_TYPE_LABEL_KEY}={config.gpu_nodes.instance_type} "
        f"{conventions.GPU_NODE_LABEL_KEY}={conventions.GPU_NODE_LABEL_VALUE}"
    )


def config_limit(config: DeploymentConfig, source: str) -> NodeLimit:
    """gpu_nodes.max_size of a config for an existing cluster: the most nodes a job may take there."""
    limit = config.gpu_nodes.max_size
    return NodeLimit(
        ("gpu_nodes", "max_size"),
        limit,
        f"is {limit} in {source}",
        "raise gpu_nodes.max_size in the config to the GPU nodes the cluster has for these jobs",
    )


def nodes_limit(client: k8s.ApiClient, config: DeploymentConfig) -> NodeLimit:
    """The nodes the cluster has for the job pods now: nothing here scales it up."""
    count = len(matching_nodes(client, config))
    return NodeLimit(
        ("cluster", "node_selector"),
        count,
        f"{count} node(s) of the cluster match the pods' node selector {selector_text(node_selector(config))}",
        f"add GPU nodes or label more of them (`{label_command(config)}`)",
    )
