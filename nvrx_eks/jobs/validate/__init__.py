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


def load_documents(text: str, source: str) -> list[dict]:
    """The Kubernetes objects of a multi-document YAML text; ConfigError naming `source` if none."""
    try:
        documents = [d for d in yaml.load_all(text, Loader=YamlLoader) if d is not None]
    except yaml.YAMLError as e:
        raise ConfigError(f"{source} is not valid YAML: {e}") from None
    if not documents:
        raise ConfigError(f"{source} contains no Kubernetes objects")
    return documents
