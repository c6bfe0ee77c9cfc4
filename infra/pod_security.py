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
lacks), its enforce level stays `privileged`, and every baseline control is enforced by a CEL
policy bound to the namespace, with two exceptions: IPC_LOCK may be added, and a reviewed
allow-list of host directories may be mounted. The offline validator checks the same controls
(pod_security_violations). ValidatingAdmissionPolicy is GA since Kubernetes 1.30.

Two rules go beyond baseline and keep one job's pods out of every other job's files. Both name
the pod's job by its JOB_LABEL label, which the job templates set to the job's name:
- a PersistentVolumeClaim (the shared FSx claim) is mounted writable only at the job's own run
  directory, subPath `runs/<job>` or below it (nvrx_eks.facts.job_names.run_dir_on_claim); every
  other mount of it is readOnly, so a pod reads datasets and other runs and changes none of them;
- an allowed host directory is mounted only by subPath `<job>` exactly: its root holds every job's
  node-local checkpoint copies on the node.
A pod without the label gets neither. The label is what the pod's creator says it is: anyone who
may create pods in the namespace can label one as another job's and write that job's directories.
The rules stop a pod from reaching past the job it names, not a creator from naming another job.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from nvrx_eks.facts.job_names import APP_INSTANCE_LABEL, run_dir_on_claim
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
#: their own subdirectory of it (subPath = the job's name, JOB_LABEL), never the root itself.
LOCAL_CHECKPOINT_HOST_PATH = f"{NODE_LOCAL_STORAGE_MOUNT}/nvrx-eks-checkpoints"

#: hostPath volumes a pod may mount, each reviewed. Anything else on the node is out of reach.
#: - LOCAL_CHECKPOINT_HOST_PATH: the local checkpoint tier needs storage that survives the
#:   pod (a launcher restart recreates ranks, a JobSet restart recreates pods on the same nodes)
#:   and is the node's NVMe, not its root volume; the trainer reads it back without unpickling
#:   (torch.load weights_only, SHA-256 checked), and only copies of its own run.
HOST_PATH_ALLOW_LIST: tuple[str, ...] = (LOCAL_CHECKPOINT_HOST_PATH,)

SECCOMP_PROFILE = "RuntimeDefault"

#: The pod label naming the pod's job (the job templates set it to the job's name): the claim's
#: run directory and the host directory a pod may write are that job's (see the module doc).
JOB_LABEL = APP_INSTANCE_LABEL

# Pod Security Standards "baseline" (Kubernetes v1.35), control by control: what a pod may set.
#: The capabilities a container may add.
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
#: seccompProfile.type and appArmorProfile.type (pod and container level), where set.
_PSS_SECCOMP_TYPES = ("RuntimeDefault", "Localhost")
_PSS_APPARMOR_TYPES = ("RuntimeDefault", "Localhost")
#: The annotation form of AppArmor, one per container, still honoured beside the field: its value
#: may be empty, runtime/default or localhost/<profile>.
APPARMOR_ANNOTATION_PREFIX = "container.apparmor.security.beta.kubernetes.io/"
_PSS_APPARMOR_ANNOTATION_VALUES = ("", "runtime/default")
_PSS_APPARMOR_ANNOTATION_LOCALHOST = "localhost/"
#: seLinuxOptions.type, where set; user and role must stay empty.
_PSS_SELINUX_TYPES = ("", "container_t", "container_init_t", "container_kvm_t", "container_engine_t")
#: procMount, where set: the runtime's masked /proc.
_PSS_PROC_MOUNT = "Default"
#: The "safe" sysctls: namespaced and isolated from other pods on the node.
_PSS_SYSCTLS = (
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
)
#: Probes and lifecycle hooks whose httpGet/tcpSocket `host` must stay empty: the kubelet would
#: connect from the node to any address the pod names.
_PROBES = ("livenessProbe", "readinessProbe", "startupProbe")
_LIFECYCLE_HOOKS = ("postStart", "preStop")
_HOST_HANDLERS = ("httpGet", "tcpSocket")

_CONTAINER_SECTIONS = ("initContainers", "containers", "ephemeralContainers")
#: A `..` path component (RE2 and Python alike): it leads out of a subPath's volume.
PARENT_COMPONENT_PATTERN = "(^|/)[.][.](/|$)"


