"""Offline validation of rendered manifests, in three layers, every finding naming the path of
the offending field (`spec.replicatedJobs[0].template.spec.template.spec.containers[0].image`):
kubernetes (core schemas, strict), crd (the JobSet / PyTorchJob CRDs; skipped with a message
when the pinned files cannot be had) and rules (this project's rules and pod security).
"""

from __future__ import annotations

import copy

import yaml

from nvrx_eks.facts.errors import ConfigError
from nvrx_eks.facts.job_kinds import CUSTOM_KINDS
from nvrx_eks.jobs.crds import crd_files
from nvrx_eks.jobs.validate.crd import YamlLoader, load_crd_schemas, validate_custom_resource
from nvrx_eks.jobs.validate.findings import Expectations, Finding, ValidationReport
from nvrx_eks.jobs.validate.kubernetes import validate_kubernetes_layer
from nvrx_eks.jobs.validate.rules import ProjectRules

__all__ = ["Expectations", "Finding", "ValidationReport", "load_documents", "validate_documents"]


def validate_documents(documents: list[dict], expected: Expectations) -> ValidationReport:
    """Every layer over the documents (copies: no layer can change what the caller submits)."""
    report = ValidationReport(documents_checked=len(documents))
    documents = [copy.deepcopy(d) for d in documents]
    for index, doc in enumerate(documents):
        if not isinstance(doc, dict) or "kind" not in doc or "apiVersion" not in doc:
            report.findings.append(Finding("kubernetes", f"document {index}", "(document)", "not a Kubernetes object"))
    documents = [d for d in documents if isinstance(d, dict) and "kind" in d and "apiVersion" in d]

    for doc in documents:
        report.findings.extend(validate_kubernetes_layer(doc, expected.kubernetes_version))

    custom = [d for d in documents if (d.get("apiVersion"), d.get("kind")) in CUSTOM_KINDS]
    if custom:
        files = crd_files()
        if files.skipped:
            report.skipped.append(f"{files.skipped}; the Kubernetes and project layers ran")
        else:
            schemas = load_crd_schemas(files.paths)
            for doc in custom:
                report.findings.extend(validate_custom_resource(doc, schemas))

    report.findings.extend(ProjectRules(documents, expected).run())
    return report


#: The most nodes YAML aliases (`*name`) may add to one document. The parser shares an aliased
#: node instead of copying it, so a few lines can stand for billions of nodes that every check
#: would then walk; the written-out nodes are bounded by the input's length. The largest rendered
#: job document has ~600 nodes.
MAX_ALIAS_NODES = 100_000
#: The deepest nesting of mappings and sequences a document may have. The checks walk documents
#: recursively, so deeper ones would end in Python's recursion limit; rendered jobs nest 14 deep
#: and CRDs well under 100.
MAX_NESTING = 200


def load_documents(text: str, source: str) -> list[dict]:
    """The Kubernetes objects of a multi-document YAML text; ConfigError naming `source` if none,
    or if aliases expand a document past MAX_ALIAS_NODES or into itself, or it nests past
    MAX_NESTING."""
    try:
        documents = [d for d in yaml.load_all(text, Loader=YamlLoader) if d is not None]
    except yaml.YAMLError as e:
        raise ConfigError(f"{source} is not valid YAML: {e}") from None
    if not documents:
        raise ConfigError(f"{source} contains no Kubernetes objects")
    for index, document in enumerate(documents):
        written, expanded = node_counts(document, source=f"{source} document {index}")
        if expanded - written > MAX_ALIAS_NODES:
            raise ConfigError(
                f"{source} document {index}: its YAML aliases expand {written:,} written nodes to {expanded:,}, "
                f"more than the {MAX_ALIAS_NODES:,} aliases may add; write the repeated parts out instead of "
                "using anchors and aliases"
            )
    return documents


def node_counts(document: object, *, source: str) -> tuple[int, int]:
    """(nodes written, nodes once every alias is expanded) of a loaded YAML document, in time
    linear in the nodes written: each mapping or sequence is sized once, however often aliases
    repeat it. A mapping counts its keys and values. ConfigError naming `source` for an alias
    inside the node it names (`&a [*a]`), which expands without end, and for nesting deeper than
    MAX_NESTING."""
    if not isinstance(document, dict | list):
        return 1, 1
    expanded_of: dict[int, int] = {}
    open_ids: set[int] = set()  # started and not finished: the path from the document down
    written = 0
    stack: list[dict | list] = [document]
    while stack:
        node = stack[-1]
        if id(node) in expanded_of:
            stack.pop()
            continue
        children = [*node.keys(), *node.values()] if isinstance(node, dict) else node
        containers = [c for c in children if isinstance(c, dict | list)]
        if id(node) not in open_ids:
            open_ids.add(id(node))
            # Every open node is an ancestor of the next one: their count is its depth.
            if len(open_ids) > MAX_NESTING:
                raise ConfigError(
                    f"{source}: nests mappings and sequences more than {MAX_NESTING} deep; no Kubernetes "
                    "object does, check the indentation or brackets"
                )
            for child in containers:
                if id(child) in open_ids:
                    raise ConfigError(
                        f"{source}: a YAML alias refers to a node that contains it, which expands without end; "
                        "remove the alias"
                    )
                stack.append(child)
            continue
        scalars = len(children) - len(containers)
        expanded_of[id(node)] = 1 + scalars + sum(expanded_of[id(c)] for c in containers)
        written += 1 + scalars
        open_ids.discard(id(node))
        stack.pop()
    return written, expanded_of[id(document)]
