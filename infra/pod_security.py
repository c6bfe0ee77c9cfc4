"""Pod security, stated once: what the project's pods may ask of the node (the job templates
render it, the validator enforces it offline, the tests measure it against Pod Security
"baseline"), and the admission policy that enforces it on the cluster.

Why the trainer stays root (the one point of Pod Security "restricted" it misses):
- EFA registers (pins) GPU and host memory with the NIC, which needs CAP_IPC_LOCK (or an
  unlimited memlock limit from the node). Kubernetes has no ambient capabilities
  (kubernetes/enhancements#2757 is open; containerd#5668 was closed unmerged): a capability
  added in `securityContext` reaches only uid 0, so a non-root trainer would lose IPC_LOCK.
- Everything already on /fsx (run dirs, checkpoints, events) was written as root with the
  default umask; a non-root trainer could not write into those directories, so it could not
  resume existing runs without re-owning the tree on the file system.
Everything else of "restricted" applies: all capabilities dropped but IPC_LOCK, no privilege
escalation, the runtime's seccomp profile, no service-account token (the trainer never calls
the Kubernetes API).

The NCCL fabric test runs OpenSSH's sshd (mpirun starts the ranks over ssh), which needs root
and, for its privilege-separated child, chroot, setuid/setgid and signals to that child; audit
writes are what PAM's session modules do at login. All of these are in Pod Security baseline's
allowed set.

On the cluster, Pod Security Admission cannot exempt one capability: `enforce: baseline` would
reject every training pod. So PSA only warns and audits against `restricted` (users see what a pod
lacks), its enforce level stays `privileged`, and the baseline controls that matter on a training
node are enforced by a CEL policy bound to the namespace: no privileged containers, no host
namespaces, no hostPath outside a reviewed allow-list, no hostPort, no seccomp Unconfined, and no
added capability outside the baseline set plus IPC_LOCK. ValidatingAdmissionPolicy is GA since
Kubernetes 1.30.
"""

from __future__ import annotations

from nvrx_eks.facts.names import TRAINING_NAMESPACE

#: The only capability a trainer container adds (EFA memory registration, see above).
TRAINER_CAPABILITIES = ("IPC_LOCK",)
#: The fabric test's sshd, on top of IPC_LOCK for EFA.
SSHD_CAPABILITIES = ("AUDIT_WRITE", "KILL", "SETGID", "SETUID", "SYS_CHROOT")
FABRIC_TEST_CAPABILITIES = TRAINER_CAPABILITIES + SSHD_CAPABILITIES

#: Where nodeadm mounts the instance-store RAID0 (`localStorage: {strategy: RAID0}` in
#: infra/constructs/node_user_data.py): amazon-eks-ami's setup-local-disks mounts the array at
#: `${MNT_DIR}/0`, MNT_DIR defaulting to /mnt/k8s-disks.
NODE_LOCAL_STORAGE_MOUNT = "/mnt/k8s-disks/0"
#: The node-local checkpoint tier's root on the node (workloads.checkpoint.local_tier); each job's pods mount
#: their own subdirectory of it (subPath = the job's name), never the root itself.
LOCAL_CHECKPOINT_HOST_PATH = f"{NODE_LOCAL_STORAGE_MOUNT}/nvrx-eks-checkpoints"

#: hostPath volumes a pod may mount, each reviewed. Anything else on the node is out of reach.
#: - LOCAL_CHECKPOINT_HOST_PATH: the local checkpoint tier needs storage that survives the
#:   pod (a launcher restart recreates ranks, a JobSet restart recreates pods on the same nodes)
#:   and is the node's NVMe, not its root volume; the trainer reads it back without unpickling
#:   (torch.load weights_only, SHA-256 checked), and only copies of its own run.
HOST_PATH_ALLOW_LIST: tuple[str, ...] = (LOCAL_CHECKPOINT_HOST_PATH,)

SECCOMP_PROFILE = "RuntimeDefault"

#: Pod Security Standards "baseline" (Kubernetes v1.35): the capabilities a container may add.
PSS_BASELINE_CAPABILITIES = frozenset(
    {
        "AUDIT_WRITE",
        "CHOWN",
        "DAC_OVERRIDE",
        "FOWNER",
        "FSETID",
        "KILL",
        "MKNOD",
        "NET_BIND_SERVICE",
        "SETFCAP",
        "SETGID",
        "SETPCAP",
        "SETUID",
        "SYS_CHROOT",
    }
)
_PSS_SECCOMP_TYPES = {"RuntimeDefault", "Localhost"}
_PSS_SYSCTLS = {
    "kernel.shm_rmid_forced",
    "net.ipv4.ip_local_port_range",
    "net.ipv4.ip_unprivileged_port_start",
    "net.ipv4.tcp_syncookies",
    "net.ipv4.ping_group_range",
    "net.ipv4.ip_local_reserved_ports",
    "net.ipv4.tcp_keepalive_time",
    "net.ipv4.tcp_fin_timeout",
    "net.ipv4.tcp_keepalive_intvl",
    "net.ipv4.tcp_keepalive_probes",
}


