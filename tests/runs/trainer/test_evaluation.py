"""Evaluation on a held-out split and the live metrics, end to end: `nvrx-eks data prepare
--eval-fraction`, then `nvrx-eks local --nproc 2 --steps 30 --data DIR`, read back with
TensorBoard's own reader and with AWS's embedded-metric-format library. The run without
evaluation is also the check that training on prepared shards learns, and that its throughput
reaches summary.json, the command's own summary and `nvrx-eks report`."""

from __future__ import annotations

import json
import math
import re
import socket
import threading
import time
from datetime import datetime
from pathlib import Path

import pytest
from aws_embedded_metrics.logger.metrics_context import MetricsContext
from aws_embedded_metrics.serializers.log_serializer import LogSerializer
from aws_embedded_metrics.validator import validate_namespace, validate_timestamp
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from nvrx_eks.facts import training_metrics as names
from tests.support import cli_harness
from tests.support.cli_harness import add_fsx_volume, add_job_pods, deploy_fake_environment, run_cli
from tests.support.trainer_fixtures import exclusive_trainer_runs, port_pair
from workloads.events import load_run, summarize, watch_line
from workloads.live_metrics import tensorboard_dir

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("trainer_runs")]
aws = cli_harness.aws
k8s_server = cli_harness.k8s_server

STEPS = 30
EVAL_INTERVAL = 10


def prepared_with_held_out_split(out: Path) -> Path:
    """Python's json package as text, one line in ten held out."""
    sources = sorted(Path(json.__file__).parent.glob("*.py"))
    result = run_cli(
        "data", "prepare", *map(str, sources), "--out", str(out), "--tokenizer", "byte",
        "--shard-tokens", "20000", "--eval-fraction", "0.1",
    )  # fmt: skip
    assert result.code == 0, result.output
    return out


def local(run_dir: Path, data: Path, *settings: str) -> None:
    """The run, and what the command printed (beside it: not in the run's own directory)."""
    overrides = [arg for setting in settings for arg in ("--set", setting)]
    result = run_cli(
        "local", "--nproc", "2", "--steps", str(STEPS), "--data", str(data), "--run-dir", str(run_dir),
        "--port", str(port_pair()), *overrides,
    )  # fmt: skip
    assert result.code == 0, result.output
    printed(run_dir).write_text(result.stdout)


def printed(run_dir: Path) -> Path:
    return run_dir.with_name(f"{run_dir.name}.stdout")


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The same run with evaluation (its CloudWatch datagrams caught on a local UDP socket standing
    in for the node's agent) and without."""
    root = tmp_path_factory.mktemp("evaluation")
    data = prepared_with_held_out_split(root / "shards")
    agent = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    agent.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 20)
    agent.bind(("127.0.0.1", 0))
    endpoint = f"udp://127.0.0.1:{agent.getsockname()[1]}"
    with exclusive_trainer_runs(tmp_path_factory):
        local(
            root / "eval", data, f"eval.interval_steps={EVAL_INTERVAL}",
            "metrics.cloudwatch=true", f"metrics.emf_endpoint={endpoint}",
        )  # fmt: skip
        local(root / "plain", data, "eval.enabled=false")
    datagrams = []
    agent.setblocking(False)
    while True:
        try:
            datagrams.append(agent.recv(1 << 16))
        except BlockingIOError:
            break
    agent.close()
    return root / "eval", root / "plain", datagrams


def summary(run_dir: Path) -> dict:
    return json.loads((run_dir / "summary.json").read_text())


def scalars(run_dir: Path, tag: str) -> dict[int, float]:
    accumulator = EventAccumulator(str(tensorboard_dir(run_dir)))
    accumulator.Reload()
    return {event.step: event.value for event in accumulator.Scalars(tag)}


def test_eval_loss_reaches_summary_and_tensorboard_at_every_interval(runs):
    eval_run, _, _ = runs
    evals = load_run(eval_run).of("eval_end", rank=0)
    assert [e["step"] for e in evals] == [10, 20, 30]
    result = summary(eval_run)
    assert result["eval_step"] == STEPS and result["eval_loss"] == evals[-1]["loss"]
    # A byte-level model that learned something: well below ln(256) after 30 steps.
    assert result["eval_loss"] < math.log(256) - 1
    tensorboard = scalars(eval_run, "eval/loss")
    assert sorted(tensorboard) == [10, 20, 30]
    assert tensorboard == pytest.approx({e["step"]: e["loss"] for e in evals}, rel=1e-6)
    losses = scalars(eval_run, "train/loss")
    steps = load_run(eval_run).of("step_end", rank=0)
    assert losses == pytest.approx({e["step"]: e["loss"] for e in steps}, rel=1e-6)
    assert set(scalars(eval_run, "goodput/fraction")) == {10, 20, 30}


