"""nvrx_eks.resources in the checkout: the editable install maps nvrx_eks.templates onto templates/,
and the checkout-only commands name the fix when there is no checkout."""

from __future__ import annotations

import pytest

from nvrx_eks import resources
from nvrx_eks.facts.errors import ConfigError
from tests.support import REPO_ROOT


def test_templates_resolve_to_the_checkouts_templates_folder():
    """Editing templates/ changes what `nvrx-eks render` reads, without reinstalling."""
    assert resources.templates_dir() == REPO_ROOT / "templates"
    assert (resources.templates_dir() / "scripts" / "trainer-entrypoint.sh.j2").is_file()


def test_checkout_root_is_the_repository_with_cdk_json():
    assert resources.checkout_root() == REPO_ROOT


def test_without_a_checkout_the_cdk_commands_name_the_fix(monkeypatch, tmp_path):
    monkeypatch.setattr(resources, "_SOURCE_ROOT", tmp_path)
    with pytest.raises(ConfigError, match=r"needs the nvrx-eks repository checkout .*make setup"):
        resources.checkout_root()