@dataclass(frozen=True)
class Violation:
    """One Pod Security problem: the path of the offending field from the pod (or pod template),
    e.g. ("spec", "containers", 0, "securityContext", "privileged"), and what is wrong."""

    path: tuple[str | int, ...]
    message: str

    def __str__(self) -> str:
        dotted = ""
        for part in self.path:
            if isinstance(part, int):
                dotted += f"[{part}]"
            elif re.fullmatch(r"[A-Za-z0-9_]+", part):
                dotted += f".{part}" if dotted else part
            else:
                dotted += f'["{part}"]'
        return f"{dotted}: {self.message}"


def _dict(value) -> dict:
    return value if isinstance(value, dict) else {}


def _list(value) -> list:
    return value if isinstance(value, list) else []


def pod_security_violations(
    pod_spec: dict,
    *,
    labels: dict | None = None,
    annotations: dict | None = None,
    allowed_capabilities: frozenset[str] = PSS_BASELINE_CAPABILITIES,
    allowed_host_paths: tuple[str, ...] = (),
) -> list[Violation]:
    """Every Pod Security Standards "baseline" control (kubernetes.io/docs/concepts/security/
    pod-security-standards) over a pod's spec, labels and annotations, with this project's
    exceptions: `allowed_capabilities` are all a container may add (baseline's set, or the few a
    pod of this project needs), `allowed_host_paths` the hostPath volumes accepted (baseline allows
    none; ours: HOST_PATH_ALLOW_LIST), each mounted only by the job's own subdirectory; and the
    rule that a claim is writable only in the job's own run directory (the module doc)."""
    problems: list[Violation] = []
    for flag in ("hostNetwork", "hostPID", "hostIPC"):
        if pod_spec.get(flag):
            problems.append(Violation(("spec", flag), "host namespaces are not allowed"))
    sc = _dict(pod_spec.get("securityContext"))
    problems += _security_context_problems(("spec", "securityContext"), sc)
    for i, sysctl in enumerate(_list(sc.get("sysctls"))):
        name = _dict(sysctl).get("name")
        if name not in _PSS_SYSCTLS:
            problems.append(
                Violation(
                    ("spec", "securityContext", "sysctls", i, "name"),
                    f"{name} is not a safe sysctl (baseline's list: infra/pod_security.py)",
                )
            )
    job = _dict(labels).get(JOB_LABEL)
    mounts = _MountRules(job if isinstance(job, str) and job else None, writable_claims=set(), host_directories=set())
    for i, volume in enumerate(_list(pod_spec.get("volumes"))):
        volume = _dict(volume)
        if "persistentVolumeClaim" in volume and _dict(volume["persistentVolumeClaim"]).get("readOnly") is not True:
            mounts.writable_claims.add(volume.get("name"))
        if "hostPath" not in volume:
            continue
        host_path = _dict(volume["hostPath"]).get("path")
        if host_path in allowed_host_paths:
            mounts.host_directories.add(volume.get("name"))
        elif allowed_host_paths:
            problems.append(
                Violation(
                    ("spec", "volumes", i, "hostPath"),
                    f"{host_path!r} is not on the reviewed hostPath allow-list ({', '.join(allowed_host_paths)}); "
                    "use the FSx claim or an emptyDir",
                )
            )
        else:
            problems.append(Violation(("spec", "volumes", i, "hostPath"), "hostPath volumes are not allowed"))
    for section in _CONTAINER_SECTIONS:
        for j, container in enumerate(_list(pod_spec.get(section))):
            if isinstance(container, dict):
                where = ("spec", section, j)
                problems += _container_problems(where, container, allowed_capabilities, mounts)
    for key, value in _dict(annotations).items():
        if (
            str(key).startswith(APPARMOR_ANNOTATION_PREFIX)
            and value not in _PSS_APPARMOR_ANNOTATION_VALUES
            and not str(value).startswith(_PSS_APPARMOR_ANNOTATION_LOCALHOST)
        ):
            problems.append(
                Violation(
                    ("metadata", "annotations", key),
                    f"AppArmor profile {value!r} is not allowed (runtime/default or localhost/<profile>)",
                )
            )
    return problems


