"""YAML a user wrote (nvrx_eks.facts.user_yaml): a trainer config (`--train-config`, the trainer's
`--config`, the ConfigMap `validate` reads), a deployment profile and a `--set` value are
refused, in one line naming the file or flag and the fix, when they nest deeper than
MAX_NESTING, run past MAX_YAML_CHARS or give one key twice: exit 2 from the CLI and 93 from the
trainer, where PyYAML's recursion ended in a RecursionError traceback and a repeated key
silently won."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from infra.config import resolve_config
from nvrx_eks.facts.errors import ConfigError
from nvrx_eks.facts.exit_codes import EXIT_DO_NOT_REQUEUE
from nvrx_eks.facts.user_yaml import MAX_NESTING, MAX_YAML_CHARS, load_user_yaml
from nvrx_eks.jobs.render import render_job
from nvrx_eks.jobs.spec import TRAIN_CONFIG_KEY, build_jobspec
from nvrx_eks.jobs.validate import Expectations, validate_documents
from tests.support.cli_harness import run_cli
from tests.support.cli_process import cli_process
from tests.support.profiles import profile_file

#: What the review ran: a sequence 20,000 deep, a flow mapping 3,000 deep, and the same in block
#: style (one space of indentation per level, 1,000 levels: within MAX_YAML_CHARS).
DEEP = {
    "sequence": "steps: " + "[" * 20_000 + "]" * 20_000 + "\n",
    "flow mapping": "model: " + "{a: " * 3_000 + "1" + "}" * 3_000 + "\n",
    "block mapping": "".join(" " * level + "a:\n" for level in range(1_000)) + " " * 1_000 + "a: 1\n",
}
DUPLICATE = "steps: 10\ncheckpoint:\n  interval_steps: 5\nsteps: 999999\n"


def _one_line(text: str) -> str:
    lines = text.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in text, text
    return lines[0]


@pytest.mark.parametrize("text", DEEP.values(), ids=DEEP.keys())
def test_render_refuses_a_deep_train_config_in_one_line_with_exit_2(tmp_path, text):
    (path := tmp_path / "deep.yaml").write_text(text)
    result = run_cli("render", "--nodes", "2", "--train-config", str(path))
    assert result.code == 2, result.output
    assert _one_line(result.stderr) == (
        f"error: {path}{'' if text.count(chr(10)) == 1 else ':' + str(MAX_NESTING + 1)}: nests mappings and "
        f"sequences more than {MAX_NESTING} deep; no setting does, check the indentation or brackets"
    )


def test_render_refuses_a_key_given_twice_naming_it_and_both_lines(tmp_path):
    (path := tmp_path / "dup.yaml").write_text(DUPLICATE)
    result = run_cli("render", "--nodes", "2", "--train-config", str(path))
    assert result.code == 2, result.output
    assert _one_line(result.stderr) == (
        f"error: {path}:4: the key 'steps' is given a second time in the same mapping (first at line 1); "
        "keep one of them"
    )


@pytest.mark.parametrize("preflight", [True, False], ids=["preflight", "rank"])
@pytest.mark.parametrize("text", [DEEP["sequence"], DEEP["flow mapping"], DUPLICATE], ids=["deep", "mapping", "dup"])
def test_the_trainer_exits_93_in_one_line_on_such_a_config(tmp_path, capsys, monkeypatch, text, preflight):
    from workloads import train

    # Its way out for any other error: a traceback and exit 1, without ending this test process.
    monkeypatch.setattr(train, "_leave_after_failure", lambda: pytest.fail("exit 1 with a traceback"))
    (path := tmp_path / "train.yaml").write_text(text)
    code = train.main(["--config", str(path), *(["--preflight", "--world-size", "2"] if preflight else [])])
    assert code == EXIT_DO_NOT_REQUEUE
    assert _one_line(capsys.readouterr().err).startswith(f"error: {path}")


def test_a_deep_or_repeated_set_value_exits_2_naming_the_override():
    deep = run_cli("render", "--nodes", "2", "--set", "steps=" + "[" * 20_000 + "]" * 20_000)
    assert deep.code == 2, deep.output
    assert _one_line(deep.stderr).startswith(
        f"error: override steps: nests mappings and sequences more than {MAX_NESTING}"
    )
    repeated = run_cli("render", "--nodes", "2", "--set", "model={preset: tiny, preset: small}")
    assert repeated.code == 2, repeated.output
    assert "error: override model: the key 'preset' is given a second time" in _one_line(repeated.stderr)


@pytest.mark.parametrize("kind", ["deep", "dup"])
def test_a_deployment_profile_is_held_to_the_same_bounds(tmp_path, kind):
    path = profile_file(tmp_path / "profile")
    text = Path(path).read_text()
    path.write_text(
        text + ("extra: " + "[" * 20_000 + "]" * 20_000 + "\n" if kind == "deep" else "region: us-west-2\n")
    )
    result = run_cli("render", "--nodes", "2", "--config", str(path))
    assert result.code == 2, result.output
    expected = "nests mappings and sequences" if kind == "deep" else "the key 'region' is given a second time"
    assert expected in _one_line(result.stderr)


def test_validate_reports_a_deep_train_config_in_the_config_map_as_a_finding():
    documents = render_job(build_jobspec(resolve_config(), nodes=2, name="train")).documents
    documents[0]["data"][TRAIN_CONFIG_KEY] = DEEP["sequence"]
    report = validate_documents(documents, Expectations("1.35", "training", "fsx-lustre", "p5.48xlarge"))
    assert any(f"more than {MAX_NESTING} deep" in finding.message for finding in report.errors), report.findings


def test_bounds_hold_what_configs_use_and_refuse_what_they_do_not():
    at_bound = "a: " + "[" * (MAX_NESTING - 1) + "]" * (MAX_NESTING - 1)
    assert load_user_yaml(at_bound, "x") is not None
    with pytest.raises(ConfigError, match="more than 50 deep"):
        load_user_yaml("a: " + "[" * MAX_NESTING + "]" * MAX_NESTING, "x")
    # Anchors, aliases and a merge whose keys the mapping overrides stay YAML as it is written.
    merged = load_user_yaml("base: &b {steps: 3, seed: 1}\nrun:\n  <<: *b\n  steps: 9\nagain: *b\n", "x")
    assert merged["run"] == {"steps": 9, "seed": 1} and merged["again"] == {"steps": 3, "seed": 1}
    # Keys equal once read are one key, however they are written.
    with pytest.raises(ConfigError, match="x:2: the key 'steps' is given a second time"):
        load_user_yaml("steps: 1\n'steps': 2\n", "x")
    with pytest.raises(ConfigError, match=f"more than the {MAX_YAML_CHARS:,} a config may have"):
        load_user_yaml("#" * (MAX_YAML_CHARS + 1), "x")


def test_a_pipe_or_a_device_is_refused_before_it_is_read(tmp_path):
    """A FIFO given as --train-config waited for a writer for ever, /dev/zero read until memory
    ran out: both are refused without reading (the FIFO in a process of its own, so that a
    regression fails at the timeout instead of hanging the suite)."""
    fifo = tmp_path / "train.yaml"
    os.mkfifo(fifo)
    for flag, path in (("--train-config", fifo), ("--config", fifo), ("--train-config", Path("/dev/zero"))):
        done = cli_process("render", "--nodes", "2", flag, str(path), timeout=60)
        assert done.returncode == 2, done.stderr
        assert (
            _one_line(done.stderr)
            == f"error: {path} is a pipe or a device, not a file; give the path of the YAML file itself"
        )
    trainer = subprocess.run(
        [sys.executable, "-m", "workloads.train", "--config", str(fifo), "--preflight", "--world-size", "2"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert trainer.returncode == EXIT_DO_NOT_REQUEUE, trainer.stderr
    assert _one_line(trainer.stderr).startswith(f"error: {fifo} is a pipe or a device")
