"""Offline validation of rendered manifests, in three layers, every finding naming the path of
the offending field (`spec.replicatedJobs[0].template.spec.template.spec.containers[0].image`).

1. kubernetes: core kinds, and the Job / pod templates lifted out of custom resources, against
   the Kubernetes OpenAPI schemas that `kubernetes-validate` ships, in strict mode (unknown
   fields are errors), for the cluster's Kubernetes version.
2. crd: JobSet and PyTorchJob against the upstream CRD schemas pinned in nvrx_eks/jobs/crds.py (fetched
   once into a user cache, or read from NVRX_EKS_CRD_DIR; unknown fields rejected as the API
   server's strict field validation would; `x-kubernetes-int-or-string` accepted as integer or
   string). Without the files (offline on first use) this layer is skipped with a message and
   the others still run.
3. project: what makes the job correct for this deployment: world size = nodes x processes,
   GPU/EFA requests = the instance facts, one rendezvous host (pod 0's DNS name), the exit-93
   rule, timeouts consistent with the trainer config, image set, PVC = the stack's claim,
   /dev/shm, IPC_LOCK, GPU node selection, a deadline that frees the nodes, a NetworkPolicy
   admitting only the job's own pods, and pod security: no pod template anywhere in the
   documents may be privileged, share a host namespace, mount a hostPath outside the reviewed
   allow-list, bind a host port or add a capability beyond what infra/pod_security.py allows;
   the job's own pods must also be as restricted as rendered (all else dropped, no privilege
   escalation, seccomp RuntimeDefault, no service-account token).
"""

from __future__ import annotations

import copy
import functools
import re
import shlex
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import jsonschema
import kubernetes_validate.utils as kv
import yaml
from referencing import Registry, Resource

from infra import pod_security
from nvrx_eks.facts import names as conventions
from nvrx_eks.facts.errors import ConfigError
from nvrx_eks.facts.exit_codes import EXIT_DO_NOT_REQUEUE
from nvrx_eks.facts.instances import INSTANCE_FACTS, InstanceFacts
from nvrx_eks.jobs.backstop import minimum_deadline_s
from nvrx_eks.jobs.crds import crd_files
from nvrx_eks.jobs.render import JOB_POD_SELECTOR_KEYS, WORLD_SIZE_ANNOTATION
from nvrx_eks.jobs.spec import (
    FSX_MOUNT_PATH,
    JOBSET_REPLICATED_JOB,
    OFFLINE_PLACEHOLDER_IMAGE,
    PYTORCHJOB_CONTAINER,
    RENDEZVOUS_PORT,
    TRAIN_CONFIG_DIR,
    TRAIN_CONFIG_KEY,
    TRAIN_CONFIG_PATH,
)
from workloads.config import TrainConfig
from workloads.launch import build_ft_launcher_argv, build_preflight_argv

CUSTOM_KINDS = {("jobset.x-k8s.io/v1alpha2", "JobSet"), ("kubeflow.org/v1", "PyTorchJob")}

try:  # libyaml makes the 0.5-0.9 MB CRD files load ten times faster
    _YamlLoader = yaml.CSafeLoader
except AttributeError:  # pragma: no cover - depends on how PyYAML was built
    _YamlLoader = yaml.SafeLoader


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


def _document_id(doc: dict) -> str:
    meta = doc.get("metadata") if isinstance(doc.get("metadata"), dict) else {}
    return f"{doc.get('kind', '?')}/{meta.get('name', '?')}"


def _schema_error_findings(error: jsonschema.ValidationError, prefix: Sequence, layer: str, doc_id: str):
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


# ----- layer 1: Kubernetes core schemas (kubernetes-validate) -------------------------------


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
    doc_id = doc_id or _document_id(doc)
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
        findings.extend(_schema_error_findings(error, prefix, "kubernetes", doc_id))
    return findings


def lifted_templates(doc: dict) -> list[tuple[dict, list]]:
    """(core object, path prefix) for each Job / pod template inside a custom resource, so the
    core schemas can check them; the prefix maps paths back into the custom resource."""
    spec = doc.get("spec") if isinstance(doc.get("spec"), dict) else {}
    name = (doc.get("metadata") or {}).get("name", "x") if isinstance(doc.get("metadata"), dict) else "x"
    lifted = []
    if doc.get("kind") == "JobSet":
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
    elif doc.get("kind") == "PyTorchJob":
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


def _validate_kubernetes_layer(doc: dict, kubernetes_version: str) -> list[Finding]:
    doc_id = _document_id(doc)
    if (doc.get("apiVersion"), doc.get("kind")) not in CUSTOM_KINDS:
        return validate_core(doc, kubernetes_version)
    findings = []
    for lifted, prefix in lifted_templates(doc):
        findings.extend(validate_core(lifted, kubernetes_version, prefix=prefix, doc_id=doc_id))
    return findings


# ----- layer 2: CRD schemas (jsonschema) ----------------------------------------------------


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
        for crd in yaml.load_all(path.read_text(), Loader=_YamlLoader):
            if not isinstance(crd, dict) or crd.get("kind") != "CustomResourceDefinition":
                continue
            group, kind = crd["spec"]["group"], crd["spec"]["names"]["kind"]
            for version in crd["spec"]["versions"]:
                schema = version.get("schema", {}).get("openAPIV3Schema")
                if version.get("served") and schema:
                    schemas[(f"{group}/{version['name']}", kind)] = _structural_to_jsonschema(schema)
    return schemas


def validate_custom_resource(doc: dict, schemas: dict[tuple[str, str], dict]) -> list[Finding]:
    doc_id = _document_id(doc)
    schema = schemas.get((doc.get("apiVersion"), doc.get("kind")))
    if schema is None:
        return [Finding("crd", doc_id, "kind", f"no CRD schema for {doc.get('kind')} {doc.get('apiVersion')}")]
    validator = jsonschema.Draft202012Validator(schema)
    findings = []
    for error in sorted(validator.iter_errors(doc), key=lambda e: list(map(str, e.absolute_path))):
        findings.extend(_schema_error_findings(error, (), "crd", doc_id))
    return findings


