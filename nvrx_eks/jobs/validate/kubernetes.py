"""Layer 1: core kinds, and the Job / pod templates lifted out of custom resources, against the
Kubernetes OpenAPI schemas that `kubernetes-validate` ships, in strict mode (unknown fields are
errors), for the cluster's Kubernetes version."""

from __future__ import annotations

import functools
import re
from collections.abc import Sequence

import jsonschema
import kubernetes_validate.utils as kv
from referencing import Registry, Resource

from nvrx_eks.facts.errors import ConfigError
from nvrx_eks.facts.job_kinds import CUSTOM_KINDS, JOBSET, PYTORCHJOB
from nvrx_eks.jobs.validate.findings import Finding, document_id, format_path, schema_error_findings


@functools.lru_cache(maxsize=8)
def _core_registry(schema_version: str) -> tuple[str, Registry]:
    schema_dir = f"v{schema_version}-local-strict"
    definitions = kv.schema_contents(f"kubernetes-json-schema/{schema_dir}/_definitions.json", schema_version)
    return schema_dir, Resource.from_contents(definitions) @ Registry()


def _schema_version(kubernetes_version: str) -> str:
    """kubernetes-validate's newest schema set not newer than the cluster (as its validate() picks)."""
    wanted = tuple(int(x) for x in kv.major_minor(kubernetes_version.lstrip("v")).split("."))
    candidates = [v for v in kv.all_versions() if tuple(int(x) for x in v.split(".")[:2]) <= wanted]
    if not candidates:
        raise ConfigError(f"kubernetes-validate has no schemas for Kubernetes {kubernetes_version}")
    return candidates[-1]


@functools.lru_cache(maxsize=64)
def _core_validator(kind: str, api_version: str, kubernetes_version: str) -> jsonschema.Validator | None:
    version = _schema_version(kubernetes_version)
    schema_dir, registry = _core_registry(version)
    group_version = re.sub(r"^([^./]*)(?:\.[^/]*)?/", r"\1-", api_version)
    try:
        schema = kv.schema_contents(f"kubernetes-json-schema/{schema_dir}/{kind.lower()}-{group_version}.json", version)
    except FileNotFoundError:
        return None
    registry = Resource.from_contents(schema) @ registry
    return jsonschema.Draft202012Validator(schema, registry=registry)


def validate_core(
    doc: dict, kubernetes_version: str, *, prefix: Sequence = (), doc_id: str | None = None
) -> list[Finding]:
    doc_id = doc_id or document_id(doc)
    validator = _core_validator(str(doc.get("kind")), str(doc.get("apiVersion")), kubernetes_version)
    if validator is None:
        return [
            Finding(
                "kubernetes",
                doc_id,
                format_path(list(prefix) + ["kind"]),
                f"no Kubernetes {kubernetes_version} schema for kind {doc.get('kind')!r} in {doc.get('apiVersion')!r}",
            )
        ]
    findings = []
    for error in sorted(validator.iter_errors(doc), key=lambda e: list(map(str, e.absolute_path))):
        findings.extend(schema_error_findings(error, prefix, "kubernetes", doc_id))
    return findings


def lifted_templates(doc: dict) -> list[tuple[dict, list]]:
    """(core object, path prefix) for each Job / pod template inside a custom resource, so the
    core schemas can check them; the prefix maps paths back into the custom resource."""
    spec = doc.get("spec")
    spec = spec if isinstance(spec, dict) else {}
    meta = doc.get("metadata")
    name = meta.get("name", "x") if isinstance(meta, dict) else "x"
    lifted: list[tuple[dict, list]] = []
    if doc.get("kind") == JOBSET.kind:
        for i, rj in enumerate(spec.get("replicatedJobs") or []):
            template = rj.get("template") if isinstance(rj, dict) else None
            if not isinstance(template, dict):
                continue
            job = {
                "apiVersion": "batch/v1",
                "kind": "Job",
                "metadata": {**(template.get("metadata") or {}), "name": f"{name}-{rj.get('name', i)}"},
                "spec": template.get("spec"),
            }
            lifted.append((job, ["spec", "replicatedJobs", i, "template"]))
    elif doc.get("kind") == PYTORCHJOB.kind:
        for rtype, rs in (spec.get("pytorchReplicaSpecs") or {}).items():
            if not isinstance(rs, dict) or not isinstance(rs.get("template"), dict):
                continue
            pod_template = {
                "apiVersion": "v1",
                "kind": "PodTemplate",
                "metadata": {"name": f"{name}-{str(rtype).lower()}"},
                "template": rs["template"],
            }
            lifted.append((pod_template, ["spec", "pytorchReplicaSpecs", rtype]))
    return lifted


def validate_kubernetes_layer(doc: dict, kubernetes_version: str) -> list[Finding]:
    doc_id = document_id(doc)
    if (doc.get("apiVersion"), doc.get("kind")) not in CUSTOM_KINDS:
        return validate_core(doc, kubernetes_version)
    findings = []
    for lifted, prefix in lifted_templates(doc):
        findings.extend(validate_core(lifted, kubernetes_version, prefix=prefix, doc_id=doc_id))
    return findings
