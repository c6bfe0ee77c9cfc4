"""ConfigError stays data until printed: issues (field path, message) and the source, formatted once."""

from __future__ import annotations

import pytest
from pydantic import BaseModel, ConfigDict, ValidationError

from nvrx_eks.facts.errors import ConfigError, describe_validation_error
from workloads.checkpoint.errors import CheckpointIncompatible


def test_a_plain_message_is_one_issue_about_the_whole_input():
    error = ConfigError("--nodes 0: give at least one node")
    assert error.issues == [((), "--nodes 0: give at least one node")]
    assert str(error) == "--nodes 0: give at least one node"


def test_subclasses_keep_working_with_a_plain_message():
    error = CheckpointIncompatible("the checkpoint was written by another model")
    assert isinstance(error, ConfigError) and str(error) == "the checkpoint was written by another model"
    assert error.issues == [((), "the checkpoint was written by another model")]


def test_issues_print_under_a_heading_one_line_each_continuations_indented():
    error = ConfigError(
        issues=[(("checkpoint", "dir"), "must be absolute"), ((), "two problems\nsecond line")], source="train.yaml"
    )
    assert str(error) == (
        "invalid configuration in train.yaml:\n"
        "  checkpoint.dir: must be absolute\n"
        "  (top level): two problems\n"
        "  second line"
    )


def test_pydantic_errors_become_issues_by_field_path():
    class Section(BaseModel):
        model_config = ConfigDict(extra="forbid")
        steps: int

    class Config(BaseModel):
        model_config = ConfigDict(extra="forbid")
        section: Section

    with pytest.raises(ValidationError) as raised:
        Config.model_validate({"section": {"stepz": 1}})
    error = describe_validation_error(raised.value, "config.yaml")
    assert error.source == "config.yaml"
    assert error.issues == [
        (("section", "steps"), "required field is missing; add it"),
        (("section", "stepz"), "unknown field; remove it or check its spelling"),
    ]
    assert str(error).startswith("invalid configuration in config.yaml:\n  section.steps: required field")
