"""What validation reports: findings that name the offending field by path, the deployment the
manifests must match, and the report of one validation."""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import jsonschema

from nvrx_eks.facts.errors import ConfigError


@dataclass(frozen=True)
class Expectations:
    """What the manifests must match: the deployment they are for."""

    kubernetes_version: str
    namespace: str
    pvc_name: str
    instance_type: str
    #: Manifests about to be submitted to a live cluster: the offline placeholder image is an error.
    live: bool = False


@dataclass(frozen=True)
class Finding:
    layer: str  # "kubernetes", "crd" or "project"
    document: str  # "JobSet/train"
    path: str
    message: str
    severity: str = "error"

    def __str__(self) -> str:
        return f"[{self.layer}] {self.document}: {self.path}: {self.message}"


@dataclass
class ValidationReport:
    findings: list[Finding] = field(default_factory=list)
    #: Layers that did not run, with the reason (the CRD folder missing).
    skipped: list[str] = field(default_factory=list)
    documents_checked: int = 0

    @property
    def errors(self) -> list[Finding]:
        return [f for f in self.findings if f.severity == "error"]

    @property
    def warnings(self) -> list[Finding]:
        return [f for f in self.findings if f.severity == "warning"]

    @property
    def ok(self) -> bool:
        return not self.errors

    def raise_for_errors(self, what: str) -> None:
        if self.errors:
            lines = "\n".join(f"  {f}" for f in self.errors)
            raise ConfigError(f"{what} failed validation ({len(self.errors)} error(s)):\n{lines}")


# ----- paths --------------------------------------------------------------------------------

_PLAIN_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_-]*$")


def format_path(parts: Iterable[str | int]) -> str:
    """`spec.containers[0].resources.limits["vpc.amazonaws.com/efa"]`."""
    out = ""
    for part in parts:
        if isinstance(part, int):
            out += f"[{part}]"
        elif _PLAIN_KEY.match(part):
            out += f".{part}" if out else part
        else:
            out += f'["{part}"]'
    return out or "(document)"


def document_id(doc: dict) -> str:
    meta = doc.get("metadata")
    meta = meta if isinstance(meta, dict) else {}
    return f"{doc.get('kind', '?')}/{meta.get('name', '?')}"


def schema_error_findings(error: jsonschema.ValidationError, prefix: Sequence, layer: str, doc_id: str):
    """One finding per offending field: for unknown and missing properties the path names the
    field itself, not its parent object."""
    base = list(prefix) + list(error.absolute_path)
    instance, schema = error.instance, error.schema
    if error.validator == "additionalProperties" and isinstance(instance, dict):
        allowed = set(schema.get("properties", {}))
        patterns = [re.compile(p) for p in schema.get("patternProperties", {})]
        extras = [k for k in instance if k not in allowed and not any(p.search(k) for p in patterns)]
        for key in extras or [None]:
            path = base + [key] if key is not None else base
            yield Finding(layer, doc_id, format_path(path), "unknown field; remove it or check its spelling")
        return
    if error.validator == "required" and isinstance(instance, dict):
        for key in [k for k in error.validator_value if k not in instance] or [None]:
            path = base + [key] if key is not None else base
            yield Finding(layer, doc_id, format_path(path), "required field is missing")
        return
    message = error.message
    if error.validator in ("oneOf", "anyOf") and error.context:
        message = jsonschema.exceptions.best_match(error.context).message
    yield Finding(layer, doc_id, format_path(base), message)
