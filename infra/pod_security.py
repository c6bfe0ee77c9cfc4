"""Pod security for the training namespace: Pod Security Admission labels plus a
ValidatingAdmissionPolicy that enforces "baseline, except IPC_LOCK".

The trainer needs IPC_LOCK (EFA registers pinned memory with the NIC). Pod Security Admission
cannot exempt one capability: `enforce: baseline` would reject every training pod. So PSA only
warns and audits against `restricted` (users see what a pod lacks), its enforce level stays
`privileged`, and the baseline controls that matter on a training node are enforced by a CEL
policy bound to the namespace: no privileged containers, no host namespaces, no hostPath outside
a reviewed allow-list, no hostPort, no seccomp Unconfined, and no added capability outside the
baseline set plus IPC_LOCK. ValidatingAdmissionPolicy is GA since Kubernetes 1.30.
"""

from __future__ import annotations

from infra.conventions import TRAINING_NAMESPACE

#: Capabilities Pod Security "baseline" lets a container add (Kubernetes Pod Security Standards).
BASELINE_CAPABILITIES = (
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
)
#: What the trainer adds beyond baseline: EFA memory registration pins pages.
TRAINER_CAPABILITIES = ("IPC_LOCK",)
ALLOWED_CAPABILITIES = BASELINE_CAPABILITIES + TRAINER_CAPABILITIES
#: hostPath volumes a training pod may mount, after review. Empty: none (a node-local checkpoint
#: tier would add the nodeadm local-storage mount here).
ALLOWED_HOST_PATHS: tuple[str, ...] = ()

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
    if not ALLOWED_HOST_PATHS:
        return "!has(object.spec.volumes) || object.spec.volumes.all(v, !has(v.hostPath))"
    return (
        "!has(object.spec.volumes) || object.spec.volumes.all(v, !has(v.hostPath) || "
        f"v.hostPath.path in {_cel_list(ALLOWED_HOST_PATHS)})"
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
        + (", ".join(ALLOWED_HOST_PATHS) or "empty")
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
            f"c.securityContext.capabilities.add.all(cap, cap in {_cel_list(ALLOWED_CAPABILITIES)})"
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
