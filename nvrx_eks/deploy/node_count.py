"""How many GPU nodes a job takes by default.

Without --nodes a job (and `nvrx-eks capacity up`) takes gpu_nodes.desired_size, the count the
GPU node group is scaled up to; a profile that says 0 there (a Capacity Block group, created at 0
before its block starts) means the group's maximum, gpu_nodes.max_size. A node count of 0 never
reaches the planner or the trainer config: every per-GPU share divides by it. How many nodes a
job may launch is nvrx_eks/jobs/capacity.py's.
"""

from __future__ import annotations

from infra.config import DeploymentConfig
from nvrx_eks.deploy.stack_outputs import StackOutputs
from nvrx_eks.facts.errors import ConfigError
from nvrx_eks.facts.stack_outputs import OutputKey


def require_nodes(nodes: int, what: str) -> int:
    """`nodes`, or a ConfigError (exit 2) naming `what` set it to less than one GPU node."""
    if nodes < 1:
        raise ConfigError(f"{what} is {nodes}: a job needs at least one GPU node; give --nodes N (N >= 1)")
    return nodes


def default_nodes(config: DeploymentConfig, outputs: StackOutputs | None = None) -> int:
    """The GPU nodes a job (and `capacity up`) takes without --nodes: the deployed stack's node
    count where `outputs` are given, else gpu_nodes.desired_size, else gpu_nodes.max_size."""
    if outputs is not None:
        return require_nodes(outputs.node_count, f"the stack output {OutputKey.GPU_NODE_COUNT.value}")
    gpu_nodes = config.gpu_nodes
    return require_nodes(gpu_nodes.desired_size or gpu_nodes.max_size, "gpu_nodes.max_size")