def _container_problems(
    where: tuple, container: dict, allowed_capabilities: frozenset[str], mounts: _MountRules
) -> list[Violation]:
    problems = []
    csc = _dict(container.get("securityContext"))
    if csc.get("privileged"):
        problems.append(Violation((*where, "securityContext", "privileged"), "privileged containers are not allowed"))
    for cap in _list(_dict(csc.get("capabilities")).get("add")):
        if cap not in allowed_capabilities:
            message = (
                f"{cap} is beyond baseline"
                if cap not in PSS_BASELINE_CAPABILITIES
                else f"{cap} is not needed here: only {', '.join(sorted(allowed_capabilities))} may be added "
                "(infra/pod_security.py says why)"
            )
            problems.append(Violation((*where, "securityContext", "capabilities", "add"), message))
    for k, port in enumerate(_list(container.get("ports"))):
        if _dict(port).get("hostPort"):
            problems.append(Violation((*where, "ports", k, "hostPort"), "host ports are not allowed"))
    if csc.get("procMount") not in (None, _PSS_PROC_MOUNT):
        problems.append(
            Violation(
                (*where, "securityContext", "procMount"),
                f"must be {_PSS_PROC_MOUNT} (or unset): the runtime masks /proc",
            )
        )
    problems += _security_context_problems((*where, "securityContext"), csc)
    for handler_path in [(probe,) for probe in _PROBES] + [("lifecycle", hook) for hook in _LIFECYCLE_HOOKS]:
        handler: object = container
        for part in handler_path:
            handler = _dict(handler).get(part)
        for kind in _HOST_HANDLERS:
            if _dict(_dict(handler).get(kind)).get("host"):
                message = "must not be set: the kubelet would connect to that host from the node"
                problems.append(Violation((*where, *handler_path, kind, "host"), message))
    for k, mount in enumerate(_list(container.get("volumeMounts"))):
        problems += mounts.problems((*where, "volumeMounts", k), _dict(mount))
    return problems


@dataclass
class _MountRules:
    """What a volume mount may reach, for a pod of `job` (its JOB_LABEL label; None without one)."""

    job: str | None
    #: Volumes of PersistentVolumeClaims not read-only as a whole, and of allowed host directories.
    writable_claims: set
    host_directories: set

    def problems(self, where: tuple, mount: dict) -> list[Violation]:
        """A mount reaches only what its volume names: no `..` out of it, no subPathExpr
        (expanded from the environment at start, so no check sees where it leads); an allowed
        host directory only by the job's own subdirectory (its root holds every job's node-local
        copies on that node); a claim writable only in the job's own run directory."""
        problems = []
        sub_path = mount.get("subPath")
        if "subPathExpr" in mount:
            problems.append(Violation((*where, "subPathExpr"), "not allowed: mount a fixed subPath"))
        if isinstance(sub_path, str) and re.search(PARENT_COMPONENT_PATTERN, sub_path):
            problems.append(Violation((*where, "subPath"), f"{sub_path!r} has a '..' component that leaves the volume"))
        elif mount.get("name") in self.host_directories and (self.job is None or sub_path != self.job):
            problems.append(
                Violation(
                    (*where, "subPath"),
                    f"is {sub_path!r}: a host directory is mounted only by the job's own subdirectory, named by "
                    f"the pod's {JOB_LABEL} label ({self._job_words}); its root holds every job's files on the node",
                )
            )
        if (
            mount.get("name") in self.writable_claims
            and mount.get("readOnly") is not True
            and not self.in_own_run_dir(sub_path)
        ):
            own = f"{run_dir_on_claim(self.job)} or below it" if self.job else self._job_words
            problems.append(
                Violation(
                    (*where, "readOnly"),
                    f"must be true: the shared claim is writable only in the job's own run directory (subPath "
                    f"{own}, after the pod's {JOB_LABEL} label); every other job's runs and data are read-only",
                )
            )
        return problems

    def in_own_run_dir(self, sub_path) -> bool:
        if self.job is None or not isinstance(sub_path, str):
            return False
        own = run_dir_on_claim(self.job)
        return sub_path == own or sub_path.startswith(own + "/")

    @property
    def _job_words(self) -> str:
        return repr(self.job) if self.job else "the pod has none"


def _security_context_problems(where: tuple, sc: dict) -> list[Violation]:
    """The controls a pod-level and a container-level securityContext share."""
    problems = []
    if _dict(sc.get("windowsOptions")).get("hostProcess"):
        problems.append(Violation((*where, "windowsOptions", "hostProcess"), "not allowed: it runs on the host"))
    seccomp = _dict(sc.get("seccompProfile")).get("type")
    if seccomp is not None and seccomp not in _PSS_SECCOMP_TYPES:
        problems.append(Violation((*where, "seccompProfile", "type"), f"{seccomp} is not allowed; use RuntimeDefault"))
    apparmor = _dict(sc.get("appArmorProfile")).get("type")
    if apparmor is not None and apparmor not in _PSS_APPARMOR_TYPES:
        problems.append(
            Violation((*where, "appArmorProfile", "type"), f"{apparmor} is not allowed; use RuntimeDefault")
        )
    selinux = _dict(sc.get("seLinuxOptions"))
    if selinux.get("type") not in (None, *_PSS_SELINUX_TYPES):
        problems.append(
            Violation((*where, "seLinuxOptions", "type"), f"{selinux['type']} is not allowed; leave it unset")
        )
    for field in ("user", "role"):
        if selinux.get(field):
            problems.append(Violation((*where, "seLinuxOptions", field), "must not be set; leave it to the runtime"))
    return problems


