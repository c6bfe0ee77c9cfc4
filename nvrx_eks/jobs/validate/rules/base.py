"""What every project rule works on: a lookup that tolerates missing fields, the pod templates
inside a job, and the rule set's finding sink."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from nvrx_eks.jobs.validate.findings import Expectations, Finding, format_path


class _Missing:
    """What `get` returns for a field the document does not have (None is a value YAML can hold)."""

    def __repr__(self) -> str:
        return "<missing>"


MISSING = _Missing()


def get(node, path: Sequence):
    """The value at `path` (keys and list indexes), or MISSING wherever the document stops short."""
    for part in path:
        if isinstance(part, int):
            if not isinstance(node, list) or part >= len(node):
                return MISSING
        elif not isinstance(node, dict) or part not in node:
            return MISSING
        node = node[part]
    return node


def node_replicated_jobs(job: dict) -> list[tuple[int, dict]]:
    """(index, replicated job) of a JobSet's replicated jobs that run on the GPU nodes: all but
    the job's coordinator (nvrx_eks.facts.job_names), which has rules of its own."""
    from nvrx_eks.facts.job_names import COORDINATOR_REPLICATED_JOB

    rjs = get(job, ["spec", "replicatedJobs"])
    return [
        (i, rj)
        for i, rj in enumerate(rjs if isinstance(rjs, list) else [])
        if not (isinstance(rj, dict) and rj.get("name") == COORDINATOR_REPLICATED_JOB)
    ]


@dataclass
class PodSite:
    """One pod template inside the job, with where it lives and what the job says about it."""

    path: list  # path of the PodTemplateSpec (has .metadata and .spec)
    pod: dict
    container_index: int | None
    container: dict | None
    role: str  # "worker" / "Master" / "Worker"


class RuleBase:
    """The documents under check, what they must match, and the findings so far."""

    def __init__(self, documents: list[dict], expected: Expectations):
        self.documents = documents
        self.expected = expected
        self.findings: list[Finding] = []
        self.doc_id = ""

    def error(self, path: Sequence, message: str) -> None:
        self.findings.append(Finding("project", self.doc_id, format_path(path), message))

    def warning(self, path: Sequence, message: str) -> None:
        self.findings.append(Finding("project", self.doc_id, format_path(path), message, "warning"))


def pod_specs(node, path: list | None = None):
    """(path, PodSpec) for every pod spec anywhere in a document: a Pod's spec, the templates
    of Jobs, JobSets, PyTorchJobs, Deployments, and anything else that nests one."""
    path = path or []
    if isinstance(node, dict):
        if isinstance(node.get("containers"), list):
            yield path, node
            return
        for key, value in node.items():
            yield from pod_specs(value, path + [key])
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from pod_specs(value, path + [i])