# ----- layer 3: project rules ---------------------------------------------------------------


class _Missing:
    def __repr__(self) -> str:
        return "<missing>"


MISSING = _Missing()


def _get(node, path: Sequence):
    for part in path:
        if isinstance(part, int):
            if not isinstance(node, list) or part >= len(node):
                return MISSING
        elif not isinstance(node, dict) or part not in node:
            return MISSING
        node = node[part]
    return node


@dataclass
class _PodSite:
    """One pod template inside the job, with where it lives and what the job says about it."""

    path: list  # path of the PodTemplateSpec (has .metadata and .spec)
    pod: dict
    container_index: int | None
    container: dict | None
    role: str  # "worker" / "Master" / "Worker"


class _Rules:
    def __init__(self, documents: list[dict], expected: Expectations):
        self.documents = documents
        self.expected = expected
        self.findings: list[Finding] = []
        self.doc_id = ""

    def error(self, path: Sequence, message: str) -> None:
        self.findings.append(Finding("project", self.doc_id, format_path(path), message))

    def warning(self, path: Sequence, message: str) -> None:
        self.findings.append(Finding("project", self.doc_id, format_path(path), message, "warning"))

    # -- entry --

    def run(self) -> list[Finding]:
        jobs = [d for d in self.documents if (d.get("apiVersion"), d.get("kind")) in CUSTOM_KINDS]
        for doc in self.documents:
            self.doc_id = _document_id(doc)
            namespace = _get(doc, ["metadata", "namespace"])
            if namespace != self.expected.namespace:
                self.error(
                    ["metadata", "namespace"],
                    f"is {namespace!r}; the training namespace of this deployment is {self.expected.namespace!r}",
                )
        if not jobs:
            self.doc_id = "(manifests)"
            self.error([], "no JobSet or PyTorchJob among the documents")
        for doc in self.documents:
            self.doc_id = _document_id(doc)
            allowed = pod_security.TRAINER_CAPABILITIES
            if _get(doc, ["metadata", "labels", "app.kubernetes.io/name"]) == "nvrx-eks-nccl-test":
                allowed = pod_security.FABRIC_TEST_CAPABILITIES
            for path, pod_spec in _pod_specs(doc):
                self._check_node_access(path, pod_spec, frozenset(allowed))
        for job in jobs:
            self.doc_id = _document_id(job)
            if _get(job, ["metadata", "labels", "app.kubernetes.io/name"]) == "nvrx-eks-nccl-test":
                self._check_fabric_test(job)
            else:
                self._check_training_job(job)
            self._check_network_policy(job)
        return self.findings

    # -- pod security --

    def _check_node_access(self, path: list, spec: dict, allowed_capabilities: frozenset[str]) -> None:
        """What no pod of this project may do to its node, whatever document it comes in."""
        for flag in ("hostNetwork", "hostPID", "hostIPC"):
            if spec.get(flag):
                self.error(path + [flag], "must not be set: the pod would share the node's namespace")
        for i, volume in enumerate(spec.get("volumes") or []):
            host_path = _get(volume, ["hostPath", "path"])
            if host_path is not MISSING and host_path not in pod_security.HOST_PATH_ALLOW_LIST:
                allowed = ", ".join(pod_security.HOST_PATH_ALLOW_LIST) or "none today"
                self.error(
                    path + ["volumes", i, "hostPath"],
                    f"{host_path!r} is not on the reviewed hostPath allow-list ({allowed}); "
                    "use the FSx claim or an emptyDir",
                )
        for section in ("initContainers", "containers", "ephemeralContainers"):
            containers = spec.get(section)
            for j, container in enumerate(containers if isinstance(containers, list) else []):
                if not isinstance(container, dict):
                    continue
                cpath = path + [section, j]
                if _get(container, ["securityContext", "privileged"]) is True:
                    self.error(
                        cpath + ["securityContext", "privileged"],
                        "must not be true: a privileged container owns the node",
                    )
                added = _get(container, ["securityContext", "capabilities", "add"])
                for cap in added if isinstance(added, list) else []:
                    if str(cap).upper().removeprefix("CAP_") not in allowed_capabilities:
                        self.error(
                            cpath + ["securityContext", "capabilities", "add"],
                            f"adds {cap}; only {', '.join(sorted(allowed_capabilities))} may be added "
                            "(infra/pod_security.py says why)",
                        )
                ports = container.get("ports")
                for k, port in enumerate(ports if isinstance(ports, list) else []):
                    if isinstance(port, dict) and port.get("hostPort"):
                        self.error(cpath + ["ports", k, "hostPort"], "must not be set: it binds a port on the node")

    def _check_restricted(self, site: _PodSite) -> None:
        """The job's pods are as restricted as EFA allows (everything of Pod Security
        "restricted" but running as root)."""
        spec_path = site.path + ["spec"]
        if _get(site.pod, ["spec", "automountServiceAccountToken"]) is not False:
            self.error(
                spec_path + ["automountServiceAccountToken"],
                "must be false: the trainer never calls the Kubernetes API, so the pod needs no token",
            )
        pod_seccomp = _get(site.pod, ["spec", "securityContext", "seccompProfile", "type"])
        if site.container is None:
            return
        cpath = spec_path + ["containers", site.container_index]
        container_seccomp = _get(site.container, ["securityContext", "seccompProfile", "type"])
        if pod_security.SECCOMP_PROFILE not in (pod_seccomp, container_seccomp):
            self.error(
                spec_path + ["securityContext", "seccompProfile", "type"],
                f"must be {pod_security.SECCOMP_PROFILE}: without it the container runs unconfined",
            )
        if _get(site.container, ["securityContext", "allowPrivilegeEscalation"]) is not False:
            self.error(
                cpath + ["securityContext", "allowPrivilegeEscalation"],
                "must be false: no process in the container needs to gain privileges",
            )
        dropped = _get(site.container, ["securityContext", "capabilities", "drop"])
        if not isinstance(dropped, list) or "ALL" not in dropped:
            self.error(
                cpath + ["securityContext", "capabilities", "drop"],
                "must include ALL: the container keeps only the capabilities it adds",
            )

    def _check_network_policy(self, job: dict) -> None:
        """A NetworkPolicy selects the job's pods and admits only pods of the same job."""
        labels = _get(job, ["metadata", "labels"])
        labels = labels if isinstance(labels, dict) else {}
        job_selector = {k: labels.get(k) for k in JOB_POD_SELECTOR_KEYS}

        def selects_job(selector) -> bool:
            match = _get(selector, ["matchLabels"])
            return (
                isinstance(match, dict)
                and all(match.get(k) == v for k, v in job_selector.items())
                and _get(selector, ["matchExpressions"]) in (MISSING, None, [])
            )

        policies = [
            d
            for d in self.documents
            if d.get("kind") == "NetworkPolicy"
            and _get(d, ["metadata", "namespace"]) == _get(job, ["metadata", "namespace"])
            and selects_job(_get(d, ["spec", "podSelector"]))
        ]
        if not policies:
            self.error(
                ["metadata", "labels"],
                "no NetworkPolicy selects this job's pods: any pod in the cluster could reach their "
                "unauthenticated rendezvous and restart stores; render the NetworkPolicy with the job",
            )
            return
        for policy in policies:
            doc_id, self.doc_id = self.doc_id, _document_id(policy)
            if "Ingress" not in (_get(policy, ["spec", "policyTypes"]) or []):
                self.error(["spec", "policyTypes"], "must include Ingress, or the policy restricts nothing")
            for i, rule in enumerate(_get(policy, ["spec", "ingress"]) or []):
                peers = _get(rule, ["from"])
                if not isinstance(peers, list) or not peers:
                    self.error(["spec", "ingress", i, "from"], "missing: the rule would admit every source")
                    continue
                for j, peer in enumerate(peers):
                    if set(peer) != {"podSelector"} or not selects_job(peer["podSelector"]):
                        self.error(
                            ["spec", "ingress", i, "from", j],
                            "admits more than this job's pods; select them by "
                            + ", ".join(f"{k}={v}" for k, v in job_selector.items()),
                        )
            self.doc_id = doc_id

    # -- shared pod checks --

    def _pod_sites(self, job: dict, container_name: str | None) -> list[_PodSite]:
        sites = []
        if job["kind"] == "JobSet":
            rjs = _get(job, ["spec", "replicatedJobs"])
            for i, rj in enumerate(rjs if isinstance(rjs, list) else []):
                path = ["spec", "replicatedJobs", i, "template", "spec", "template"]
                sites.append(self._site(job, path, container_name, str(_get(rj, ["name"]))))
        else:
            specs = _get(job, ["spec", "pytorchReplicaSpecs"])
            for rtype in specs if isinstance(specs, dict) else {}:
                path = ["spec", "pytorchReplicaSpecs", rtype, "template"]
                sites.append(self._site(job, path, container_name, rtype))
        return sites

    def _site(self, job: dict, path: list, container_name: str | None, role: str) -> _PodSite:
        pod = _get(job, path)
        pod = pod if isinstance(pod, dict) else {}
        containers = _get(pod, ["spec", "containers"])
        index, container = None, None
        if isinstance(containers, list):
            for i, c in enumerate(containers):
                if isinstance(c, dict) and (container_name is None or c.get("name") == container_name):
                    index, container = i, c
                    break
        if container is None:
            self.error(
                path + ["spec", "containers"],
                f"no container named {container_name!r}" if container_name else "no containers",
            )
        return _PodSite(path, pod, index, container, role)

    def _instance_facts(self, site: _PodSite) -> InstanceFacts | None:
        selector_path = site.path + ["spec", "nodeSelector", conventions.INSTANCE_TYPE_LABEL_KEY]
        instance_type = _get(site.pod, ["spec", "nodeSelector", conventions.INSTANCE_TYPE_LABEL_KEY])
        if instance_type is MISSING:
            self.error(selector_path, f"missing: pods must select the GPU instance type {self.expected.instance_type}")
            return INSTANCE_FACTS.get(self.expected.instance_type)
        if instance_type != self.expected.instance_type:
            self.error(
                selector_path,
                f"is {instance_type!r}, but this deployment's GPU nodes are {self.expected.instance_type}; "
                "no node would match",
            )
        return INSTANCE_FACTS.get(self.expected.instance_type)

    def _check_scheduling(self, site: _PodSite) -> None:
        spec_path = site.path + ["spec"]
        label = _get(site.pod, ["spec", "nodeSelector", conventions.GPU_NODE_LABEL_KEY])
        if label != conventions.GPU_NODE_LABEL_VALUE:
            self.error(
                spec_path + ["nodeSelector", conventions.GPU_NODE_LABEL_KEY],
                f"must be {conventions.GPU_NODE_LABEL_VALUE!r} to land on the GPU node group (got {label})",
            )
        tolerations = _get(site.pod, ["spec", "tolerations"])
        tolerated = isinstance(tolerations, list) and any(
            isinstance(t, dict)
            and t.get("key") == conventions.GPU_TAINT_KEY
            and t.get("effect") in (conventions.GPU_TAINT_EFFECT, None)
            and (t.get("operator") == "Exists" or t.get("value") == conventions.GPU_TAINT_VALUE)
            for t in tolerations
        )
        if not tolerated:
            self.error(
                spec_path + ["tolerations"],
                f"no toleration for the GPU taint {conventions.GPU_TAINT_KEY}={conventions.GPU_TAINT_VALUE}:"
                f"{conventions.GPU_TAINT_EFFECT}; the pods would never schedule on GPU nodes",
            )

    def _check_resources(self, site: _PodSite, facts: InstanceFacts) -> None:
        if site.container is None:
            return
        cpath = site.path + ["spec", "containers", site.container_index]
        for section in ("requests", "limits"):
            for resource, expected, what in (
                (conventions.GPU_RESOURCE, facts.gpus, "GPUs"),
                (conventions.EFA_RESOURCE, facts.efa_interfaces, "EFA interfaces"),
            ):
                value = _get(site.container, ["resources", section, resource])
                path = cpath + ["resources", section, resource]
                if value is MISSING:
                    self.error(path, f"missing; a {facts.instance_type} pod takes all {expected} of its {resource}")
                elif str(value) != str(expected):
                    self.error(
                        path,
                        f"is {value}, but {facts.instance_type} has {expected} {what}; "
                        "one pod per node must take all of them",
                    )
        cpu = _get(site.container, ["resources", "requests", "cpu"])
        if cpu is MISSING:
            self.error(cpath + ["resources", "requests", "cpu"], "missing; request the node's allocatable vCPUs")
        elif _cpu_cores(cpu) is None or _cpu_cores(cpu) > facts.allocatable_vcpus:
            self.error(
                cpath + ["resources", "requests", "cpu"],
                f"{cpu} exceeds the {facts.allocatable_vcpus} vCPUs allocatable on {facts.instance_type}",
            )
        memory = _get(site.container, ["resources", "requests", "memory"])
        if memory is MISSING:
            self.error(cpath + ["resources", "requests", "memory"], "missing; request the node's allocatable memory")
        elif _memory_gib(memory) is None or _memory_gib(memory) > facts.allocatable_memory_gib:
            self.error(
                cpath + ["resources", "requests", "memory"],
                f"{memory} exceeds the {facts.allocatable_memory_gib}Gi allocatable on {facts.instance_type}",
            )

    def _check_volumes(self, site: _PodSite, *, needs_config: bool) -> None:
        spec_path = site.path + ["spec"]
        volumes = _get(site.pod, ["spec", "volumes"])
        volumes = volumes if isinstance(volumes, list) else []
        by_name = {v.get("name"): (i, v) for i, v in enumerate(volumes) if isinstance(v, dict)}
        if site.container is not None:
            cpath = spec_path + ["containers", site.container_index]
            mounts = site.container.get("volumeMounts") or []
            mount_by_path = {}
            for j, m in enumerate(mounts if isinstance(mounts, list) else []):
                if not isinstance(m, dict):
                    continue
                mount_by_path[m.get("mountPath")] = (j, m)
                if m.get("name") not in by_name:
                    self.error(
                        cpath + ["volumeMounts", j, "name"],
                        f"mounts volume {m.get('name')!r}, which the pod does not define",
                    )
        else:
            cpath, mount_by_path = spec_path, {}

        # FSx claim at /fsx: checkpoints and data must outlive pods.
        fsx = next(((i, v) for i, v in by_name.values() if "persistentVolumeClaim" in v), None)
        if fsx is None:
            self.error(spec_path + ["volumes"], f"no volume for the FSx claim {self.expected.pvc_name!r}")
        else:
            i, volume = fsx
            claim = _get(volume, ["persistentVolumeClaim", "claimName"])
            if claim != self.expected.pvc_name:
                self.error(
                    spec_path + ["volumes", i, "persistentVolumeClaim", "claimName"],
                    f"is {claim!r}, but the deployment's FSx claim is {self.expected.pvc_name!r}",
                )
            mount = mount_by_path.get(FSX_MOUNT_PATH)
            if site.container is not None and (mount is None or mount[1].get("name") != volume.get("name")):
                self.error(cpath + ["volumeMounts"], f"the FSx claim must be mounted at {FSX_MOUNT_PATH}")

        # /dev/shm: memory-backed and bounded.
        shm_mount = mount_by_path.get("/dev/shm")
        if shm_mount is None:
            self.error(
                cpath + ["volumeMounts"], "nothing mounted at /dev/shm; NCCL and DataLoader workers need a large one"
            )
        else:
            entry = by_name.get(shm_mount[1].get("name"))
            if entry is not None:
                i, volume = entry
                if _get(volume, ["emptyDir", "medium"]) != "Memory":
                    self.error(
                        spec_path + ["volumes", i, "emptyDir", "medium"],
                        "/dev/shm must be an emptyDir with medium Memory",
                    )
                if _get(volume, ["emptyDir", "sizeLimit"]) is MISSING:
                    self.error(
                        spec_path + ["volumes", i, "emptyDir", "sizeLimit"],
                        "missing; an unbounded memory volume lets one writer exhaust the pod's memory",
                    )

        if needs_config:
            config = next(((i, v) for i, v in by_name.values() if "configMap" in v), None)
            if config is None:
                self.error(spec_path + ["volumes"], "no ConfigMap volume with the trainer config")
            else:
                i, volume = config
                name = _get(volume, ["configMap", "name"])
                if not any(
                    d.get("kind") == "ConfigMap" and _get(d, ["metadata", "name"]) == name for d in self.documents
                ):
                    self.error(
                        spec_path + ["volumes", i, "configMap", "name"],
                        f"ConfigMap {name!r} is not among the documents; render it with the job",
                    )
                mount = mount_by_path.get(TRAIN_CONFIG_DIR)
                if site.container is not None and (mount is None or mount[1].get("name") != volume.get("name")):
                    self.error(cpath + ["volumeMounts"], f"the trainer config must be mounted at {TRAIN_CONFIG_DIR}")

    def _check_security(self, site: _PodSite) -> None:
        if site.container is None:
            return
        cpath = site.path + ["spec", "containers", site.container_index]
        added = _get(site.container, ["securityContext", "capabilities", "add"])
        if not isinstance(added, list) or "IPC_LOCK" not in added:
            self.error(
                cpath + ["securityContext", "capabilities", "add"],
                "must include IPC_LOCK: EFA pins GPU and host memory for RDMA",
            )

    def _check_image(self, site: _PodSite, *, restarted: bool = True) -> None:
        """`restarted`: pods of this job are recreated later (training), so a moving tag could
        mix code versions within one run; a one-shot test only gets a warning."""
        if site.container is None:
            return
        path = site.path + ["spec", "containers", site.container_index, "image"]
        image = site.container.get("image")
        if not isinstance(image, str) or not image.strip():
            self.error(path, "no image; give --image or deploy (the stack exports TrainerImageUri)")
        elif image == OFFLINE_PLACEHOLDER_IMAGE:
            message = "is the offline placeholder; a cluster cannot pull it (submit uses the deployed image)"
            (self.error if self.expected.live else self.warning)(path, message)
        elif "@sha256:" not in image and (":" not in image.rsplit("/", 1)[-1] or image.endswith(":latest")):
            if restarted:
                self.error(path, f"{image!r} has no fixed tag; pods restarted later could run different code")
            else:
                self.warning(path, f"{image!r} has no fixed tag; pin a digest to compare fabric results over time")

    # -- training job --

    def _check_training_job(self, job: dict) -> None:
        name = _get(job, ["metadata", "name"])
        is_jobset = job["kind"] == "JobSet"
        container_name = None if is_jobset else PYTORCHJOB_CONTAINER
        sites = self._pod_sites(job, container_name)
        if not sites:
            self.error(["spec"], "no pod templates")
            return
        train, train_path = self._train_config(sites)
        facts = None
        for site in sites:
            facts = self._instance_facts(site) or facts
            self._check_scheduling(site)
            self._check_image(site)
            self._check_security(site)
            self._check_restricted(site)
            self._check_volumes(site, needs_config=True)
            if facts is not None:
                self._check_resources(site, facts)
        if facts is None:
            return

        nodes = self._node_count(job, sites)
        # Hot spare nodes are launched but outside the active world (workloads/spares.py).
        spares = train.distributed.spare_nodes if train is not None else 0
        world_size = (nodes - spares) * facts.gpus if nodes is not None else None
        if world_size is not None:
            annotation = _get(job, ["metadata", "annotations", WORLD_SIZE_ANNOTATION])
            if annotation is not MISSING and str(annotation) != str(world_size):
                self.error(
                    ["metadata", "annotations", WORLD_SIZE_ANNOTATION],
                    f"says {annotation}, but {nodes} nodes"
                    + (f" less {spares} spare(s)" if spares else "")
                    + f" x {facts.gpus} GPUs = {world_size}",
                )
        expected_host = f"{name}-{JOBSET_REPLICATED_JOB}-0-0.{name}" if is_jobset else f"{name}-master-0"
        self._check_failure_policy(job, sites, spares)
        self._check_deadline(job, train)
        if not is_jobset:
            self._check_pytorchjob_ports(sites)
        for site in sites:
            self._check_entrypoint(site, train, train_path, nodes, facts, world_size, expected_host, str(name))
            if train is not None and train.checkpoint.local.enabled:
                self._check_local_tier_mount(site, train, train_path)
        if train is not None and world_size is not None:
            from workloads.faults import parse_fault_spec

            for fault in parse_fault_spec(train.faults):
                if fault.rank >= world_size:
                    self.findings.append(
                        Finding(
                            "project",
                            train_path[0],
                            format_path(train_path[1] + ["faults"]),
                            f"{fault.label} targets rank {fault.rank}, but the job has {world_size} ranks",
                        )
                    )
            for label, value in (("run_dir", train.run_dir), ("checkpoint.dir", train.checkpoint_dir)):
                if not str(value).startswith(FSX_MOUNT_PATH + "/"):
                    self.findings.append(
                        Finding(
                            "project",
                            train_path[0],
                            format_path(train_path[1] + label.split(".")),
                            f"{value!r} is not on the FSx volume ({FSX_MOUNT_PATH}); it would vanish with the pod",
                        )
                    )

    def _check_local_tier_mount(self, site: _PodSite, train: TrainConfig, train_path: tuple[str, list]) -> None:
        """Tier on -> checkpoint.local.dir is a mount of the reviewed node-local root. Anything
        else puts the "node-local" copies in the container's writable layer (gone with the pod,
        on the root volume) or on FSx (no faster than the tier it should spare)."""
        local_dir = train.local_checkpoint_dir
        if local_dir == FSX_MOUNT_PATH or local_dir.startswith(FSX_MOUNT_PATH + "/"):
            self.findings.append(
                Finding(
                    "project",
                    train_path[0],
                    format_path(train_path[1] + ["checkpoint", "local", "dir"]),
                    f"{local_dir!r} is on FSx; the local tier belongs on the node's instance store "
                    f"(mounted from {pod_security.LOCAL_CHECKPOINT_HOST_PATH})",
                )
            )
            return
        if site.container is None:
            return
        cpath = site.path + ["spec", "containers", site.container_index, "volumeMounts"]
        volumes = {v.get("name"): v for v in _get(site.pod, ["spec", "volumes"]) or [] if isinstance(v, dict)}
        for mount in site.container.get("volumeMounts") or []:
            if isinstance(mount, dict) and mount.get("mountPath") == local_dir:
                host_path = _get(volumes.get(mount.get("name")) or {}, ["hostPath", "path"])
                if host_path == pod_security.LOCAL_CHECKPOINT_HOST_PATH:
                    return
        self.error(
            cpath,
            f"checkpoint.local.interval_steps turns the node-local tier on, but nothing from the node's "
            f"instance store ({pod_security.LOCAL_CHECKPOINT_HOST_PATH}) is mounted at checkpoint.local.dir "
            f"{local_dir}; render the job with nvrx-eks render, or set checkpoint.local.interval_steps=null",
        )

    def _train_config(self, sites: list[_PodSite]) -> tuple[TrainConfig | None, tuple[str, list]]:
        """The TrainConfig in the ConfigMap the pods mount, parsed and validated."""
        name = None
        for site in sites:
            for volume in _get(site.pod, ["spec", "volumes"]) or []:
                if isinstance(volume, dict) and "configMap" in volume:
                    name = _get(volume, ["configMap", "name"])
        config_map = next(
            (d for d in self.documents if d.get("kind") == "ConfigMap" and _get(d, ["metadata", "name"]) == name), None
        )
        if config_map is None:
            return None, ("(missing ConfigMap)", [])
        doc_id = _document_id(config_map)
        key_path = ["data", TRAIN_CONFIG_KEY]
        text = _get(config_map, key_path)
        if not isinstance(text, str):
            self.findings.append(Finding("project", doc_id, format_path(key_path), "missing: the trainer config YAML"))
            return None, (doc_id, key_path)
        try:
            data = yaml.safe_load(text)
            train = TrainConfig.from_dict(data if isinstance(data, dict) else {}, source=f"{doc_id} {TRAIN_CONFIG_KEY}")
        except (yaml.YAMLError, ConfigError) as e:
            for line in str(e).splitlines()[1:] or [str(e)]:
                field_path, _, message = line.strip().partition(": ")
                parts = key_path + [p for p in field_path.split(".") if p and p != "(top level)"]
                self.findings.append(Finding("project", doc_id, format_path(parts), message or line.strip()))
            return None, (doc_id, key_path)
        return train, (doc_id, key_path)

    def _node_count(self, job: dict, sites: list[_PodSite]) -> int | None:
        if job["kind"] == "JobSet":
            rjs = _get(job, ["spec", "replicatedJobs"]) or []
            total = 0
            for i, rj in enumerate(rjs):
                base = ["spec", "replicatedJobs", i]
                replicas = _get(rj, ["replicas"])
                parallelism = _get(rj, ["template", "spec", "parallelism"])
                completions = _get(rj, ["template", "spec", "completions"])
                if replicas not in (1, MISSING):
                    self.error(
                        base + ["replicas"], "must be 1: one Indexed Job holds all nodes, pod 0 hosts the rendezvous"
                    )
                if not isinstance(parallelism, int):
                    self.error(base + ["template", "spec", "parallelism"], "must be the node count (an integer)")
                    return None
                if completions != parallelism:
                    self.error(
                        base + ["template", "spec", "completions"],
                        f"is {completions}, must equal parallelism ({parallelism}): every node runs until the end",
                    )
                if _get(rj, ["template", "spec", "completionMode"]) != "Indexed":
                    self.error(
                        base + ["template", "spec", "completionMode"],
                        "must be Indexed: pod host names (and the rendezvous name) come from the index",
                    )
                total += parallelism
            return total
        specs = _get(job, ["spec", "pytorchReplicaSpecs"]) or {}
        total = 0
        for rtype, rs in specs.items():
            replicas = _get(rs, ["replicas"])
            if not isinstance(replicas, int):
                self.error(["spec", "pytorchReplicaSpecs", rtype, "replicas"], "must be an integer")
                return None
            if rtype == "Master" and replicas != 1:
                self.error(["spec", "pytorchReplicaSpecs", rtype, "replicas"], "must be 1 (the rendezvous host)")
            total += replicas
        if "Master" not in specs:
            self.error(["spec", "pytorchReplicaSpecs", "Master"], "missing: node 0 (the rendezvous host) is the Master")
        return total

    def _check_failure_policy(self, job: dict, sites: list[_PodSite], spares: int = 0) -> None:
        code = EXIT_DO_NOT_REQUEUE
        if job["kind"] == "JobSet":
            rules = _get(job, ["spec", "failurePolicy", "rules"])
            rules = rules if isinstance(rules, list) else []
            fail_index = next(
                (
                    i
                    for i, r in enumerate(rules)
                    if isinstance(r, dict)
                    and r.get("action") == "FailJobSet"
                    and "PodFailurePolicy" in (r.get("onJobFailureReasons") or [])
                ),
                None,
            )
            if fail_index is None:
                self.error(
                    ["spec", "failurePolicy", "rules"],
                    f"no FailJobSet rule on reason PodFailurePolicy: exit {code} would restart the JobSet",
                )
            else:
                for i, r in enumerate(rules[:fail_index]):
                    reasons = r.get("onJobFailureReasons") if isinstance(r, dict) else None
                    if (
                        isinstance(r, dict)
                        and r.get("action") != "FailJobSet"
                        and (not reasons or "PodFailurePolicy" in reasons)
                    ):
                        self.error(
                            ["spec", "failurePolicy", "rules", i],
                            f"matches PodFailurePolicy failures before the exit-{code} rule and restarts them",
                        )
            if not isinstance(_get(job, ["spec", "failurePolicy", "maxRestarts"]), int):
                self.error(["spec", "failurePolicy", "maxRestarts"], "missing: other failures would never be restarted")
            for i, rj in enumerate(_get(job, ["spec", "replicatedJobs"]) or []):
                base = ["spec", "replicatedJobs", i, "template", "spec"]
                site = sites[i] if i < len(sites) else None
                container = site.container.get("name") if site and site.container else None
                pfp = _get(rj, ["template", "spec", "podFailurePolicy", "rules"])
                has_rule = isinstance(pfp, list) and any(
                    isinstance(r, dict)
                    and r.get("action") == "FailJob"
                    and _get(r, ["onExitCodes", "operator"]) == "In"
                    and code in (_get(r, ["onExitCodes", "values"]) or [])
                    and _get(r, ["onExitCodes", "containerName"]) in (MISSING, None, container)
                    for r in pfp
                )
                if not has_rule:
                    self.error(
                        base + ["podFailurePolicy"],
                        f"no FailJob rule on exit code {code} of container {container!r}: "
                        "a do-not-requeue exit would be retried",
                    )
                if spares:
                    self._check_spare_policy(rj, base, spares)
                elif _get(rj, ["template", "spec", "backoffLimit"]) != 0:
                    self.error(
                        base + ["backoffLimit"],
                        "must be 0: one failed pod must fail the Job so the JobSet restarts all ranks together",
                    )
                restart_policy = _get(rj, ["template", "spec", "template", "spec", "restartPolicy"])
                if restart_policy != "Never":
                    self.error(
                        base + ["template", "spec", "restartPolicy"],
                        "must be Never: pod failure policies need it, and a container restarted in place would "
                        "rejoin a rendezvous the others left",
                    )
        else:
            for rtype, rs in (_get(job, ["spec", "pytorchReplicaSpecs"]) or {}).items():
                if _get(rs, ["restartPolicy"]) != "ExitCode":
                    self.error(
                        ["spec", "pytorchReplicaSpecs", rtype, "restartPolicy"],
                        f"must be ExitCode: only then does exit {code} fail the job while other exits are retried",
                    )
            if not isinstance(_get(job, ["spec", "runPolicy", "backoffLimit"]), int):
                self.error(["spec", "runPolicy", "backoffLimit"], "missing: retries would be unbounded")

    def _check_spare_policy(self, rj: dict, base: list, spares: int) -> None:
        """With hot spares, a pod failure while spares remain must leave the surviving pods running
        (a spare replaces the lost node in process) and must not start a replacement pod (its
        launcher would re-enter the rendezvous and restart every node); one more failure than
        there are spares must fail the Job, so that the JobSet recreates every pod."""
        spec = _get(rj, ["template", "spec"])
        if _get(spec, ["backoffLimitPerIndex"]) != 0:
            self.error(
                base + ["backoffLimitPerIndex"],
                f"must be 0 with {spares} spare node(s): a failed pod fails only its index, which is not retried, "
                "so the surviving pods are not recreated",
            )
        if _get(spec, ["maxFailedIndexes"]) != spares:
            self.error(
                base + ["maxFailedIndexes"],
                f"must be {spares} (the spare nodes): one failure more than there are spares must fail the Job "
                "so the JobSet restarts every pod",
            )
        if _get(spec, ["backoffLimit"]) == 0:
            self.error(base + ["backoffLimit"], "must not be 0 with spare nodes: one failed pod would fail the Job")
        parallelism = _get(spec, ["parallelism"])
        rules = _get(spec, ["successPolicy", "rules"])
        counts = [r.get("succeededCount") for r in rules if isinstance(r, dict)] if isinstance(rules, list) else []
        if isinstance(parallelism, int) and counts != [parallelism - spares]:
            self.error(
                base + ["successPolicy"],
                f"needs one rule succeededCount: {parallelism - spares} (the active nodes): a lost node's index "
                "stays failed, and without it the finished Job would count as failed",
            )

    def _check_deadline(self, job: dict, train: TrainConfig | None) -> None:
        """The backstop of nvrx_eks/jobs/backstop.py: a deadline that ends the job even when the
        trainer hangs where no restart layer reaches it, and (JobSet) a rule that fails the whole
        JobSet on it instead of recreating it."""
        floor = minimum_deadline_s(train) if train is not None else 1
        if job["kind"] == "JobSet":
            places = [
                ["spec", "replicatedJobs", i, "template", "spec", "activeDeadlineSeconds"]
                for i in range(len(_get(job, ["spec", "replicatedJobs"]) or []))
            ]
        else:
            places = [["spec", "runPolicy", "activeDeadlineSeconds"]]
        for path in places:
            value = _get(job, path)
            if not isinstance(value, int) or isinstance(value, bool):
                self.error(path, "missing: a trainer hung where no restart reaches it would hold the nodes forever")
            elif value < floor:
                self.error(
                    path,
                    f"is {value} s, below the {floor} s the trainer config needs to start and stop (setup section "
                    "timeout + termination grace); the job would be killed before training",
                )
        if job["kind"] == "JobSet":
            rules = _get(job, ["spec", "failurePolicy", "rules"])
            if not isinstance(rules, list) or not any(
                isinstance(r, dict)
                and r.get("action") == "FailJobSet"
                and "DeadlineExceeded" in (r.get("onJobFailureReasons") or [])
                for r in rules
            ):
                self.error(
                    ["spec", "failurePolicy", "rules"],
                    "no FailJobSet rule on reason DeadlineExceeded: a Job past its deadline would be recreated "
                    "and hold the nodes again",
                )

    def _check_pytorchjob_ports(self, sites: list[_PodSite]) -> None:
        for site in sites:
            if site.container is None:
                continue
            ports = site.container.get("ports") or []
            if not any(isinstance(p, dict) and p.get("name") == "pytorchjob-port" for p in ports):
                self.error(
                    site.path + ["spec", "containers", site.container_index, "ports"],
                    "needs a port named pytorchjob-port: the training operator builds the master service from it",
                )

    def _check_entrypoint(self, site, train, train_path, nodes, facts, world_size, expected_host, name) -> None:
        if site.container is None:
            return
        cpath = site.path + ["spec", "containers", site.container_index]
        if "command" in site.container:
            self.error(
                cpath + ["command"],
                "must not be set: it replaces the image's tini entrypoint, which reaps NVRx's detached "
                "monitor processes and passes SIGTERM to ft_launcher; put the entrypoint in args",
            )
        args = site.container.get("args")
        if not (isinstance(args, list) and len(args) == 3 and args[:2] == ["/bin/sh", "-c"]):
            self.error(cpath + ["args"], "must be [/bin/sh, -c, <entrypoint>] as rendered")
            return
        script_path = cpath + ["args", 2]
        launcher, preflight, dns_host = _parse_entrypoint(str(args[2]))
        if launcher is None:
            self.error(script_path, "no ft_launcher command in the entrypoint")
            return
        flags = _flags(launcher)
        endpoint = flags.get("--rdzv-endpoint")
        host, _, port = (endpoint or "").rpartition(":")
        if host != expected_host:
            self.error(
                script_path,
                f"--rdzv-endpoint host is {host or endpoint!r}; every node must rendezvous at pod 0's stable "
                f"DNS name {expected_host!r}",
            )
        elif port != str(RENDEZVOUS_PORT):
            self.error(script_path, f"--rdzv-endpoint port is {port!r}; the rendezvous port is {RENDEZVOUS_PORT}")
        if dns_host is not None and dns_host != expected_host:
            self.error(script_path, f"waits for DNS name {dns_host!r} instead of the rendezvous host {expected_host!r}")
        if nodes is not None and flags.get("--nnodes") != str(nodes):
            self.error(script_path, f"ft_launcher --nnodes is {flags.get('--nnodes')}, but the job has {nodes} nodes")
        if flags.get("--nproc-per-node") != str(facts.gpus):
            self.error(
                script_path,
                f"ft_launcher --nproc-per-node is {flags.get('--nproc-per-node')}, but {facts.instance_type} "
                f"has {facts.gpus} GPUs",
            )
        if preflight is None:
            self.error(script_path, "no trainer preflight before ft_launcher (it turns unfixable errors into exit 93)")
        elif world_size is not None and _flags(preflight).get("--world-size") != str(world_size):
            self.error(
                script_path,
                f"preflight --world-size is {_flags(preflight).get('--world-size')}, but nodes x GPUs = {world_size}",
            )
        if train is None:
            return
        grace = _get(site.pod, ["spec", "terminationGracePeriodSeconds"])
        needed = train.recommended_termination_grace_period_s()
        if not isinstance(grace, int) or grace < needed:
            self.error(
                site.path + ["spec", "terminationGracePeriodSeconds"],
                f"is {grace if grace is not MISSING else 'missing'}; the trainer config needs {needed} s for "
                "ft_launcher to stop ranks after an in-flight checkpoint",
            )
        if nodes is not None and endpoint:
            expected = build_ft_launcher_argv(
                train,
                config_path=TRAIN_CONFIG_PATH,
                nnodes=nodes,
                nproc_per_node=facts.gpus,
                rdzv_endpoint=endpoint,
                rdzv_id=name,
            )
            difference = _first_difference(launcher, expected)
            if difference:
                self.error(script_path, f"ft_launcher flags disagree with the trainer config: {difference}")
        if world_size is not None and preflight is not None:
            expected_pre = build_preflight_argv(config_path=TRAIN_CONFIG_PATH, world_size=world_size)
            difference = _first_difference(preflight, expected_pre)
            if difference:
                self.error(script_path, f"preflight command disagrees with the trainer config: {difference}")

    # -- fabric test --

    def _check_fabric_test(self, job: dict) -> None:
        sites = self._pod_sites(job, "nccl-tests")
        for site in sites:
            facts = self._instance_facts(site)
            self._check_scheduling(site)
            self._check_image(site, restarted=False)
            self._check_security(site)
            self._check_restricted(site)
            self._check_volumes(site, needs_config=False)
            if facts is not None:
                self._check_resources(site, facts)


