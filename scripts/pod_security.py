"""What the project's pods may ask of the node, stated once: the templates render it, the
validator enforces it, and the Pod Security check in the tests measures it.

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
"""

from __future__ import annotations

#: The only capability a trainer container adds (EFA memory registration, see above).
TRAINER_CAPABILITIES = ("IPC_LOCK",)
#: The fabric test's sshd, on top of IPC_LOCK for EFA.
SSHD_CAPABILITIES = ("AUDIT_WRITE", "KILL", "SETGID", "SETUID", "SYS_CHROOT")
FABRIC_TEST_CAPABILITIES = TRAINER_CAPABILITIES + SSHD_CAPABILITIES

#: hostPath volumes a pod may mount, each reviewed (a node-local checkpoint tier will add its
#: directory here). Anything else on the node is out of reach.
HOST_PATH_ALLOW_LIST: tuple[str, ...] = ()

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


def pss_baseline_violations(pod_spec: dict, *, allowed_extra_capabilities: frozenset[str] = frozenset()) -> list[str]:
    """The Pod Security Standards "baseline" checks (kubernetes.io/docs/concepts/security/
    pod-security-standards), one message per violation; `allowed_extra_capabilities` are added
    capabilities accepted on top of the baseline set (our IPC_LOCK)."""
    problems = []
    for flag in ("hostNetwork", "hostPID", "hostIPC"):
        if pod_spec.get(flag):
            problems.append(f"spec.{flag}: host namespaces are not allowed")
    sc = pod_spec.get("securityContext") or {}
    if sc.get("windowsOptions", {}).get("hostProcess"):
        problems.append("spec.securityContext.windowsOptions.hostProcess: not allowed")
    for i, volume in enumerate(pod_spec.get("volumes") or []):
        if isinstance(volume, dict) and "hostPath" in volume:
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
