"""The directories a job writes and reads are placed on FSx, normalised, and never climb out of it:
`render` refuses a `..` component in run_dir, checkpoint.dir and data.path, and `validate` judges
the normalised path, not its spelling."""

from __future__ import annotations

import pytest
import yaml

from infra.config import resolve_config
from nvrx_eks.facts.errors import ConfigError
from nvrx_eks.jobs.spec import build_jobspec
from nvrx_eks.jobs.validate import validate_documents
from nvrx_eks.jobs.validate.findings import format_path
from tests.support.cli_harness import run_cli
from tests.support.manifest_cases import GOLDEN_DIR, GOLDEN_IMAGE, Case
from workloads.config import TrainConfig

FIELDS = ("run_dir", "checkpoint.dir", "data.path")


@pytest.mark.parametrize("field", FIELDS)
@pytest.mark.parametrize("path", ["../../etc", "runs/../../etc", "/fsx/../etc", "/fsx/runs/a/../b"])
def test_render_refuses_a_parent_component(field, path):
    overrides = ["--set", f"{field}={path}", *(["--set", "data.source=memmap"] if field == "data.path" else [])]
    result = run_cli("render", "--nodes", "2", "--image", GOLDEN_IMAGE, *overrides)
    assert result.code == 2, result.output
    assert "Traceback" not in result.output
    assert f"--set {field}: '{path}' has a '..' component" in result.stderr
    assert "without '..'" in result.stderr


def _train(**overrides: str) -> TrainConfig:
    return TrainConfig.from_dict({}, source="test", overrides=[f"{k}={v}" for k, v in overrides.items()])


def test_paths_are_normalised_onto_fsx():
    train = _train(
        run_dir="runs//train/./b",
        **{"checkpoint.dir": "/fsx/runs/train/ckpt/", "data.source": "memmap", "data.path": "./data/shards"},
    )
    spec = build_jobspec(resolve_config("p5"), nodes=2, name="train", train=train, image=GOLDEN_IMAGE)
    assert spec.train.run_dir == "/fsx/runs/train/b"
    assert spec.train.checkpoint.dir == "/fsx/runs/train/ckpt"
    assert spec.train.data.path == "/fsx/data/shards"


def test_build_jobspec_names_the_field():
    with pytest.raises(ConfigError, match=r"checkpoint\.dir: '\.\./x' has a '\.\.' component"):
        build_jobspec(resolve_config("p5"), nodes=2, name="train", train=_train(**{"checkpoint.dir": "../x"}))


CASE = Case("p5", "jobset", 2)


def _documents_with(field: str, value: str) -> list[dict]:
    documents = [d for d in yaml.safe_load_all((GOLDEN_DIR / f"{CASE.id}.yaml").read_text()) if d]
    config_map = next(d for d in documents if d["kind"] == "ConfigMap")
    train = yaml.safe_load(config_map["data"]["train.yaml"])
    section, _, key = field.rpartition(".")
    (train[section] if section else train)[key] = value
    if field == "data.path":
        train["data"]["source"] = "memmap"
    config_map["data"]["train.yaml"] = yaml.safe_dump(train)
    return documents


@pytest.mark.parametrize("field", FIELDS)
def test_validate_refuses_a_rendered_path_that_climbs_out(field):
    documents = _documents_with(field, "/fsx/../../etc/nvrx")
    findings = [(f.document, f.path, f.message) for f in validate_documents(documents, CASE.expectations()).errors]
    path = format_path(["data", "train.yaml", *field.split(".")])
    assert any(doc == "ConfigMap/train-config" and at == path and "'..' component" in m for doc, at, m in findings), (
        findings
    )


def test_validate_judges_the_normalised_path():
    # Spelled under /fsx/, but it is /fsx itself: no run directory of its own on the volume.
    documents = _documents_with("run_dir", "/fsx/./")
    paths = [f.path for f in validate_documents(documents, CASE.expectations()).errors]
    assert format_path(["data", "train.yaml", "run_dir"]) in paths
    # The rendered run directory, spelled differently, is the same place.
    assert validate_documents(_documents_with("run_dir", "/fsx/runs//train/"), CASE.expectations()).errors == []