def _pod_specs(node, path: list | None = None):
    """(path, PodSpec) for every pod spec anywhere in a document: a Pod's spec, the templates
    of Jobs, JobSets, PyTorchJobs, Deployments, and anything else that nests one."""
    path = path or []
    if isinstance(node, dict):
        if isinstance(node.get("containers"), list):
            yield path, node
            return
        for key, value in node.items():
            yield from _pod_specs(value, path + [key])
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from _pod_specs(value, path + [i])


def _cpu_cores(value) -> float | None:
    text = str(value)
    try:
        return float(text[:-1]) / 1000 if text.endswith("m") else float(text)
    except ValueError:
        return None


_MEMORY_UNITS = {
    "Ki": 2**-20,
    "Mi": 2**-10,
    "Gi": 1,
    "Ti": 2**10,
    "K": 1e3 / 2**30,
    "M": 1e6 / 2**30,
    "G": 1e9 / 2**30,
    "T": 1e12 / 2**30,
}


def _memory_gib(value) -> float | None:
    match = re.fullmatch(r"(\d+(?:\.\d+)?)([KMGT]i?)?", str(value))
    if not match:
        return None
    number, unit = float(match[1]), match[2]
    return number / 2**30 if unit is None else number * _MEMORY_UNITS[unit]


def _parse_entrypoint(script: str) -> tuple[list[str] | None, list[str] | None, str | None]:
    """(ft_launcher argv, preflight argv, host waited for) from the rendered entrypoint script."""
    launcher = preflight = dns_host = None
    for line in script.splitlines():
        try:
            tokens = shlex.split(line, comments=True)
        except ValueError:
            continue
        if not tokens:
            continue
        if tokens and tokens[-1] == "&":
            tokens = tokens[:-1]
        if "||" in tokens:
            tokens = tokens[: tokens.index("||")]
        if tokens and tokens[0] == "ft_launcher":
            launcher = tokens
        elif "--preflight" in tokens:
            preflight = tokens
    # The DNS wait's host is the argument after the closing quote of `python -c '...'`.
    match = re.search(r"^' (\S+) \|\| finish", script, flags=re.MULTILINE)
    if match:
        dns_host = shlex.split(match[1])[0]
    return launcher, preflight, dns_host


