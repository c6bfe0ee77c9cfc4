"""`validate` reads manifests it did not write (a pull request's, say): YAML aliases that expand
a few lines into billions of nodes, an alias inside the node it names, and nesting deeper than
the checks can recurse are refused while loading, naming the bound; the rendered jobs load as
before."""

from __future__ import annotations

import pytest
import yaml

from nvrx_eks.facts.errors import ConfigError
from nvrx_eks.jobs.validate import MAX_ALIAS_NODES, MAX_NESTING, load_documents, node_counts
from tests.support.cli_harness import run_cli
from tests.support.manifest_cases import GOLDEN_CASES, Case


def _crd_with_alias_bomb(levels: int = 8, fan_out: int = 8) -> str:
    """A CustomResourceDefinition whose schema, in a schema-valid position, expands through
    aliases to fan_out**levels property schemas (8**8: ~93 million nodes in 16 lines)."""
    anchors = ["          l0: &l0 {type: string}"]
    for level in range(1, levels + 1):
        properties = ", ".join(f"p{i}: *l{level - 1}" for i in range(fan_out))
        anchors.append(f"          l{level}: &l{level} {{type: object, properties: {{{properties}}}}}")
    head = """apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: bombs.example.com
spec:
  group: example.com
  names: {kind: Bomb, plural: bombs}
  scope: Namespaced
  versions:
  - name: v1
    served: true
    storage: true
    schema:
      openAPIV3Schema:
        type: object
        properties:
"""
    return head + "\n".join(anchors) + "\n"


def test_alias_bomb_is_refused_naming_the_bound():
    with pytest.raises(ConfigError) as refused:
        load_documents(_crd_with_alias_bomb(), "bomb.yaml")
    message = str(refused.value)
    assert "bomb.yaml document 0: its YAML aliases expand" in message
    assert f"more than the {MAX_ALIAS_NODES:,} aliases may add" in message


def test_cli_validate_refuses_the_alias_bomb_with_exit_2(tmp_path):
    path = tmp_path / "bomb.yaml"
    path.write_text(_crd_with_alias_bomb())
    result = run_cli("validate", str(path))
    assert result.code == 2, result.output
    assert "Traceback" not in result.output
    assert f"more than the {MAX_ALIAS_NODES:,} aliases may add" in result.stderr


def test_aliases_within_the_bound_load_and_are_counted_expanded():
    # 8**4 leaves: 4,681 nodes once expanded, from 34 written.
    text = _crd_with_alias_bomb(levels=4)
    (document,) = load_documents(text, "small.yaml")
    written, expanded = node_counts(document, source="small.yaml")
    assert written < 200 and expanded > 4 * 8**4
    assert expanded - written <= MAX_ALIAS_NODES


@pytest.mark.parametrize("text", ["a: &a [*a]\n", "a: &a {x: *a}\n"])
def test_alias_inside_the_node_it_names_is_refused(text):
    manifest = "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\n" + text
    with pytest.raises(ConfigError, match="a YAML alias refers to a node that contains it"):
        load_documents(manifest, "loop.yaml")


def test_nesting_deeper_than_the_checks_recurse_is_refused():
    depth = MAX_NESTING + 1
    manifest = "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\nx: " + "[" * depth + "]" * depth + "\n"
    with pytest.raises(ConfigError, match=f"nests mappings and sequences more than {MAX_NESTING} deep"):
        load_documents(manifest, "deep.yaml")


@pytest.mark.parametrize("case", GOLDEN_CASES, ids=lambda c: c.id)
def test_rendered_jobs_load_unchanged(case: Case):
    text = case.golden_path.read_text()
    documents = load_documents(text, str(case.golden_path))
    assert documents == [d for d in yaml.safe_load_all(text) if d is not None]
    for document in documents:
        written, expanded = node_counts(document, source="golden")
        assert written == expanded
