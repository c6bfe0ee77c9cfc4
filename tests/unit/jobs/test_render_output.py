"""`render`'s output as kubectl users read it: `-o yaml|json` is the format of the objects on
stdout (the job summary goes to stderr, so stdout is data alone), `--out DIR` writes one file per
object in that format, and `-o DIR`, the option's old meaning, is refused with a pointer to --out."""

from __future__ import annotations

import json

import pytest
import yaml

from tests.support.cli_harness import run_cli


@pytest.fixture(scope="module")
def yaml_objects() -> list[dict]:
    result = run_cli("render", "--nodes", "2")
    assert result.code == 0, result.output
    return list(yaml.safe_load_all(result.stdout))


def test_json_is_one_kubectl_list_of_the_yaml_objects(yaml_objects):
    result = run_cli("render", "--nodes", "2", "-o", "json")
    assert result.code == 0, result.output
    listed = json.loads(result.stdout)  # the whole of stdout: nothing but the document
    assert (listed["apiVersion"], listed["kind"]) == ("v1", "List")
    assert listed["items"] == yaml_objects
    assert [o["kind"] for o in yaml_objects] == ["ConfigMap", "JobSet", "NetworkPolicy"]
    assert "job train: 2 x p5.48xlarge" in result.stderr


def test_validate_reads_the_json_list_as_its_objects():
    rendered = run_cli("render", "--nodes", "2", "-o", "json")
    validated = run_cli("validate", "-", stdin=rendered.stdout)
    assert validated.code == 0, validated.output
    assert "3 document(s) checked" in validated.stdout and ": valid" in validated.stdout


def test_out_with_json_writes_one_json_file_per_object(tmp_path, yaml_objects):
    result = run_cli("render", "--nodes", "2", "-o", "json", "--out", str(tmp_path / "out"))
    assert result.code == 0, result.output
    assert result.stdout == ""
    files = sorted((tmp_path / "out").iterdir())
    assert [f.name for f in files] == ["configmap-train-config.json", "jobset-train.json", "networkpolicy-train.json"]
    assert [json.loads(f.read_text()) for f in files] == yaml_objects
    assert f"wrote {files[0]}" in " ".join(result.stderr.split())


@pytest.mark.parametrize("value", ["some/dir", "manifests", "table"])
def test_the_old_directory_form_points_to_out(tmp_path, monkeypatch, value):
    monkeypatch.chdir(tmp_path)
    result = run_cli("render", "-o", value)
    assert result.code == 2
    assert result.stdout == ""
    assert result.stderr.strip() == (
        f"error: -o/--output '{value}': use yaml or json (write files into a directory with --out {value})"
    )
    assert list(tmp_path.iterdir()) == []  # nothing written where the old form would have
