"""The fabric test's PASS/FAIL verdict: the rendered script's own awk program run on nccl-tests
all_reduce_perf output in its real format, the threshold per instance type, and `status`
showing the verdict the launcher pod left as its termination message."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

from infra.config import resolve_config
from nvrx_eks.facts.instances import FABRIC_TEST_PASS_FRACTION, facts_for
from nvrx_eks.jobs.render import render_job
from nvrx_eks.jobs.spec import build_jobspec
from tests.support import cli_harness
from tests.support.cli_harness import add_job_pods, run_cli

#: all_reduce_perf on 2x p5.48xlarge, 8 B to 16 GiB: the table rows as published in
#: aws-samples/awsome-distributed-training micro-benchmarks/nccl-tests/README.md (largest rows and
#: a few small ones), with the preamble nccl-tests prints and the "[job,rank]<stdout>:" prefix
#: that mpirun --tag-output adds, and NCCL INFO lines interleaved as NCCL_DEBUG=INFO prints them.
P5_TWO_NODES = """\
# nThread 1 nGpus 1 minBytes 8 maxBytes 17179869184 step: 2(factor) warmup iters: 5 iters: 100
#
# Using devices
#  Rank  0 Group  0 Pid     41 on nccl-test-worker-0-0 device  0 [0x53] NVIDIA H100 80GB HBM3
#  Rank 15 Group  0 Pid     52 on nccl-test-worker-0-1 device  7 [0xca] NVIDIA H100 80GB HBM3
nccl-test-worker-0-0:41:41 [0] NCCL INFO NET/OFI Selected provider is efa, fabric is efa-direct (found 32 nics)
#
#                                                              out-of-place                       in-place
#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw #wrong
#        (B)    (elements)                               (us)  (GB/s)  (GB/s)            (us)  (GB/s)  (GB/s)
           8             2     float     sum      -1    69.12    0.00    0.00      0    72.43    0.00    0.00      0
          16             4     float     sum      -1    72.64    0.00    0.00      0    73.91    0.00    0.00      0
  1073741824     268435456     float     sum      -1   4607.6  233.04  436.95      0   4565.6  235.18  440.96      0
  2147483648     536870912     float     sum      -1   9074.5  236.65  443.72      0   9108.5  235.77  442.06      0
  4294967296    1073741824     float     sum      -1    17286  248.46  465.87      0    17343  247.64  464.33      0
  8589934592    2147483648     float     sum      -1    33605  255.62  479.28      0    33628  255.44  478.95      0
 17179869184    4294967296     float     sum      -1    66132  259.78  487.09      0    66109  259.87  487.26      0
# Out of bounds values : 0 OK
# Avg bus bandwidth    : 171.562
#
"""

(LARGEST_ROW,) = [line for line in P5_TWO_NODES.splitlines() if line.startswith(" 17179869184 ")]


def _tagged(output: str) -> str:
    return "".join(f"[1,0]<stdout>:{line}\n" for line in output.splitlines())


def _script(profile: str = "p5", nodes: int = 2) -> str:
    spec = build_jobspec(resolve_config(profile), nodes=nodes, name="nccl-test", workload="nccl-test")
    job = render_job(spec).job_document
    container = job["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]["containers"][0]
    return container["command"][2]


def _verdict(script: str, log: str, tmp_path: Path, failure: str = "") -> tuple[int, str]:
    """Run the script's verdict command (its awk program and arguments, as rendered) on `log`."""
    (command,) = re.findall(r"verdict=\$\((awk .*? /tmp/nccl-tests\.log)\)", script, re.DOTALL)
    path = tmp_path / "nccl-tests.log"
    path.write_text(log)
    run = subprocess.run(
        ["bash", "-c", command.replace("/tmp/nccl-tests.log", '"$1"'), "verdict", str(path)],
        env={"PATH": "/usr/bin:/bin", "failure": failure},
        capture_output=True,
        text=True,
    )
    assert run.stderr == ""
    return run.returncode, run.stdout.strip()


@pytest.fixture(scope="module")
def p5_script() -> str:
    return _script()


def test_p5_at_its_published_bandwidth_passes(p5_script, tmp_path):
    assert _verdict(p5_script, _tagged(P5_TWO_NODES), tmp_path) == (
        0,
        "fabric test: PASS busbw 487.09 GB/s (expected >= 389.7 GB/s for p5.48xlarge)",
    )


def test_open_mpi_5_tag_format_and_untagged_output_parse_alike(p5_script, tmp_path):
    # Open MPI 5 puts a space after the tag; without --tag-output there is no tag at all.
    spaced = "".join(f"[1,0]<stdout>: {line}\n" for line in P5_TWO_NODES.splitlines())
    for log in (spaced, P5_TWO_NODES):
        assert _verdict(p5_script, log, tmp_path)[0] == 0


def test_bandwidth_below_the_threshold_fails(p5_script, tmp_path):
    # The largest message at the bandwidth of a fallback to TCP sockets over the ENA interface.
    slow = LARGEST_ROW.replace("259.78  487.09", " 24.31   45.58")
    code, line = _verdict(p5_script, _tagged(P5_TWO_NODES.replace(LARGEST_ROW, slow)), tmp_path)
    assert (code, line) == (
        1,
        "fabric test: FAIL busbw 45.58 GB/s (expected >= 389.7 GB/s for p5.48xlarge): below the expected bus bandwidth",
    )


