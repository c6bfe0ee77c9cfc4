"""nvrx_eks.facts.checkout: the checkout-only commands find the repository, or name the fix."""

from __future__ import annotations

import pytest

from nvrx_eks.facts import checkout
from nvrx_eks.facts.errors import ConfigError
from tests.support import REPO_ROOT


def test_checkout_root_is_the_repository_with_cdk_json():
    assert checkout.checkout_root() == REPO_ROOT


def test_without_a_checkout_the_cdk_commands_name_the_fix(monkeypatch, tmp_path):
    monkeypatch.setattr(checkout, "_SOURCE_ROOT", tmp_path)
    with pytest.raises(ConfigError, match=r"needs the nvrx-eks repository checkout .*make setup"):
        checkout.checkout_root()