def _containers(pod_spec: dict):
    for section in ("initContainers", "containers", "ephemeralContainers"):
        for i, container in enumerate(pod_spec.get(section) or []):
            if isinstance(container, dict):
                yield f"spec.{section}[{i}]", container


def pss_baseline_violations(
    pod_spec: dict,
    *,
    allowed_extra_capabilities: frozenset[str] = frozenset(),
    allowed_host_paths: tuple[str, ...] = (),
) -> list[str]:
    """The Pod Security Standards "baseline" checks (kubernetes.io/docs/concepts/security/
    pod-security-standards), one message per violation; `allowed_extra_capabilities` are added
    capabilities accepted on top of the baseline set (our IPC_LOCK), `allowed_host_paths` the
    hostPath volumes accepted (baseline allows none; ours: HOST_PATH_ALLOW_LIST)."""
    problems = []
    for flag in ("hostNetwork", "hostPID", "hostIPC"):
        if pod_spec.get(flag):
            problems.append(f"spec.{flag}: host namespaces are not allowed")
    sc = pod_spec.get("securityContext") or {}
    if sc.get("windowsOptions", {}).get("hostProcess"):
        problems.append("spec.securityContext.windowsOptions.hostProcess: not allowed")
    for i, volume in enumerate(pod_spec.get("volumes") or []):
        if (
            isinstance(volume, dict)
            and "hostPath" in volume
            and volume["hostPath"].get("path") not in allowed_host_paths
        ):
            problems.append(f"spec.volumes[{i}].hostPath: hostPath volumes are not allowed")
    for sysctl in sc.get("sysctls") or []:
        if sysctl.get("name") not in _PSS_SYSCTLS:
            problems.append(f"spec.securityContext.sysctls: {sysctl.get('name')} is not a safe sysctl")
    problems += _seccomp_problems("spec.securityContext", sc)
    problems += _selinux_apparmor_problems("spec.securityContext", sc)
    allowed = PSS_BASELINE_CAPABILITIES | allowed_extra_capabilities
    for where, container in _containers(pod_spec):
        csc = container.get("securityContext") or {}
        if csc.get("privileged"):
            problems.append(f"{where}.securityContext.privileged: privileged containers are not allowed")
        if (csc.get("windowsOptions") or {}).get("hostProcess"):
            problems.append(f"{where}.securityContext.windowsOptions.hostProcess: not allowed")
        for cap in (csc.get("capabilities") or {}).get("add") or []:
            if cap not in allowed:
                problems.append(f"{where}.securityContext.capabilities.add: {cap} is beyond baseline")
        for j, port in enumerate(container.get("ports") or []):
            if isinstance(port, dict) and port.get("hostPort"):
                problems.append(f"{where}.ports[{j}].hostPort: host ports are not allowed")
        if csc.get("procMount") not in (None, "Default"):
            problems.append(f"{where}.securityContext.procMount: must be Default")
        problems += _seccomp_problems(f"{where}.securityContext", csc)
        problems += _selinux_apparmor_problems(f"{where}.securityContext", csc)
    return problems


def _seccomp_problems(where: str, sc: dict) -> list[str]:
    kind = (sc.get("seccompProfile") or {}).get("type")
    if kind is not None and kind not in _PSS_SECCOMP_TYPES:
        return [f"{where}.seccompProfile.type: {kind} is not allowed"]
    return []


def _selinux_apparmor_problems(where: str, sc: dict) -> list[str]:
    problems = []
    selinux = sc.get("seLinuxOptions") or {}
    if selinux.get("type") not in (None, "", "container_t", "container_init_t", "container_kvm_t"):
        problems.append(f"{where}.seLinuxOptions.type: {selinux['type']} is not allowed")
    if selinux.get("user") or selinux.get("role"):
        problems.append(f"{where}.seLinuxOptions: user and role must not be set")
    apparmor = (sc.get("appArmorProfile") or {}).get("type")
    if apparmor not in (None, "RuntimeDefault", "Localhost"):
        problems.append(f"{where}.appArmorProfile.type: {apparmor} is not allowed")
    return problems


