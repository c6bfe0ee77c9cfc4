"""One rendered pod as podman runs it: what the kubelet and the JobSet and Job controllers would
give it, and the few things a CPU machine must change (SUBSTITUTIONS, and nothing else).

Kept verbatim from the rendered pod: the container's args (and command, if any), its env (with
the downward-API fields and Kubernetes' $(VAR) expansion the kubelet applies), its security
context (capabilities, no privilege escalation, the seccomp profile: RuntimeDefault is
containerd's profile, as on EKS), its volume mounts (the FSx claim is one directory every pod
shares; a hostPath is one directory per node; a ConfigMap is its data as files, read-only; a
memory emptyDir at /dev/shm is a tmpfs of its size limit), the pod's host name under its JobSet
subdomain, and its termination grace period (honoured when the pod is deleted).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nvrx_eks.facts import job_kinds, job_names
from nvrx_eks.jobs.validate.rules.pods import memory_gib
from nvrx_eks.rehearse.runtime import CONTAINERD_SECCOMP, REHEARSAL_LABEL
from workloads.launch import MULTI_LAUNCHER_ENV

#: What a rehearsal changes in a rendered pod because the machine has no GPU, no EFA and no
#: cluster network; tests/runs/local/test_rehearse.py holds the rehearsed containers to this list.
SUBSTITUTIONS = {
    "ranks per node": "--nproc-per-node, --world-size and the world-size annotation for the ranks a pod runs "
    "on CPUs instead of one per GPU (rendered so: JobSpec.ranks_per_node)",
    "image": "the CPU twin of the trainer image: the Dockerfile's trainer stage on a Debian base",
    "resources": "no GPU, EFA, CPU or memory reservation: the machine has no devices to give",
    "network": "every pod in the host's network namespace, its DNS name resolving to a loopback address of its own",
    f"env {MULTI_LAUNCHER_ENV}": "1: ft_launcher's rendezvous must accept launchers sharing a host",
}

_EXPANSION = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)")


@dataclass(frozen=True)
class PodIdentity:
    """Who the controllers make a JobSet pod: names, labels the downward API reads, its node."""

    jobset: str
    index: int
    attempt: int
    jobset_uid: str
    node: str
    replicated_job: str = job_names.JOBSET_REPLICATED_JOB

    @property
    def hostname(self) -> str:
        return f"{self.jobset}-{self.replicated_job}-0-{self.index}"

    @property
    def address(self) -> str:
        return pod_address(self.index, self.replicated_job)

    @property
    def pod_name(self) -> str:
        return f"{self.hostname}-a{self.attempt}"

    @property
    def labels(self) -> dict[str, str]:
        return {
            "jobset.sigs.k8s.io/jobset-name": self.jobset,
            "jobset.sigs.k8s.io/replicatedjob-name": self.replicated_job,
            "jobset.sigs.k8s.io/job-index": "0",
            job_kinds.JOBSET_RESTART_ATTEMPT_LABEL: str(self.attempt),
            "jobset.sigs.k8s.io/jobset-uid": self.jobset_uid,
            "batch.kubernetes.io/job-completion-index": str(self.index),
        }


def pod_address(index: int, replicated_job: str = job_names.JOBSET_REPLICATED_JOB) -> str:
    """Pod `index`'s address: one of the host's loopback addresses (all of 127.0.0.0/8 is local),
    a different one per pod (the coordinator's in a block of its own), so that names resolve to
    the pod they name."""
    block = 11 if replicated_job == job_names.COORDINATOR_REPLICATED_JOB else 10
    return f"127.0.{block}.{index + 1}"


def expand(value: str, env: dict[str, str]) -> str:
    """Kubernetes' $(VAR) expansion of an env value: earlier variables only, $$ escapes, an
    unknown reference stays as written."""

    def one(match: re.Match[str]) -> str:
        if match.group(0) == "$$":
            return "$"
        return env.get(match.group(1), match.group(0))

    return _EXPANSION.sub(one, value)


def _field(path: str, pod: PodIdentity) -> str:
    if path == "metadata.name":
        return pod.pod_name
    if path == "spec.nodeName":
        return pod.node
    if path == "metadata.namespace":
        return "rehearsal"
    if m := re.fullmatch(r"metadata\.labels\['([^']+)'\]", path):
        return pod.labels.get(m.group(1), "")
    raise ValueError(f"the rehearsal does not emulate the downward-API field {path!r}")


def container_env(container: dict[str, Any], pod: PodIdentity) -> dict[str, str]:
    """The container's environment as the kubelet sets it (the Job controller adds
    JOB_COMPLETION_INDEX to an Indexed Job's pods)."""
    env: dict[str, str] = {"JOB_COMPLETION_INDEX": str(pod.index)}
    for var in container.get("env") or []:
        if "value" in var:
            env[var["name"]] = expand(str(var["value"]), env)
        elif "fieldRef" in (var.get("valueFrom") or {}):
            env[var["name"]] = _field(var["valueFrom"]["fieldRef"]["fieldPath"], pod)
        else:
            raise ValueError(f"the rehearsal does not emulate env {var['name']}'s source {var.get('valueFrom')}")
    return env


@dataclass(frozen=True)
class NodeDirs:
    """Host directories standing in for the cluster's storage."""

    fsx: Path  # the FSx claim, one for every pod
    node_root: Path  # this node's root: hostPath volumes live under it
    config_maps: Path  # ConfigMap data, one directory per ConfigMap


def volume_args(pod_spec: dict[str, Any], container: dict[str, Any], dirs: NodeDirs, claim: str) -> list[str]:
    volumes = {v["name"]: v for v in pod_spec.get("volumes") or []}
    args: list[str] = []
    for mount in container.get("volumeMounts") or []:
        volume = volumes[mount["name"]]
        target = mount["mountPath"]
        mode = "ro" if mount.get("readOnly") else "rw"
        if "persistentVolumeClaim" in volume:
            if volume["persistentVolumeClaim"]["claimName"] != claim:
                raise ValueError(f"volume {mount['name']}: only the claim {claim} is emulated")
            source = dirs.fsx
        elif "hostPath" in volume:
            source = dirs.node_root / volume["hostPath"]["path"].lstrip("/")
        elif "configMap" in volume:
            source = dirs.config_maps / volume["configMap"]["name"]
        elif "emptyDir" in volume:
            if volume["emptyDir"].get("medium") != "Memory":
                raise ValueError(f"volume {mount['name']}: only memory emptyDirs are emulated")
            size = memory_gib(volume["emptyDir"].get("sizeLimit"))
            args += ["--tmpfs", f"{target}:rw,size={int(size * 2**30)}" if size else target]
            continue
        else:
            raise ValueError(f"volume {mount['name']}: the rehearsal does not emulate {sorted(volume)}")
        if mount.get("subPath"):
            source = source / mount["subPath"]
        source.mkdir(parents=True, exist_ok=True)
        args += ["--volume", f"{source}:{target}:{mode}"]
    return args


def security_args(pod_spec: dict[str, Any], container: dict[str, Any]) -> list[str]:
    sc = container.get("securityContext") or {}
    args: list[str] = []
    if sc.get("privileged"):
        raise ValueError("a privileged container is never rehearsed")
    caps = sc.get("capabilities") or {}
    args += [arg for cap in caps.get("drop") or [] for arg in ("--cap-drop", cap)]
    args += [arg for cap in caps.get("add") or [] for arg in ("--cap-add", cap)]
    if sc.get("allowPrivilegeEscalation") is False:
        args += ["--security-opt", "no-new-privileges"]
    user = sc.get("runAsUser", (pod_spec.get("securityContext") or {}).get("runAsUser"))
    if user is not None:
        args += ["--user", str(user)]
    if sc.get("runAsNonRoot") and not user:
        # The kubelet refuses to start such a container unless the image names a non-root user;
        # the rendered pods always state the user, so this is a rendering fault.
        raise ValueError("runAsNonRoot without runAsUser is not rehearsed")
    profile = (sc.get("seccompProfile") or (pod_spec.get("securityContext") or {}).get("seccompProfile") or {}).get(
        "type"
    )
    if profile == "RuntimeDefault":
        args += ["--security-opt", f"seccomp={CONTAINERD_SECCOMP}"]
    elif profile is not None:
        raise ValueError(f"seccomp profile {profile}: only RuntimeDefault is rehearsed")
    return args


def create_argv(
    pod_template: dict[str, Any],
    container_name: str,
    pod: PodIdentity,
    *,
    image: str,
    hosts: list[tuple[str, str]],
    dirs: NodeDirs,
    claim: str,
    run_label: str,
) -> list[str]:
    """`podman create` arguments for the pod's container (the rehearsal runs one container per
    pod: the rendered pods have one)."""
    spec = pod_template["spec"]
    (container,) = [c for c in spec["containers"] if c["name"] == container_name]
    env = container_env(container, pod)
    env[MULTI_LAUNCHER_ENV] = "1"  # SUBSTITUTIONS
    argv = ["create", "--name", pod.pod_name, "--hostname", pod.hostname, "--network", "host"]
    # The JobSet's DNS records, then the pod's own host name as the kubelet writes it into
    # /etc/hosts: the DNS name first, so that the host's fully qualified name (what torch elastic
    # tells the other nodes to reach) is that name.
    entries = [*hosts, (pod.hostname, pod.address)]
    argv += [arg for host, address in entries for arg in ("--add-host", f"{host}:{address}")]
    argv += ["--label", f"{REHEARSAL_LABEL}={run_label}"]
    argv += [arg for key, value in pod.labels.items() for arg in ("--label", f"{key}={value}")]
    argv += ["--stop-timeout", str(spec.get("terminationGracePeriodSeconds", 30))]
    argv += security_args(spec, container)
    argv += volume_args(spec, container, dirs, claim)
    argv += [arg for key, value in env.items() for arg in ("--env", f"{key}={value}")]
    if container.get("command"):
        argv += ["--entrypoint", json.dumps(container["command"])]
    argv += [image, *(container.get("args") or [])]
    return argv
