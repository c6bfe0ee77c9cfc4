"""Each deployment's jobs send their CloudWatch metrics to the deployment's own log group, the one
its cluster stack creates with a retention (nvrx_eks/facts/training_metrics.py), unless the
trainer config names another; spares (which rebuild the trainer config) keep it."""

from __future__ import annotations

import pytest

from nvrx_eks.facts import training_metrics
from nvrx_eks.facts.errors import ConfigError
from nvrx_eks.jobs.spec import build_jobspec, load_train_config
from tests.support.profiles import config_with
from workloads.cloudwatch_metrics import emf_document


@pytest.mark.parametrize("spare_nodes", [0, 1])
def test_a_job_sends_its_metrics_to_its_deployments_log_group(spare_nodes):
    config = config_with("p5", name="team-a", gpu_nodes__max_size=3)
    spec = build_jobspec(config, nodes=2, name="train", spare_nodes=spare_nodes)
    assert spec.train.metrics.log_group == "/team-a/training-metrics" == training_metrics.log_group("team-a")
    document = emf_document({"loss": 1.0}, {"loss": "None"}, {"Job": "train"}, log_group=spec.train.metrics.log_group)
    assert document["_aws"]["LogGroupName"] == "/team-a/training-metrics"


def test_a_log_group_the_trainer_config_names_is_kept():
    config = config_with("p5", name="team-a")
    train = load_train_config(None, ["metrics.log_group=/shared/metrics"], None)
    assert build_jobspec(config, nodes=2, name="train", train=train).train.metrics.log_group == "/shared/metrics"


def test_a_log_group_name_is_checked():
    with pytest.raises(ConfigError, match="metrics.log_group.*is not a CloudWatch log group name"):
        load_train_config(None, ["metrics.log_group=/has spaces/x"], None)
