"""A job writes only its own directory on the shared file system, /fsx/runs/<its name>: `render`
(and so `validate` and `submit`, which render first) refuses a run_dir or checkpoint.dir anywhere
else, naming the field and the fix, and `validate` refuses a rendered trainer config edited to
point elsewhere. Before, a job could be pointed at another job's run, the dataset import path or
every run (/fsx/runs), and its pods would have mounted that writable."""

from __future__ import annotations

import pytest
import yaml

from nvrx_eks.jobs.validate import validate_documents
from nvrx_eks.jobs.validate.findings import format_path
from tests.support.cli_harness import run_cli
from tests.support.manifest_cases import GOLDEN_DIR, GOLDEN_IMAGE, Case

#: (--set, the field, the normalised path); the job is named b. A hint names the run's own job
#: where the path is another job's run.
OUTSIDE = [
    ("run_dir=/fsx/runs/train", "run_dir", "/fsx/runs/train"),
    ("checkpoint.dir=/fsx/runs/train/checkpoints", "checkpoint.dir", "/fsx/runs/train/checkpoints"),
    ("run_dir=runs/bb", "run_dir", "/fsx/runs/bb"),
    ("run_dir=/fsx/s3/corpus", "run_dir", "/fsx/s3/corpus"),
    ("checkpoint.dir=/fsx/data", "checkpoint.dir", "/fsx/data"),
    ("checkpoint.dir=data", "checkpoint.dir", "/fsx/data"),
    ("run_dir=/fsx/runs", "run_dir", "/fsx/runs"),
    ("run_dir=/fsx/runs/", "run_dir", "/fsx/runs"),
    ("run_dir=/fsx", "run_dir", "/fsx"),
    ("checkpoint.dir=/tmp/ckpt", "checkpoint.dir", "/tmp/ckpt"),
]


@pytest.mark.parametrize("override, field, path", OUTSIDE, ids=[o[0] for o in OUTSIDE])
def test_render_refuses_a_directory_outside_the_jobs_own(override, field, path):
    result = run_cli("render", "--nodes", "2", "--image", GOLDEN_IMAGE, "--name", "b", "--set", override)
    assert result.code == 2, result.output
    assert "Traceback" not in result.output and result.stdout == ""
    (line,) = result.stderr.strip().splitlines()
    assert f"--set {field}: {path} is outside this job's own directory /fsx/runs/b" in line
    assert "give a path under /fsx/runs/b" in line
    other_run = path.removeprefix("/fsx/runs/").split("/")[0] if path.startswith("/fsx/runs/") else None
    assert (f"--name {other_run}" in line) == (other_run is not None), line


@pytest.mark.parametrize(
    "overrides, run_dir, checkpoint_dir",
    [
        ([], "/fsx/runs/b", None),
        (["run_dir=runs/b/attempt2"], "/fsx/runs/b/attempt2", None),
        (["checkpoint.dir=/fsx/runs/b/ckpt"], "/fsx/runs/b", "/fsx/runs/b/ckpt"),
        (["run_dir=/fsx/runs//b/./"], "/fsx/runs/b", None),
    ],
)
def test_render_places_a_job_in_its_own_directory(overrides, run_dir, checkpoint_dir):
    sets = [arg for override in overrides for arg in ("--set", override)]
    result = run_cli("render", "--nodes", "2", "--image", GOLDEN_IMAGE, "--name", "b", *sets)
    assert result.code == 0, result.output
    config_map = next(d for d in yaml.safe_load_all(result.stdout) if d and d["kind"] == "ConfigMap")
    train = yaml.safe_load(config_map["data"]["train.yaml"])
    assert (train["run_dir"], train["checkpoint"]["dir"]) == (run_dir, checkpoint_dir)


CASE = Case("p5", "jobset", 2)


def _golden_with(field: str, value: str) -> list[dict]:
    """The golden job (named train) with its trainer config's `field` edited to `value`."""
    documents = [d for d in yaml.safe_load_all((GOLDEN_DIR / f"{CASE.id}.yaml").read_text()) if d]
    config_map = next(d for d in documents if d["kind"] == "ConfigMap")
    train = yaml.safe_load(config_map["data"]["train.yaml"])
    section, _, key = field.rpartition(".")
    (train[section] if section else train)[key] = value
    config_map["data"]["train.yaml"] = yaml.safe_dump(train)
    return documents


@pytest.mark.parametrize(
    "field, value",
    [
        ("run_dir", "/fsx/runs/other"),
        ("run_dir", "/fsx/runs"),
        ("checkpoint.dir", "/fsx/runs/other/checkpoints"),
        ("checkpoint.dir", "/fsx/data"),
    ],
)
def test_validate_refuses_a_rendered_job_writing_outside_its_own_directory(field, value):
    findings = validate_documents(_golden_with(field, value), CASE.expectations()).errors
    path = format_path(["data", "train.yaml", *field.split(".")])
    assert any(
        f.document == "ConfigMap/train-config" and f.path == path and "outside this job's own directory" in f.message
        for f in findings
    ), findings