def pss_baseline_violations(
    pod_spec: dict,
    *,
    labels: dict | None = None,
    annotations: dict | None = None,
    allowed_extra_capabilities: frozenset[str] = frozenset(),
    allowed_host_paths: tuple[str, ...] = (),
) -> list[str]:
    """pod_security_violations against baseline's capabilities plus `allowed_extra_capabilities`
    (our IPC_LOCK), one `path: message` line per violation."""
    problems = pod_security_violations(
        pod_spec,
        labels=labels,
        annotations=annotations,
        allowed_capabilities=PSS_BASELINE_CAPABILITIES | allowed_extra_capabilities,
        allowed_host_paths=allowed_host_paths,
    )
    return [str(problem) for problem in problems]


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


def _unset_or(base: str, fields: tuple[str, ...], condition: str) -> str:
    """CEL: the field `base.fields...` is absent (or one of its parents is), or `condition` (a
    format with {} for the field) holds."""
    absent = [f"!has({'.'.join((base, *fields[: i + 1]))})" for i in range(len(fields))]
    return "(" + " || ".join([*absent, condition.format(".".join((base, *fields)))]) + ")"


def _each_container(check: str) -> str:
    """`check` (over a container `c`) for every container, init container and ephemeral
    container of the pod."""
    lists = tuple(f"object.spec.{section}" for section in _CONTAINER_SECTIONS)
    return " && ".join(f"(!has({path}) || {path}.all(c, {check}))" for path in lists)


def _pod_and_containers(fields: tuple[str, ...], condition: str) -> str:
    """`condition` over `securityContext.<fields>` wherever set: on the pod and on every container."""
    pod = _unset_or("object.spec", ("securityContext", *fields), condition)
    return f"{pod} && " + _each_container(_unset_or("c", ("securityContext", *fields), condition))


def _no_host_path() -> str:
    if not HOST_PATH_ALLOW_LIST:
        return "!has(object.spec.volumes) || object.spec.volumes.all(v, !has(v.hostPath))"
    return (
        "!has(object.spec.volumes) || object.spec.volumes.all(v, !has(v.hostPath) || "
        f"v.hostPath.path in {_cel_list(HOST_PATH_ALLOW_LIST)})"
    )


#: The pod's JOB_LABEL label in CEL, and whether it has a non-empty one.
_CEL_JOB = f"object.metadata.labels['{JOB_LABEL}']"
_CEL_HAS_JOB = f"(has(object.metadata.labels) && '{JOB_LABEL}' in object.metadata.labels && {_CEL_JOB} != '')"


def _cel_run_dir_on_claim() -> str:
    """job_names.run_dir_on_claim of the pod's job, in CEL: the same formula, not a copy of it."""
    marker = "\0"
    before, _, after = run_dir_on_claim(marker).partition(marker)
    return " + ".join([*([f"'{before}'"] if before else []), _CEL_JOB, *([f"'{after}'"] if after else [])])


def _mounts_stay_inside() -> str:
    """The `..`, subPathExpr and host directory rules of _MountRules.problems, over every mount `m`
    of every container."""
    allowed_host_volume = (
        "has(object.spec.volumes) && object.spec.volumes.exists(v, v.name == m.name && has(v.hostPath) && "
        f"v.hostPath.path in {_cel_list(HOST_PATH_ALLOW_LIST)})"
    )
    mount = (
        "!has(m.subPathExpr) && "
        f"(!has(m.subPath) || !m.subPath.matches('{PARENT_COMPONENT_PATTERN}')) && "
        f"(!({allowed_host_volume}) || ({_CEL_HAS_JOB} && has(m.subPath) && m.subPath == {_CEL_JOB}))"
    )
    return _each_container(f"!has(c.volumeMounts) || c.volumeMounts.all(m, {mount})")


