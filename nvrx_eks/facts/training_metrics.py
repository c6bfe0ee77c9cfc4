"""The trainer's live metrics as CloudWatch sees them: stated once for the trainer, which sends
them, and the stacks, which enable their transport and chart them on the cluster's dashboard.

Transport: CloudWatch embedded metric format (EMF), one JSON document per UDP datagram, to the
EMF listener of the CloudWatch agent that the CloudWatch Observability add-on runs on every node
(agent config `logs.metrics_collected.emf`, port 25888). The add-on's operator publishes that
port as the `cloudwatch-agent` Service with internalTrafficPolicy Local, so each pod reaches the
agent of its own node. The agent writes the documents to the deployment's log_group and CloudWatch
extracts the metrics into NAMESPACE. UDP because a metric must never block a training step: a
datagram that finds no agent is dropped.
"""

from __future__ import annotations

import re

from nvrx_eks.facts.names import DEFAULT_DEPLOYMENT_NAME

#: CloudWatch namespace of the trainer's metrics.
NAMESPACE = "NvrxEks/Training"


def log_group(deployment: str) -> str:
    """The log group the agent writes a deployment's EMF documents to. One per deployment: the
    cluster stack creates it with a retention (infra/stacks/cluster.py) and deletes it with the
    cluster, where a group the agent created on first use was shared by every deployment of the
    account and region and kept forever. The job commands write it into each job's trainer config."""
    return f"/{deployment}/training-metrics"


#: The trainer's default, for a config rendered outside any deployment: the default deployment's.
DEFAULT_LOG_GROUP = log_group(DEFAULT_DEPLOYMENT_NAME)
#: The agent's EMF listener as a pod sees it (the add-on's namespace and Service).
EMF_AGENT_PORT = 25888
EMF_AGENT_ENDPOINT = f"udp://cloudwatch-agent.amazon-cloudwatch:{EMF_AGENT_PORT}"

#: Dimensions: every metric per job (the run directory's name, which is the job's name on EKS);
#: restarts also per resilience layer.
JOB_DIMENSION = "Job"
LAYER_DIMENSION = "Layer"

#: How rank 0 logs its metrics, every `log_every` steps (workloads.trainer: `step N loss X lr ...`)
#: and at each evaluation (workloads.evaluation: `eval step N loss X ...`): `status` and
#: `logs --follow` pick the last of each out of the pod log.
METRICS_LINE = re.compile(r"\b(?P<eval>eval )?step (?P<step>\d+) loss (?P<loss>\S+)")

#: How a rank logs a watched event (workloads.events.watch_line: a fault, a restart, a checkpoint
#: commit, the run's end) as it happens, after the trainer's `[rankR] ` tag: `logs --events`
#: picks these out of the pod logs.
EVENT_MARK = "event: "
EVENT_LINE = re.compile(r"\[rank\d+\] " + re.escape(EVENT_MARK) + r"(?P<text>.+)$")

#: Metric name -> CloudWatch unit. Step metrics every `log_every` steps, the others when they happen.
STEP_METRICS = {
    "loss": "None",
    "tokens_per_s": "Count/Second",
    "mfu": "Percent",
    "step_time_s": "Seconds",
}
EVAL_METRICS = {"eval_loss": "None", "eval_s": "Seconds"}
CHECKPOINT_METRICS = {"checkpoint_stall_s": "Seconds"}
RESTART_METRIC = "restarts"
#: The goodput split (workloads.goodput) as a percentage and its parts in seconds.
GOODPUT_METRICS = {
    "goodput": "Percent",
    "productive_s": "Seconds",
    "checkpoint_stall_total_s": "Seconds",
    "eval_total_s": "Seconds",
    "replayed_s": "Seconds",
    "recovery_s": "Seconds",
    "other_s": "Seconds",
}
