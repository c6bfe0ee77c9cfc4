"""The cluster's CloudWatch dashboard and the agent setting its job metrics arrive through, on the
synthesized templates (one synthesis per profile per session, conftest.synth)."""

from __future__ import annotations

import json
import re

import pytest

from nvrx_eks.facts import training_metrics as names

pytestmark = [pytest.mark.synth, pytest.mark.xdist_group("synth")]

#: Stands in for a CloudFormation token (the file system id comes from the storage stack).
TOKEN = "<token>"


def dashboard(synthesized) -> tuple[dict, dict]:
    """(the dashboard's properties, its body as JSON with TOKEN for each CloudFormation token)."""
    (resource,) = synthesized.resources("cluster", "AWS::CloudWatch::Dashboard").values()
    body = resource["Properties"]["DashboardBody"]
    parts = body["Fn::Join"][1] if isinstance(body, dict) else [body]
    return resource["Properties"], json.loads("".join(p if isinstance(p, str) else TOKEN for p in parts))


def widgets_by_title(body: dict) -> dict[str, list]:
    return {w["properties"]["title"]: w["properties"]["metrics"] for w in body["widgets"] if w["type"] == "metric"}


def searched_metrics(metrics: list) -> set[str]:
    """Metric names of the SEARCH expressions of a widget."""
    found = set()
    for row in metrics:
        for item in row:
            if isinstance(item, dict) and "expression" in item:
                found |= set(re.findall(r'MetricName="([^"]+)"', item["expression"]))
    return found


def plain_metrics(metrics: list) -> set[tuple[str, str]]:
    """(namespace, metric name) of a widget's plain metric rows."""
    return {(row[0], row[1]) for row in metrics if isinstance(row[0], str) and not row[0].startswith(".")}


def test_the_dashboard_charts_jobs_gpus_efa_and_fsx_by_their_metric_names(synth):
    synthesized = synth("p5")
    properties, body = dashboard(synthesized)
    assert properties["DashboardName"] == f"{synthesized.config.cluster_name}-training"
    widgets = widgets_by_title(body)
    assert searched_metrics(widgets["Job goodput (%)"]) == {"goodput"}
    assert searched_metrics(widgets["Restarts by layer (per 5 min)"]) == {names.RESTART_METRIC}
    restarts = widgets["Restarts by layer (per 5 min)"][0][0]["expression"]
    assert f"{{{names.NAMESPACE},{names.JOB_DIMENSION},{names.LAYER_DIMENSION}}}" in restarts
    assert searched_metrics(widgets["Loss: training and held-out"]) == {"loss", "eval_loss"}
    assert searched_metrics(widgets["Throughput"]) == {"tokens_per_s", "mfu"}
    assert searched_metrics(widgets["Checkpoint stall (s)"]) == {"checkpoint_stall_s"}
    charted = set().union(*(searched_metrics(m) for m in widgets.values()))
    # Every job metric the dashboard names is one the trainer sends.
    assert charted <= {
        *names.STEP_METRICS,
        *names.EVAL_METRICS,
        *names.CHECKPOINT_METRICS,
        *names.GOODPUT_METRICS,
        names.RESTART_METRIC,
    }
    assert plain_metrics(widgets["GPU utilization (%)"]) == {("ContainerInsights", "node_gpu_utilization")}
    assert plain_metrics(widgets["GPU memory utilization (%)"]) == {
        ("ContainerInsights", "node_gpu_memory_utilization")
    }
    assert plain_metrics(widgets["EFA throughput, all nodes (bytes/s)"]) == {
        ("ContainerInsights", "node_efa_rx_bytes"),
        ("ContainerInsights", "node_efa_tx_bytes"),
    }
    for row in widgets["GPU utilization (%)"]:
        assert row[2:4] == ["ClusterName", synthesized.config.cluster_name]
    assert plain_metrics(widgets["FSx throughput (bytes/s)"]) == {
        ("AWS/FSx", "DataReadBytes"),
        ("AWS/FSx", "DataWriteBytes"),
    }
    for row in widgets["FSx throughput (bytes/s)"]:
        if row[0] == "AWS/FSx":
            assert row[2:4] == ["FileSystemId", TOKEN]  # the storage stack's file system


def test_the_agent_listens_for_the_trainers_embedded_metric_format(synth):
    addons = {
        a["Properties"]["AddonName"]: a["Properties"]
        for a in synth("p5").resources("cluster", "AWS::EKS::Addon").values()
    }
    config = json.loads(addons["amazon-cloudwatch-observability"]["ConfigurationValues"])["agent"]["config"]
    collected = config["logs"]["metrics_collected"]
    assert collected["emf"] == {}
    # Restating the default config: Container Insights keeps its GPU and EFA metrics.
    assert collected["kubernetes"] == {"enhanced_container_insights": True, "accelerated_compute_metrics": True}
    assert names.EMF_AGENT_ENDPOINT.endswith(f":{names.EMF_AGENT_PORT}")


def test_without_the_add_on_the_dashboard_keeps_fsx_and_says_why_the_rest_is_missing(synth):
    _, body = dashboard(synth("g5-smoke"))
    assert set(widgets_by_title(body)) == {"FSx throughput (bytes/s)"}
    (text,) = [w for w in body["widgets"] if w["type"] == "text"]
    assert "addons.cloudwatch_observability" in text["properties"]["markdown"]
