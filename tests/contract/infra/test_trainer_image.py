"""The trainer image asset stages its build context from the list of what the image holds
(nvrx_eks/facts/image_contents.py), in a stand-in checkout whose .dockerignore admits more."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from infra.config import resolve_config
from nvrx_eks.facts import checkout
from nvrx_eks.facts.errors import ConfigError
from nvrx_eks.facts.image_contents import BUILD_INPUTS, CODE, DOCKERFILE

pytestmark = [pytest.mark.synth, pytest.mark.xdist_group("synth")]

#: Beside the image's paths in the stand-in checkout: operator code and a build output.
OTHERS = ("nvrx_eks/cli/__init__.py", "nvrx_eks/ops/preflight.py", "node_modules/aws-cdk/index.js")


def _stand_in_checkout(root: Path, skip: str | None = None) -> set[str]:
    """cdk.json, the Dockerfile, one file per path of the list (a module inside each folder)
    and OTHERS; returns the files the image should hold."""
    held = {DOCKERFILE}
    for path in BUILD_INPUTS + CODE:
        if path == skip:
            continue
        held.add(path if path.endswith((".py", ".toml")) else f"{path}/module.py")
    for relative in (*held, *OTHERS, "cdk.json"):
        (root / relative).parent.mkdir(parents=True, exist_ok=True)
        (root / relative).write_text(f"# {relative}\n")
    # A .dockerignore that admits all of nvrx_eks: the asset must still stage the list only.
    (root / ".dockerignore").write_text("*\n!pyproject.toml\n!scripts\n!nvrx_eks\n!workloads\n")
    return held


def _staged_files(tmp_path: Path) -> set[str]:
    from aws_cdk import App, Stack

    from infra.constructs.image import TrainerImage

    app = App(outdir=str(tmp_path / "cdk.out"), builtin_cloud_formation_validation=False)
    stack = Stack(app, "ImageOnly")
    TrainerImage(stack, "TrainerImage", config=resolve_config("p5"))
    app.synth()
    assets = json.loads((tmp_path / "cdk.out" / "ImageOnly.assets.json").read_text())
    (image,) = assets["dockerImages"].values()
    context = tmp_path / "cdk.out" / image["source"]["directory"]
    return {str(p.relative_to(context)) for p in context.rglob("*") if p.is_file()}


def test_the_asset_stages_the_list_of_what_the_image_holds(tmp_path, monkeypatch):
    root = tmp_path / "checkout"
    held = _stand_in_checkout(root)
    monkeypatch.setattr(checkout, "_SOURCE_ROOT", root)
    # CDK always stages the .dockerignore itself.
    assert _staged_files(tmp_path) == held | {".dockerignore"}


@pytest.mark.parametrize("missing", ["scripts/trainer_requirements.py", "nvrx_eks/ops/gpu_env.py", "nvrx_eks/facts"])
def test_a_listed_path_missing_from_the_checkout_stops_the_synth_naming_it(tmp_path, monkeypatch, missing):
    root = tmp_path / "checkout"
    _stand_in_checkout(root, skip=missing)
    monkeypatch.setattr(checkout, "_SOURCE_ROOT", root)
    with pytest.raises(ConfigError, match=rf"image.build is true but {root / missing} is missing"):
        _staged_files(tmp_path)
