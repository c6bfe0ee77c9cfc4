"""Bad input through the console script's entry point: every case exits 2 with one line that
names the problem and the fix, and never a traceback. The cases are those a probe of the CLI
found leaking tracebacks or misleading messages; each one echoes what the user typed, so the
messages must print it literally (Rich markup escaped)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support import cli_harness
from tests.support.cli_harness import run_cli

no_credentials = cli_harness.no_credentials

#: Bytes that are not UTF-8 (and not YAML): what a binary file given by mistake starts with.
BINARY = bytes(range(0xD0, 0x100)) * 8


@pytest.fixture
def binary_file(tmp_path) -> Path:
    path = tmp_path / "model.bin"
    path.write_bytes(BINARY)
    return path


def _error_line(result, *, single: bool = True) -> str:
    """The message; one line, except a config's validation errors (a header, then a line per
    field)."""
    assert result.code == 2, result.output
    assert "Traceback" not in result.output
    lines = result.stderr.strip().splitlines()
    assert lines and lines[0].startswith("error: "), result.stderr
    assert len(lines) == 1 or not single, result.stderr
    return "\n".join(lines)


@pytest.mark.parametrize("command", ["render", "plan"])
def test_binary_train_config(command, binary_file):
    line = _error_line(run_cli(command, "--train-config", str(binary_file)))
    assert f"trainer config {binary_file} is not a text file" in line and "YAML" in line


@pytest.mark.parametrize("command", ["render", "preflight", "teardown"])
def test_directory_as_deployment_config(command, tmp_path, no_credentials):
    line = _error_line(run_cli(command, "--config", str(tmp_path)))
    assert f"config file {tmp_path} is a directory" in line


@pytest.mark.parametrize("command", ["render", "teardown"])
def test_binary_deployment_config(command, binary_file, no_credentials):
    line = _error_line(run_cli(command, "--config", str(binary_file)))
    assert f"config file {binary_file} is not a text file" in line


def test_validate_binary_file(binary_file):
    line = _error_line(run_cli("validate", str(binary_file)))
    assert f"{binary_file} is not a text file" in line and "manifest" in line


def test_validate_directory_says_directory(tmp_path):
    line = _error_line(run_cli("validate", str(tmp_path)))
    assert f"{tmp_path} is a directory" in line and "does not exist" not in line


def test_render_output_is_an_existing_file(tmp_path):
    target = tmp_path / "manifests"
    target.write_text("keep me")
    line = _error_line(run_cli("render", "--out", str(target)))
    assert f"--out {target} is a file" in line and "directory" in line
    assert target.read_text() == "keep me"


def test_local_run_dir_is_a_file(tmp_path):
    target = tmp_path / "run"
    target.write_text("not a run")
    line = _error_line(run_cli("local", "--run-dir", str(target)))
    assert f"--run-dir {target} is a file" in line


@pytest.mark.parametrize("port", ["70000", "65535", "0"])
def test_local_port_out_of_range(port, tmp_path):
    line = _error_line(run_cli("local", "--port", port, "--run-dir", str(tmp_path / "run")))
    assert f"--port {port}: give a TCP port from 1 to 65534" in line
    assert not (tmp_path / "run").exists()


def test_plan_step_time_zero():
    line = _error_line(run_cli("plan", "--step-time-s", "0"))
    assert "--step-time-s must be above 0" in line


@pytest.mark.parametrize(
    "args, echoed",
    [
        (["render", "--faults", "boom[/]@3"], "boom[/]@3"),
        (["render", "--faults", "[bold]boom@3"], "[bold]boom@3"),
        (["render", "--name", "x[/]"], "x[/]"),
        (["render", "-p", "x[/]"], "x[/]"),
        (["render", "--set", "a[/]=1"], "a[/]"),
        (["local", "--faults", "boom[/]@3"], "boom[/]@3"),
    ],
)
def test_markup_in_user_input_is_printed_literally(args, echoed):
    line = _error_line(run_cli(*args), single=False)
    assert echoed in line


def test_markup_in_a_config_path_is_printed_literally(tmp_path):
    path = tmp_path / "a[/]" / "x.yaml"
    line = _error_line(run_cli("render", "--config", str(path)))
    assert f"config file {path} does not exist" in line


def _events(run_dir: Path, lines: list[bytes]) -> None:
    events = run_dir / "events"
    events.mkdir(parents=True)
    (events / "rank0.jsonl").write_bytes(b"\n".join(lines) + b"\n")


def _event(t: float, event: str, **fields) -> bytes:
    record = {"v": 1, "t": t, "event": event, "rank": 0, "pid": 1, "host": "h", "cycle": 0, "iteration": 0}
    return json.dumps({**record, **fields}).encode()


def test_report_reads_events_with_damaged_bytes(tmp_path):
    _events(
        tmp_path,
        [
            _event(1.0, "run_start", world_size=1, preset="tiny", steps=2),
            b'{"v":1,"t":1.5,"event":"step_end","note":"\xff\xfe"',  # torn and not UTF-8
            BINARY[:40],
            _event(2.0, "step_end", step=1, loss=1.0, lr=0.001, step_s=0.5, batch_sha256="a"),
            _event(3.0, "step_end", step=2, loss=0.9, lr=0.001, step_s=0.5, batch_sha256="b"),
        ],
    )
    result = run_cli("report", str(tmp_path), "--png", str(tmp_path / "t.png"))
    assert result.code == 0, result.output
    assert "Traceback" not in result.output


def test_report_with_only_unparseable_lines_says_so(tmp_path):
    _events(tmp_path, [BINARY[:40], b"{not json", b"[1, 2]"])
    line = _error_line(run_cli("report", str(tmp_path)))
    assert "holds 3 line(s) but none is a readable event" in line and "has no events" not in line


def test_report_on_a_file(tmp_path):
    target = tmp_path / "rank0.jsonl"
    target.write_text("{}")
    line = _error_line(run_cli("report", str(target)))
    assert f"{target} is a file" in line and "does not exist" not in line


@pytest.mark.parametrize("kind", ["directory", "missing"])
def test_train_config_names_the_right_flag(kind, tmp_path):
    path = tmp_path if kind == "directory" else tmp_path / "no.yaml"
    line = _error_line(run_cli("render", "--train-config", str(path)))
    assert line.startswith(f"error: --train-config {path} ")
    assert ("is a directory" in line) == (kind == "directory")
    assert "check the --config path" not in line


@pytest.mark.parametrize("command", ["render", "validate"])
def test_set_value_with_a_control_character_is_named(command):
    line = _error_line(run_cli(command, "--set", "run_dir=/fsx/a\x01b"))
    assert "--set run_dir: holds the control character U+0001" in line


def test_data_with_a_control_character_is_named():
    line = _error_line(run_cli("render", "--data", "shards\x7f"))
    assert "--data: holds the control character U+007F" in line


@pytest.mark.parametrize("value", ["inf", "1e308", "nan", "86401"])
def test_render_max_step_time_must_be_finite_and_at_most_a_day(value):
    line = _error_line(run_cli("render", "--max-step-time-s", value))
    assert f"--max-step-time-s {float(value):g}: give the seconds of one training step" in line
    assert "at most 86400 (a day)" in line


@pytest.mark.parametrize(
    "override",
    [
        "fault_tolerance.section_timeouts_s.step=inf",
        "fault_tolerance.section_timeouts_s.setup=1e300",
        f"steps={10**13}",
    ],
)
def test_render_deadline_beyond_what_kubernetes_keeps_is_named(override):
    line = _error_line(run_cli("render", "--set", override))
    assert "the job's deadline (activeDeadlineSeconds) comes to" in line
    assert "beyond the 9223372036 s Kubernetes can keep" in line


@pytest.mark.parametrize(
    "flag, value, expected",
    [
        ("--node-mtbf-hours", "inf", "give the mean hours between failures of one node, at most 1e+07"),
        ("--node-mtbf-hours", "1e308", "give the mean hours between failures of one node, at most 1e+07"),
        ("--step-time-s", "inf", "give the seconds of one training step, above 0 and at most 86400"),
        ("--step-time-s", "1e308", "give the seconds of one training step, above 0 and at most 86400"),
        ("--sync-stall-s", "inf", "give the measured seconds one save stalls training, above 0"),
        ("--async-stall-s", "1e308", "give the measured seconds one save stalls training, above 0"),
        # A stall of 0 divided by zero in the interval arithmetic.
        ("--async-stall-s", "0", "give the measured seconds one save stalls training, above 0"),
    ],
)
def test_plan_figures_must_be_finite_and_plausible(flag, value, expected):
    line = _error_line(run_cli("plan", flag, value))
    assert f"{flag} {float(value):g}: {expected}" in line