def test_training_on_prepared_shards_learns_and_reports_its_throughput(runs):
    _, plain_run, _ = runs
    losses = {e["step"]: e["loss"] for e in load_run(plain_run).of("step_end", rank=0)}
    assert losses[STEPS] < losses[1]
    result = summary(plain_run)
    assert result["tokens_per_s"] > 0 and result["mfu"] is None  # CPU: no peak to compare with
    assert result["tokens_per_s_per_gpu"] == pytest.approx(result["tokens_per_s"] / 2, rel=0.3)
    out = printed(plain_run).read_text()
    assert "final step" in out and "goodput" in out and "launcher exit 0" in out, out

    report = run_cli("report", str(plain_run))
    assert report.code == 0, report.stderr
    assert "tokens/s (all ranks)" in report.stdout and "MFU" in report.stdout and "n/a" in report.stdout
    assert (plain_run / "throughput.png").stat().st_size > 10_000


def test_evaluation_leaves_training_exactly_as_without_it(runs):
    eval_run, plain_run, _ = runs
    assert summary(plain_run)["eval_loss"] is None and not (load_run(plain_run).of("eval_end"))
    assert summary(eval_run)["state_sha256"] == summary(plain_run)["state_sha256"]
    losses = [[e["loss"] for e in load_run(run).of("step_end", rank=0)] for run in (eval_run, plain_run)]
    assert losses[0] == losses[1]


def test_evaluation_time_is_its_own_part_of_the_goodput_split(runs):
    eval_run, _, _ = runs
    report = summarize(load_run(eval_run), rank=0)
    assert report.eval_s == pytest.approx(sum(e["eval_s"] for e in load_run(eval_run).of("eval_end", rank=0)))
    assert report.eval_s > 0 and summary(eval_run)["eval_s"] == pytest.approx(report.eval_s, rel=0.01)
    parts = report.productive_s + report.checkpoint_stall_s + report.eval_s + report.replayed_s + report.recovery_s
    assert parts + report.other_s == pytest.approx(report.wall_s)


def library_document(document: dict) -> dict:
    """The same record as AWS's EMF library builds it from its parts: its validators check the
    namespace, dimensions, metric names, units, values and timestamp on the way."""
    directive = document["_aws"]["CloudWatchMetrics"][0]
    validate_namespace(directive["Namespace"])
    validate_timestamp(datetime.fromtimestamp(document["_aws"]["Timestamp"] / 1000))
    context = MetricsContext.empty()
    context.namespace = directive["Namespace"]
    [dimension_set] = directive["Dimensions"]
    context.set_dimensions([{key: document[key] for key in dimension_set}], use_default=False)
    metric_names = {metric["Name"] for metric in directive["Metrics"]}
    for metric in directive["Metrics"]:
        context.put_metric(metric["Name"], document[metric["Name"]], metric["Unit"])
    for key, value in document.items():
        if key != "_aws" and key not in dimension_set and key not in metric_names:
            context.set_property(key, value)
    context.meta.update(Timestamp=document["_aws"]["Timestamp"], LogGroupName=document["_aws"]["LogGroupName"])
    [serialized] = LogSerializer.serialize(context)
    return json.loads(serialized)


def test_cloudwatch_datagrams_are_embedded_metric_format_as_aws_library_writes_it(runs):
    eval_run, _, datagrams = runs
    documents = []
    for datagram in datagrams:
        text = datagram.decode()
        assert text.endswith("\n") and text.count("\n") == 1  # one record per datagram, as the agent reads them
        documents.append(json.loads(text))
    for document in documents:
        assert library_document(document) == document
        assert document[names.JOB_DIMENSION] == eval_run.name
        assert document["_aws"]["LogGroupName"] == names.DEFAULT_LOG_GROUP  # a local run's default
    sent = {m["Name"] for d in documents for m in d["_aws"]["CloudWatchMetrics"][0]["Metrics"]}
    # loss every log_every steps, the evaluations, the saves, the goodput split (mfu is GPU only).
    expected = {*names.STEP_METRICS, *names.EVAL_METRICS, *names.CHECKPOINT_METRICS, *names.GOODPUT_METRICS} - {"mfu"}
    assert sent == expected
    evals = [d for d in documents if "eval_loss" in d]
    assert [(d["step"], d["eval_loss"]) for d in evals] == [
        (e["step"], e["loss"]) for e in load_run(eval_run).of("eval_end", rank=0)
    ]