def _flags(argv: list[str]) -> dict[str, str]:
    flags = {}
    for i, token in enumerate(argv):
        if token.startswith("--") and i + 1 < len(argv):
            flags.setdefault(token, argv[i + 1])
    return flags


def _first_difference(actual: list[str], expected: list[str]) -> str | None:
    if actual == expected:
        return None
    actual_flags, expected_flags = _flags(actual), _flags(expected)
    for flag, value in expected_flags.items():
        if flag not in actual_flags:
            return f"{flag} is missing (expected {value})"
        if actual_flags[flag] != value:
            return f"{flag} is {actual_flags[flag]}, expected {value}"
    for flag in actual_flags:
        if flag not in expected_flags:
            return f"unexpected {flag}"
    return f"arguments differ: {shlex.join(actual)!r} vs {shlex.join(expected)!r}"


# ----- entry points -------------------------------------------------------------------------


def validate_documents(documents: list[dict], expected: Expectations) -> ValidationReport:
    report = ValidationReport(documents_checked=len(documents))
    documents = [copy.deepcopy(d) for d in documents]
    for index, doc in enumerate(documents):
        if not isinstance(doc, dict) or "kind" not in doc or "apiVersion" not in doc:
            report.findings.append(Finding("kubernetes", f"document {index}", "(document)", "not a Kubernetes object"))
    documents = [d for d in documents if isinstance(d, dict) and "kind" in d and "apiVersion" in d]

    for doc in documents:
        report.findings.extend(_validate_kubernetes_layer(doc, expected.kubernetes_version))

    custom = [d for d in documents if (d.get("apiVersion"), d.get("kind")) in CUSTOM_KINDS]
    if custom:
        files = crd_files()
        if files.skipped:
            report.skipped.append(f"{files.skipped}; the Kubernetes and project layers ran")
        else:
            schemas = load_crd_schemas(files.paths)
            for doc in custom:
                report.findings.extend(validate_custom_resource(doc, schemas))

    report.findings.extend(_Rules(documents, expected).run())
    return report


def load_documents(text: str, source: str) -> list[dict]:
    try:
        documents = [d for d in yaml.load_all(text, Loader=_YamlLoader) if d is not None]
    except yaml.YAMLError as e:
        raise ConfigError(f"{source} is not valid YAML: {e}") from None
    if not documents:
        raise ConfigError(f"{source} contains no Kubernetes objects")
    return documents
