"""Shared fixtures. The CDK app is synthesized once per configuration per test session (jsii
start-up and synthesis cost seconds and hundreds of MB); every infra test reads the cache.

Infra tests carry `pytest.mark.xdist_group("synth")` so that under `pytest -n 2 --dist
loadgroup` they share one worker and therefore one synthesis per configuration.
"""

from __future__ import annotations

import os

import pytest

from nvrx_eks.jobs.crds import CRD_DIR_ENV
from tests.support import REPO_ROOT

#: Fixture modules shared by tests of several tiers.
pytest_plugins = ["tests.support.entrypoint_sandbox"]

#: The upstream CRD files kept in the repository (unmodified, see tests/upstream/README.md). The
#: validator's CRD layer reads them instead of fetching into the user cache, so no test touches
#: the network.
UPSTREAM_CRD_DIR = REPO_ROOT / "tests" / "upstream" / "crds"
os.environ[CRD_DIR_ENV] = str(UPSTREAM_CRD_DIR)

_cache: dict = {}


class Synthesized:
    """Templates of one synthesized configuration, with small lookup helpers."""

    def __init__(self, result):
        self.result = result
        self.config = result.config
        self.templates = result.templates
        self.stack_names = result.stack_names
        self.outdir = result.outdir

    def resources(self, role: str, type_: str) -> dict[str, dict]:
        return {k: v for k, v in self.templates[role]["Resources"].items() if v["Type"] == type_}

    def one(self, role: str, type_: str) -> dict:
        found = self.resources(role, type_)
        assert len(found) == 1, f"expected one {type_} in the {role} stack, found {len(found)}"
        return next(iter(found.values()))


@pytest.fixture(scope="session")
def synth(tmp_path_factory):
    """synth(profile name or DeploymentConfig) -> Synthesized, cached for the session."""
    from infra.config import DeploymentConfig, resolve_config
    from nvrx_eks.deploy.synth import synthesize_profile

    def get(profile: str | DeploymentConfig) -> Synthesized:
        config = resolve_config(profile) if isinstance(profile, str) else profile
        key = config.model_dump_json()
        if key not in _cache:
            _cache[key] = Synthesized(synthesize_profile(config, tmp_path_factory.mktemp("cdk.out")))
        return _cache[key]

    return get
