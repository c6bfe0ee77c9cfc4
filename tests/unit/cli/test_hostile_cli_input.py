"""Odd spellings, control characters and unreadable files on the command line: a fault step
written with digits other than 0-9 is refused (exit 2, one line), an error that echoes a control
character the user gave prints it escaped instead of sending it to the terminal, and a kubeconfig
the Kubernetes client cannot read is named (exit 2) instead of ending in its traceback."""

from __future__ import annotations

import pytest

from nvrx_eks.facts.errors import terminal_safe
from tests.support.cli_harness import run_cli
from tests.support.profiles import profile_file
from workloads.faults import parse_fault_spec


@pytest.mark.parametrize(
    "spelling",
    ["exception@\u0663:1", "exception@\uff15", "exception@1_0", "exception@+5", "exception@5:-0", "exception@5:+1"],
    ids=["arabic-indic", "full-width", "underscore", "plus", "minus zero", "plus rank"],
)
def test_fault_steps_and_ranks_take_only_the_digits_0_to_9(spelling):
    """int() reads other scripts' digits, `1_0` and signs: `exception@٣:1` was step 3."""
    with pytest.raises(ValueError, match="STEP and RANK must be written with the digits 0-9"):
        parse_fault_spec(spelling)
    result = run_cli("render", "--nodes", "2", "--set", "steps=100", "--faults", spelling)
    assert result.code == 2, result.output
    assert "Traceback" not in result.output
    # The config's own format: its heading, then one line for the one issue.
    heading, issue = result.stderr.strip().splitlines()
    assert heading.startswith("error: invalid configuration in")
    assert issue.startswith(f"  faults: fault {spelling!r}: STEP and RANK must be written with the digits 0-9")


def test_written_spellings_still_parse():
    faults = parse_fault_spec(" exception@07:1 ,sigkill@40")
    assert [(f.kind, f.step, f.rank) for f in faults] == [("exception", 7, 1), ("sigkill", 40, 0)]


def test_an_error_echoing_an_escape_sequence_prints_it_escaped(tmp_path):
    path = tmp_path / "ctx\x1b[31mRED\x1b[0m.yaml"
    result = run_cli("render", "--nodes", "2", "--train-config", str(path))
    assert result.code == 2, result.output
    assert "\x1b" not in result.stderr
    assert "ctx\\x1b[31mRED\\x1b[0m.yaml" in result.stderr


def test_terminal_safe_keeps_text_tabs_and_line_breaks():
    assert terminal_safe("a\tb\nc é ☃") == "a\tb\nc é ☃"
    assert terminal_safe("\x07\x08\r\x7f\x9b") == "\\x07\\x08\\r\\x7f\\x9b"


@pytest.mark.parametrize(
    "kubeconfig",
    ["- 1\n", "contexts: 5\n", "contexts: [5]\n", "a: " + "[" * 20_000 + "]" * 20_000 + "\n"],
    ids=["a list", "contexts a number", "a context a number", "nested 20k deep"],
)
def test_a_kubeconfig_the_client_cannot_read_exits_2_naming_it(tmp_path, kubeconfig):
    """The Kubernetes client's loader raised TypeError or RecursionError for these: a traceback."""
    (path := tmp_path / "kubeconfig").write_text(kubeconfig)
    cluster = {"context": "team-a", "kubeconfig": str(path), "namespace": "ml", "pvc": "shared",
               "image": "registry.example.com/team/trainer:2.0"}  # fmt: skip
    config = profile_file(tmp_path / "profile", gpu_nodes__max_size=4, cluster=cluster)
    result = run_cli("status", "-c", str(config))
    assert result.code == 2, result.output
    [line] = result.stderr.strip().splitlines()
    assert line.startswith(f"error: cluster.kubeconfig: {path} is not a kubeconfig the Kubernetes client can read")