def test_eval_command_gives_the_runs_own_held_out_loss_of_a_committed_checkpoint(runs):
    eval_run, _, _ = runs
    in_run = {e["step"]: e["loss"] for e in load_run(eval_run).of("eval_end", rank=0)}
    for step in (None, 20):
        result = run_cli("eval", str(eval_run), *(["--step", str(step)] if step else []))
        assert result.code == 0, result.output
        printed = re.search(r"step (\d+): eval loss (\d+\.\d+)", result.stdout)
        assert printed is not None, result.stdout
        assert int(printed[1]) == (step or STEPS)
        assert float(printed[2]) == pytest.approx(in_run[step or STEPS], abs=5e-4)


def test_eval_command_names_a_step_without_a_commit(runs):
    eval_run, _, _ = runs
    result = run_cli("eval", str(eval_run), "--step", "7")
    assert result.code == 2 and "--step 7" in result.stderr and "Traceback" not in result.output


def test_report_counts_evaluation_time_and_shows_the_held_out_loss(runs, tmp_path):
    eval_run, _, _ = runs
    result = run_cli(
        "report", str(eval_run), "--png", str(tmp_path / "timeline.png"), "--json", str(tmp_path / "b.json")
    )
    assert result.code == 0, result.output
    breakdown = json.loads((tmp_path / "b.json").read_text())
    evals = load_run(eval_run).of("eval_end", rank=0)
    assert breakdown["eval_s"] == pytest.approx(sum(e["eval_s"] for e in evals))
    assert breakdown["last_eval"] == [STEPS, evals[-1]["loss"]]
    assert "evaluation (held-out split)" in result.stdout
    assert f"held-out loss {evals[-1]['loss']:.4f} at step {STEPS}" in result.stdout


def test_status_and_logs_follow_show_the_last_metrics_the_trainer_logged(runs, aws, k8s_server):
    """The trainer's own log (the run's launcher.log) served as node 0's pod log by the loopback
    API server: `status` shows rank 0's last step line and last evaluation line, and `logs -f`
    repeats them when the stream ends."""
    eval_run, _, _ = runs
    lines = (eval_run / "launcher.log").read_text().splitlines()
    last_step = [line for line in lines if f"[rank0] step {STEPS} loss" in line]
    last_eval = [line for line in lines if f"eval step {STEPS} loss" in line]
    assert last_step and last_eval, "the trainer logs a step line and an evaluation line at the last step"
    deploy_fake_environment(k8s_server.url)
    add_fsx_volume(k8s_server)
    assert run_cli("submit", "--nodes", "2").code == 0
    pods = add_job_pods(k8s_server, "train", 2)
    k8s_server.set_log("training", pods[0], lines)
    k8s_server.set_log("training", pods[1], ["[rank9] step 30 loss 9.9 lr 1e-4"])

    status = run_cli("status", "train")
    assert status.code == 0, status.output
    shown = [
        line.removeprefix("last metrics: ") for line in status.stdout.splitlines() if line.startswith("last metrics")
    ]
    assert shown == [last_step[-1].strip(), last_eval[-1].strip()]

    # The run's commits and its end, as its own ranks logged them while they happened.
    events = run_cli("logs", "train", "--events", "--node", "0")
    assert events.code == 0, events.output
    watched = [text for e in sorted(load_run(eval_run).events, key=lambda e: e["t"]) if (text := watch_line(e))]
    assert [line.split(" event: ", 1)[1] for line in events.stdout.splitlines()] == watched
    assert watched[-1] == f"run completed at step {STEPS}, loss {summary(eval_run)['final_loss']:.3f}"

    def pod_ends_once_followed() -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not any(
            r.param("follow").lower() == "true" for r in k8s_server.requests_to("GET", "/log") if r.param("follow")
        ):
            time.sleep(0.02)
        k8s_server.objects.pop(("v1", "pods", "training", pods[0]))

    threading.Thread(target=pod_ends_once_followed, daemon=True).start()
    followed = run_cli("logs", "train", "-f", "--node", "0")
    assert followed.code == 0, followed.output
    assert followed.stdout.splitlines()[-2:] == [
        f"last metrics | {last_step[-1].strip()}",
        f"last metrics | {last_eval[-1].strip()}",
    ]
