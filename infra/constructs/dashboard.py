"""The cluster's CloudWatch dashboard: how its training jobs fare and what the hardware under them does.

Rows, top to bottom:
* Jobs (namespace NvrxEks/Training, one line per job; the trainer's live metrics arrive through
  the CloudWatch agent's EMF listener, nvrx_eks/facts/training_metrics.py): goodput, restarts by
  resilience layer, training and evaluation loss, tokens/s and MFU, checkpoint stalls.
* GPUs (Container Insights' DCGM metrics, ContainerInsights namespace, the whole cluster):
  utilization and memory utilization, average and the busiest node.
* Fabric and storage: EFA bytes received and sent by all nodes (Container Insights), and the FSx
  file system's read and write throughput (AWS/FSx).

The job and GPU rows need the CloudWatch Observability add-on (addons.cloudwatch_observability);
without it the dashboard says so in their place. Job metrics are per job name, so jobs of the
same name in another cluster of the account and region share its lines.
"""

from __future__ import annotations

from aws_cdk import Duration
from aws_cdk import aws_cloudwatch as cw
from constructs import Construct

from infra.config import DeploymentConfig
from nvrx_eks.facts import training_metrics as names

_PERIOD = Duration.minutes(1)
_WIDTH = 8  # three widgets per 24-column row


def _per_job(metric: str, statistic: str, label: str) -> cw.MathExpression:
    """One line per job: a SEARCH over the jobs' dimension, so new jobs appear by themselves."""
    schema = f"{{{names.NAMESPACE},{names.JOB_DIMENSION}}}"
    return cw.MathExpression(
        expression=f"SEARCH('{schema} MetricName=\"{metric}\"', '{statistic}', 60)", label=label, period=_PERIOD
    )


def _cluster_metric(config: DeploymentConfig, metric: str, statistic: str, label: str) -> cw.Metric:
    return cw.Metric(
        namespace="ContainerInsights",
        metric_name=metric,
        dimensions_map={"ClusterName": config.cluster_name},
        statistic=statistic,
        label=label,
        period=_PERIOD,
    )


def _graph(title: str, left: list, right: list | None = None, unit: str | None = None) -> cw.GraphWidget:
    return cw.GraphWidget(
        title=title,
        left=left,
        right=right or [],
        width=_WIDTH,
        height=6,
        left_y_axis=cw.YAxisProps(label=unit, show_units=False) if unit else None,
    )


def job_widgets() -> list[cw.IWidget]:
    restarts_schema = f"{{{names.NAMESPACE},{names.JOB_DIMENSION},{names.LAYER_DIMENSION}}}"
    restarts = cw.MathExpression(
        expression=f"SEARCH('{restarts_schema} MetricName=\"{names.RESTART_METRIC}\"', 'Sum', 300)",
        label="restarts",
        period=Duration.minutes(5),
    )
    return [
        _graph("Job goodput (%)", [_per_job("goodput", "Average", "goodput")], unit="%"),
        _graph("Restarts by layer (per 5 min)", [restarts], unit="restarts"),
        _graph(
            "Loss: training and held-out",
            [_per_job("loss", "Average", "loss"), _per_job("eval_loss", "Average", "eval")],
        ),
        _graph(
            "Throughput",
            [_per_job("tokens_per_s", "Average", "tokens/s")],
            [_per_job("mfu", "Average", "MFU %")],
            unit="tokens/s",
        ),
        _graph("Checkpoint stall (s)", [_per_job("checkpoint_stall_s", "Maximum", "stall")], unit="s"),
    ]


def gpu_widgets(config: DeploymentConfig) -> list[cw.IWidget]:
    return [
        _graph(
            "GPU utilization (%)",
            [
                _cluster_metric(config, "node_gpu_utilization", "Average", "average"),
                _cluster_metric(config, "node_gpu_utilization", "Maximum", "busiest"),
            ],
            unit="%",
        ),
        _graph(
            "GPU memory utilization (%)",
            [
                _cluster_metric(config, "node_gpu_memory_utilization", "Average", "average"),
                _cluster_metric(config, "node_gpu_memory_utilization", "Maximum", "fullest"),
            ],
            unit="%",
        ),
        # Each node reports its bytes per second once a minute: their sum is the cluster's rate.
        _graph(
            "EFA throughput, all nodes (bytes/s)",
            [
                _cluster_metric(config, "node_efa_rx_bytes", "Sum", "received"),
                _cluster_metric(config, "node_efa_tx_bytes", "Sum", "sent"),
            ],
            unit="bytes/s",
        ),
    ]


def fsx_widget(file_system_id: str) -> cw.IWidget:
    def per_second(metric: str, label: str) -> cw.MathExpression:
        total = cw.Metric(
            namespace="AWS/FSx",
            metric_name=metric,
            dimensions_map={"FileSystemId": file_system_id},
            statistic="Sum",
            period=_PERIOD,
        )
        key = metric.lower()  # ids are per graph: one per metric
        return cw.MathExpression(expression=f"{key} / PERIOD({key})", using_metrics={key: total}, label=label)

    return _graph(
        "FSx throughput (bytes/s)",
        [per_second("DataReadBytes", "read"), per_second("DataWriteBytes", "write")],
        unit="bytes/s",
    )


class TrainingDashboard(Construct):
    def __init__(self, scope: Construct, construct_id: str, *, config: DeploymentConfig, file_system_id: str):
        super().__init__(scope, construct_id)
        storage = fsx_widget(file_system_id)
        if config.addons.cloudwatch_observability:
            jobs, hardware = job_widgets(), [*gpu_widgets(config), storage]
        else:
            note = (
                "Job and GPU metrics come from the CloudWatch Observability add-on, which this "
                "profile leaves out (addons.cloudwatch_observability: false)."
            )
            jobs, hardware = [cw.TextWidget(markdown=note, width=24, height=2)], [storage]
        self.dashboard = cw.Dashboard(
            self,
            "Dashboard",
            dashboard_name=f"{config.cluster_name}-training",
            default_interval=Duration.hours(6),
            widgets=[jobs[:3], jobs[3:], hardware],
        )
