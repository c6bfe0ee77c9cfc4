"""Layer 2: JobSet and PyTorchJob against the upstream CRD schemas pinned in nvrx_eks/jobs/crds.py,
with unknown fields rejected as the API server's strict field validation would and
`x-kubernetes-int-or-string` accepted as integer or string."""

from __future__ import annotations

import functools
from pathlib import Path

import jsonschema
import yaml

from nvrx_eks.jobs.validate.findings import Finding, document_id, schema_error_findings

#: libyaml makes the 0.5-0.9 MB CRD files load ten times faster, where PyYAML was built with it.
YamlLoader: type[yaml.SafeLoader] = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def _structural_to_jsonschema(node):
    """An apiextensions structural schema as JSON Schema, strict like the API server:
    int-or-string is integer|string, nullable adds null, and objects with declared properties
    reject unknown fields (the server prunes them; strict field validation rejects them)."""
    if isinstance(node, list):
        return [_structural_to_jsonschema(n) for n in node]
    if not isinstance(node, dict):
        return node
    out = {k: _structural_to_jsonschema(v) for k, v in node.items() if not k.startswith("x-kubernetes-")}
    if node.get("x-kubernetes-int-or-string"):
        out.pop("type", None)
        out["anyOf"] = [{"type": "integer"}, {"type": "string"}]
    if node.get("nullable") and "type" in out:
        out["type"] = [out["type"], "null"]
    if (
        out.get("type") == "object"
        and "properties" in out
        and "additionalProperties" not in out
        and not node.get("x-kubernetes-preserve-unknown-fields")
    ):
        out["additionalProperties"] = False
    return out


@functools.lru_cache(maxsize=4)
def load_crd_schemas(paths: tuple[Path, ...]) -> dict[tuple[str, str], dict]:
    """(apiVersion, kind) -> JSON Schema, for every CRD version served in the files."""
    schemas = {}
    for path in paths:
        for crd in yaml.load_all(path.read_text(), Loader=YamlLoader):
            if not isinstance(crd, dict) or crd.get("kind") != "CustomResourceDefinition":
                continue
            group, kind = crd["spec"]["group"], crd["spec"]["names"]["kind"]
            for version in crd["spec"]["versions"]:
                schema = version.get("schema", {}).get("openAPIV3Schema")
                if version.get("served") and schema:
                    schemas[(f"{group}/{version['name']}", kind)] = _structural_to_jsonschema(schema)
    return schemas


def validate_custom_resource(doc: dict, schemas: dict[tuple[str, str], dict]) -> list[Finding]:
    doc_id = document_id(doc)
    schema = schemas.get((str(doc.get("apiVersion")), str(doc.get("kind"))))
    if schema is None:
        return [Finding("crd", doc_id, "kind", f"no CRD schema for {doc.get('kind')} {doc.get('apiVersion')}")]
    validator = jsonschema.Draft202012Validator(schema)
    findings = []
    for error in sorted(validator.iter_errors(doc), key=lambda e: list(map(str, e.absolute_path))):
        findings.extend(schema_error_findings(error, (), "crd", doc_id))
    return findings