#: What the admission policy lets any container of the namespace add: baseline's set, IPC_LOCK.
_ADMITTED_CAPABILITIES = tuple(sorted(PSS_BASELINE_CAPABILITIES)) + TRAINER_CAPABILITIES

POLICY_NAME = "nvrx-eks-training-baseline"

#: Labels on the training namespace. PSA cannot enforce baseline here (see the module doc).
NAMESPACE_LABELS = {
    "pod-security.kubernetes.io/enforce": "privileged",
    "pod-security.kubernetes.io/warn": "restricted",
    "pod-security.kubernetes.io/audit": "restricted",
}


def _cel_list(items: tuple[str, ...]) -> str:
    return "[" + ", ".join(f"'{item}'" for item in items) + "]"


def _each_container(check: str) -> str:
    """`check` (over a container `c`) for every container, init container and ephemeral
    container of the pod."""
    lists = ("object.spec.containers", "object.spec.initContainers", "object.spec.ephemeralContainers")
    return " && ".join(f"(!has({path}) || {path}.all(c, {check}))" for path in lists)


def _no_host_path() -> str:
    if not HOST_PATH_ALLOW_LIST:
        return "!has(object.spec.volumes) || object.spec.volumes.all(v, !has(v.hostPath))"
    return (
        "!has(object.spec.volumes) || object.spec.volumes.all(v, !has(v.hostPath) || "
        f"v.hostPath.path in {_cel_list(HOST_PATH_ALLOW_LIST)})"
    )


#: (CEL expression that must hold, message when it does not), in the policy's order.
VALIDATIONS: tuple[tuple[str, str], ...] = (
    (
        _each_container(
            "!has(c.securityContext) || !has(c.securityContext.privileged) || !c.securityContext.privileged"
        ),
        "privileged containers are not allowed in the training namespace",
    ),
    (
        "(!has(object.spec.hostNetwork) || !object.spec.hostNetwork) && "
        "(!has(object.spec.hostPID) || !object.spec.hostPID) && "
        "(!has(object.spec.hostIPC) || !object.spec.hostIPC)",
        "host namespaces (hostNetwork, hostPID, hostIPC) are not allowed in the training namespace",
    ),
    (
        _no_host_path(),
        "hostPath volumes are not allowed in the training namespace (reviewed allow-list: "
        + (", ".join(HOST_PATH_ALLOW_LIST) or "empty")
        + ")",
    ),
    (
        _each_container("!has(c.ports) || c.ports.all(p, !has(p.hostPort) || p.hostPort == 0)"),
        "hostPort is not allowed in the training namespace",
    ),
    (
        _each_container(
            "!has(c.securityContext) || !has(c.securityContext.capabilities) || "
            "!has(c.securityContext.capabilities.add) || "
            f"c.securityContext.capabilities.add.all(cap, cap in {_cel_list(_ADMITTED_CAPABILITIES)})"
        ),
        "containers may add only the Pod Security baseline capabilities and IPC_LOCK",
    ),
    (
        "(!has(object.spec.securityContext) || !has(object.spec.securityContext.seccompProfile) || "
        "object.spec.securityContext.seccompProfile.type != 'Unconfined') && "
        + _each_container(
            "!has(c.securityContext) || !has(c.securityContext.seccompProfile) || "
            "c.securityContext.seccompProfile.type != 'Unconfined'"
        ),
        "seccomp profile Unconfined is not allowed in the training namespace",
    ),
)


def admission_policy_manifests() -> list[dict]:
    """The ValidatingAdmissionPolicy and its binding to the training namespace."""
    return [
        {
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "ValidatingAdmissionPolicy",
            "metadata": {"name": POLICY_NAME},
            "spec": {
                # An evaluation error rejects the pod: a policy that cannot be evaluated must not
                # let the pod through unchecked.
                "failurePolicy": "Fail",
                "matchConstraints": {
                    "resourceRules": [
                        {
                            "apiGroups": [""],
                            "apiVersions": ["v1"],
                            "operations": ["CREATE", "UPDATE"],
                            "resources": ["pods", "pods/ephemeralcontainers"],
                        }
                    ]
                },
                "validations": [{"expression": expression, "message": message} for expression, message in VALIDATIONS],
            },
        },
        {
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "ValidatingAdmissionPolicyBinding",
            "metadata": {"name": POLICY_NAME},
            "spec": {
                "policyName": POLICY_NAME,
                "validationActions": ["Deny"],
                "matchResources": {
                    "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": TRAINING_NAMESPACE}}
                },
            },
        },
    ]