def test_output_that_ends_before_the_largest_message_fails_with_the_reason(p5_script, tmp_path):
    truncated = P5_TWO_NODES[: P5_TWO_NODES.index(LARGEST_ROW)]
    code, line = _verdict(p5_script, _tagged(truncated), tmp_path)
    assert code == 1
    assert line == (
        "fabric test: FAIL no busbw (expected >= 389.7 GB/s for p5.48xlarge): "
        "no result for the largest message (17179869184 B): the output ends early"
    )


def test_output_without_a_result_table_fails(p5_script, tmp_path):
    log = "[1,0]<stdout>:nccl-test-worker-0-0:41:41 [0] NCCL INFO Bootstrap : Using eth0:10.0.0.1<0>\n"
    code, line = _verdict(p5_script, log, tmp_path)
    assert code == 1 and line.endswith(": no all_reduce_perf result table in the output")


def test_wrong_values_fail_at_full_bandwidth(p5_script, tmp_path):
    wrong = LARGEST_ROW.replace("487.09      0", "487.09      3")
    code, line = _verdict(p5_script, _tagged(P5_TWO_NODES.replace(LARGEST_ROW, wrong)), tmp_path)
    assert code == 1 and line.endswith(
        "busbw 487.09 GB/s (expected >= 389.7 GB/s for p5.48xlarge): 3 wrong values in the largest message"
    )


def test_an_earlier_failure_fails_the_verdict_and_names_itself(p5_script, tmp_path):
    failure = "NCCL on nccl-test-worker-0-1 did not select the EFA provider"
    code, line = _verdict(p5_script, _tagged(P5_TWO_NODES), tmp_path, failure=failure)
    assert code == 1 and line.startswith("fabric test: FAIL busbw 487.09 GB/s") and line.endswith(": " + failure)


def test_one_node_shows_the_bandwidth_without_judging_it(tmp_path):
    # g5.8xlarge has one GPU: on one node all_reduce moves nothing and busbw is 0.
    script = _script("g5-smoke", nodes=1)
    row = (
        "  4294967296    1073741824     float     sum      -1    123.4    0.00    0.00      0"
        + "    0.00" * 3
        + "      0"
    )
    log = P5_TWO_NODES.split("           8  ", 1)[0] + row + "\n"
    assert _verdict(script, _tagged(log), tmp_path) == (
        0,
        "fabric test: PASS busbw 0.00 GB/s (one node: no network crossed, no bandwidth expected)",
    )


@pytest.mark.parametrize(
    ("instance_type", "expected_gb_s"),
    [
        ("p5.48xlarge", 487.09),  # published: awsome-distributed-training nccl-tests README
        ("p5en.48xlarge", 400.0),  # nothing published: 3200 Gbps / 8
        ("g5.8xlarge", 3.125),  # nothing published: 25 Gbps / 8
        ("g5.48xlarge", 12.5),  # nothing published: 100 Gbps / 8
    ],
)
def test_threshold_is_the_pass_fraction_of_the_expected_figure(instance_type, expected_gb_s):
    facts = facts_for(instance_type)
    assert facts.expected_allreduce_busbw_gb_s == expected_gb_s
    assert facts.fabric_test_min_busbw_gb_s == pytest.approx(FABRIC_TEST_PASS_FRACTION * expected_gb_s, abs=0.05)


def test_the_rendered_threshold_and_largest_message_follow_the_instance_type():
    g5 = _script("g5-smoke")
    assert "-v min_busbw=2.5 " in g5 and "-v instance_type=g5.8xlarge " in g5
    assert "all_reduce_perf -b 8 -e 4G " in g5 and "-v max_bytes=4294967296 " in g5
    assert "-v min_busbw=320.0 " in _script("p5en")


# ----- status shows the verdict the launcher pod left -------------------------------------


aws = cli_harness.aws
k8s_server = cli_harness.k8s_server


cluster = cli_harness.deployed_cluster


def test_status_shows_the_fabric_test_verdict(cluster):
    assert run_cli("submit", "--fabric-test", "--nodes", "2").code == 0
    verdict = (
        "fabric test: FAIL busbw 45.58 GB/s (expected >= 389.7 GB/s for p5.48xlarge): below the expected bus bandwidth"
    )
    launcher, _ = add_job_pods(cluster, "nccl-test", 2, phase="Failed", exit_code=1)
    pod = cluster.objects[("v1", "pods", "training", launcher)]
    pod["status"]["containerStatuses"][0]["state"]["terminated"]["message"] = verdict + "\n"
    result = run_cli("status", "nccl-test")
    assert result.code == 0, result.output
    assert f"node 0: {verdict}" in result.stdout
    assert "node 1:" not in result.stdout  # the other pods leave no message

    data = json.loads(run_cli("status", "nccl-test", "-o", "json").stdout)
    assert [p["termination_message"] for p in data["pods"]] == [verdict, ""]
