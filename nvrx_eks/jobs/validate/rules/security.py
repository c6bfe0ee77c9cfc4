"""Pod security rules: what no pod may do to its node, how restricted the job's own pods are, and
the NetworkPolicy that admits only the job's pods."""

from __future__ import annotations

from infra import pod_security
from nvrx_eks.facts.job_names import JOB_POD_SELECTOR_KEYS
from nvrx_eks.jobs.validate.findings import document_id
from nvrx_eks.jobs.validate.rules.base import MISSING, PodSite, RuleBase, get
from workloads.numa import GPUS_PER_NUMA_ENV

#: ft_launcher's own NUMA binding (NVRx 0.7.0 fault_tolerance/launcher.py): numactl per rank.
NVRX_NUMA_ENV = "NVRX_GPUS_PER_NUMA"


class SecurityRules(RuleBase):
    """What a pod may do to its node, how restricted the job's pods are, who may reach them."""

    def _check_node_access(self, path: list, spec: dict, allowed_capabilities: frozenset[str]) -> None:
        """What no pod of this project may do to its node, whatever document it comes in."""
        for flag in ("hostNetwork", "hostPID", "hostIPC"):
            if spec.get(flag):
                self.error(path + [flag], "must not be set: the pod would share the node's namespace")
        for i, volume in enumerate(spec.get("volumes") or []):
            host_path = get(volume, ["hostPath", "path"])
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
                if get(container, ["securityContext", "privileged"]) is True:
                    self.error(
                        cpath + ["securityContext", "privileged"],
                        "must not be true: a privileged container owns the node",
                    )
                added = get(container, ["securityContext", "capabilities", "add"])
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

    def _check_restricted(self, site: PodSite) -> None:
        """The job's pods are as restricted as EFA allows (everything of Pod Security
        "restricted" but running as root)."""
        spec_path = site.path + ["spec"]
        if get(site.pod, ["spec", "automountServiceAccountToken"]) is not False:
            self.error(
                spec_path + ["automountServiceAccountToken"],
                "must be false: the trainer never calls the Kubernetes API, so the pod needs no token",
            )
        pod_seccomp = get(site.pod, ["spec", "securityContext", "seccompProfile", "type"])
        if site.container is None:
            return
        cpath = spec_path + ["containers", site.container_index]
        container_seccomp = get(site.container, ["securityContext", "seccompProfile", "type"])
        if pod_security.SECCOMP_PROFILE not in (pod_seccomp, container_seccomp):
            self.error(
                spec_path + ["securityContext", "seccompProfile", "type"],
                f"must be {pod_security.SECCOMP_PROFILE}: without it the container runs unconfined",
            )
        if get(site.container, ["securityContext", "allowPrivilegeEscalation"]) is not False:
            self.error(
                cpath + ["securityContext", "allowPrivilegeEscalation"],
                "must be false: no process in the container needs to gain privileges",
            )
        dropped = get(site.container, ["securityContext", "capabilities", "drop"])
        if not isinstance(dropped, list) or "ALL" not in dropped:
            self.error(
                cpath + ["securityContext", "capabilities", "drop"],
                "must include ALL: the container keeps only the capabilities it adds",
            )
        self._check_numa_binding(site, cpath, dropped)

    def _check_numa_binding(self, site: PodSite, cpath: list, dropped) -> None:
        """NVRx's own NUMA binding runs numactl, which the runtime's default seccomp profile stops
        without CAP_SYS_NICE (workloads/numa.py says why): no rank would start."""
        env = get(site.container, ["env"])
        for i, var in enumerate(env if isinstance(env, list) else []):
            if not (isinstance(var, dict) and var.get("name") == NVRX_NUMA_ENV):
                continue
            added = get(site.container, ["securityContext", "capabilities", "add"])
            has_sys_nice = isinstance(added, list) and any(
                str(c).upper().removeprefix("CAP_") == "SYS_NICE" for c in added
            )
            if isinstance(dropped, list) and "ALL" in dropped and not has_sys_nice:
                self.error(
                    cpath + ["env", i],
                    f"{NVRX_NUMA_ENV} makes ft_launcher start every rank under `numactl --membind`, "
                    f"which {pod_security.SECCOMP_PROFILE} seccomp refuses without CAP_SYS_NICE: no rank "
                    f"would start; set {GPUS_PER_NUMA_ENV} instead (the trainer binds its CPUs itself)",
                )

    def _check_network_policy(self, job: dict) -> None:
        """A NetworkPolicy selects the job's pods and admits only pods of the same job."""
        labels = get(job, ["metadata", "labels"])
        labels = labels if isinstance(labels, dict) else {}
        job_selector = {k: labels.get(k) for k in JOB_POD_SELECTOR_KEYS}

        def selects_job(selector) -> bool:
            match = get(selector, ["matchLabels"])
            return (
                isinstance(match, dict)
                and all(match.get(k) == v for k, v in job_selector.items())
                and get(selector, ["matchExpressions"]) in (MISSING, None, [])
            )

        policies = [
            d
            for d in self.documents
            if d.get("kind") == "NetworkPolicy"
            and get(d, ["metadata", "namespace"]) == get(job, ["metadata", "namespace"])
            and selects_job(get(d, ["spec", "podSelector"]))
        ]
        if not policies:
            self.error(
                ["metadata", "labels"],
                "no NetworkPolicy selects this job's pods: any pod in the cluster could reach their "
                "unauthenticated rendezvous and restart stores; render the NetworkPolicy with the job",
            )
            return
        for policy in policies:
            doc_id, self.doc_id = self.doc_id, document_id(policy)
            if "Ingress" not in (get(policy, ["spec", "policyTypes"]) or []):
                self.error(["spec", "policyTypes"], "must include Ingress, or the policy restricts nothing")
            for i, rule in enumerate(get(policy, ["spec", "ingress"]) or []):
                peers = get(rule, ["from"])
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

    def _check_security(self, site: PodSite) -> None:
        if site.container is None:
            return
        cpath = site.path + ["spec", "containers", site.container_index]
        added = get(site.container, ["securityContext", "capabilities", "add"])
        if not isinstance(added, list) or "IPC_LOCK" not in added:
            self.error(
                cpath + ["securityContext", "capabilities", "add"],
                "must include IPC_LOCK: EFA pins GPU and host memory for RDMA",
            )