def _claims_written_only_in_own_run_dir() -> str:
    """The claim rule of _MountRules.problems, over every mount `m` of every container."""
    writable_claim = (
        "has(object.spec.volumes) && object.spec.volumes.exists(v, v.name == m.name && "
        "has(v.persistentVolumeClaim) && !(has(v.persistentVolumeClaim.readOnly) && v.persistentVolumeClaim.readOnly))"
    )
    own = _cel_run_dir_on_claim()
    in_own_run_dir = f"({_CEL_HAS_JOB} && has(m.subPath) && (m.subPath == {own} || m.subPath.startsWith({own} + '/')))"
    mount = f"!({writable_claim}) || (has(m.readOnly) && m.readOnly) || {in_own_run_dir}"
    return _each_container(f"!has(c.volumeMounts) || c.volumeMounts.all(m, {mount})")


def _no_host_in_handlers() -> str:
    handlers = [(probe,) for probe in _PROBES] + [("lifecycle", hook) for hook in _LIFECYCLE_HOOKS]
    checks = [_unset_or("c", (*handler, kind, "host"), "{} == ''") for handler in handlers for kind in _HOST_HANDLERS]
    return _each_container(" && ".join(checks))


def _apparmor_annotations() -> str:
    value = "object.metadata.annotations[k]"
    # Parenthesized: it is joined to other checks with &&, which binds tighter than its ||.
    return (
        "(!has(object.metadata.annotations) || object.metadata.annotations.all(k, "
        f"!k.startsWith('{APPARMOR_ANNOTATION_PREFIX}') || {value} in {_cel_list(_PSS_APPARMOR_ANNOTATION_VALUES)} || "
        f"{value}.startsWith('{_PSS_APPARMOR_ANNOTATION_LOCALHOST}')))"
    )


#: (CEL expression that must hold, message when it does not), in the policy's order: the
#: controls of pod_security_violations, one validation each (the policy's `object` is the pod).
VALIDATIONS: tuple[tuple[str, str], ...] = (
    (
        _each_container(_unset_or("c", ("securityContext", "privileged"), "!{}")),
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
        _mounts_stay_inside(),
        "a volume mount may not use subPathExpr or a subPath with '..', and an allowed host directory is "
        f"mounted only by the job's own subdirectory: subPath equal to the pod's {JOB_LABEL} label",
    ),
    (
        _claims_written_only_in_own_run_dir(),
        "a PersistentVolumeClaim is mounted readOnly except in the job's own run directory: subPath "
        + run_dir_on_claim(f"<the pod's {JOB_LABEL} label>")
        + " or below it",
    ),
    (
        _each_container("!has(c.ports) || c.ports.all(p, !has(p.hostPort) || p.hostPort == 0)"),
        "hostPort is not allowed in the training namespace",
    ),
    (
        _each_container(
            _unset_or(
                "c",
                ("securityContext", "capabilities", "add"),
                f"{{}}.all(cap, cap in {_cel_list(_ADMITTED_CAPABILITIES)})",
            )
        ),
        "containers may add only the Pod Security baseline capabilities and IPC_LOCK",
    ),
    (
        _pod_and_containers(("seccompProfile", "type"), f"{{}} in {_cel_list(_PSS_SECCOMP_TYPES)}"),
        "seccomp profile Unconfined is not allowed in the training namespace",
    ),
    (
        _pod_and_containers(("windowsOptions", "hostProcess"), "!{}"),
        "windows hostProcess is not allowed in the training namespace",
    ),
    (
        _each_container(_unset_or("c", ("securityContext", "procMount"), f"{{}} == '{_PSS_PROC_MOUNT}'")),
        f"procMount other than {_PSS_PROC_MOUNT} is not allowed in the training namespace",
    ),
    (
        _unset_or("object.spec", ("securityContext", "sysctls"), f"{{}}.all(s, s.name in {_cel_list(_PSS_SYSCTLS)})"),
        "only the Pod Security baseline's safe sysctls are allowed in the training namespace",
    ),
    (
        _pod_and_containers(("appArmorProfile", "type"), f"{{}} in {_cel_list(_PSS_APPARMOR_TYPES)}")
        + " && "
        + _apparmor_annotations(),
        "AppArmor profiles other than RuntimeDefault and Localhost are not allowed in the training namespace",
    ),
    (
        _pod_and_containers(("seLinuxOptions", "type"), f"{{}} in {_cel_list(_PSS_SELINUX_TYPES)}")
        + " && "
        + _pod_and_containers(("seLinuxOptions", "user"), "{} == ''")
        + " && "
        + _pod_and_containers(("seLinuxOptions", "role"), "{} == ''"),
        "SELinux options other than the Pod Security baseline's container types are not allowed in the "
        "training namespace",
    ),
    (
        _no_host_in_handlers(),
        "probes and lifecycle hooks may not name a host in the training namespace",
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
