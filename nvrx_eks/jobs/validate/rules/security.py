"""Pod security rules: Pod Security baseline for every pod (infra/pod_security.py, the same
controls the cluster's admission policy enforces), how restricted the job's own pods are, and the
NetworkPolicy that admits only the job's pods."""

from __future__ import annotations

from infra import pod_security
from nvrx_eks.facts.job_names import APP_INSTANCE_LABEL, JOB_POD_SELECTOR_KEYS
from nvrx_eks.jobs.validate.findings import document_id
from nvrx_eks.jobs.validate.rules.base import MISSING, PodSite, RuleBase, get, pod_specs
from workloads.numa import GPUS_PER_NUMA_ENV

#: ft_launcher's own NUMA binding (NVRx 0.7.0 fault_tolerance/launcher.py): numactl per rank.
NVRX_NUMA_ENV = "NVRX_GPUS_PER_NUMA"


class SecurityRules(RuleBase):
    """What a pod may do to its node, how restricted the job's pods are, who may reach them."""

    def _check_pod_security(self, doc: dict, spec_path: list, spec: dict, allowed_capabilities: frozenset[str]) -> None:
        """Pod Security baseline, with this project's exceptions (infra/pod_security.py), for a pod
        in whatever document it comes: every control the cluster's admission policy enforces."""
        # A PodSpec is the `spec` of a Pod or a PodTemplateSpec, whose metadata holds the labels
        # (the job a pod belongs to, which decides what of the claim it may write) and annotations.
        pod_path = spec_path[:-1]
        labels = get(doc, pod_path + ["metadata", "labels"])
        annotations = get(doc, pod_path + ["metadata", "annotations"])
        for problem in pod_security.pod_security_violations(
            spec,
            labels=labels if isinstance(labels, dict) else None,
            annotations=annotations if isinstance(annotations, dict) else None,
            allowed_capabilities=allowed_capabilities,
            allowed_host_paths=pod_security.HOST_PATH_ALLOW_LIST,
        ):
            self.error(pod_path + list(problem.path), problem.message)

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
        # The container's own profile, where it sets one, overrides the pod's.
        if container_seccomp is not MISSING and container_seccomp != pod_security.SECCOMP_PROFILE:
            self.error(
                cpath + ["securityContext", "seccompProfile", "type"],
                f"must be {pod_security.SECCOMP_PROFILE} (or unset, taking the pod's): the container's own "
                "profile overrides the pod's",
            )
        elif container_seccomp is MISSING and pod_seccomp != pod_security.SECCOMP_PROFILE:
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
        self._check_pod_labels(job, job_selector)

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

    def _check_pod_labels(self, job: dict, job_selector: dict) -> None:
        """Every pod of the job carries the labels its NetworkPolicy selects by, and its job label
        is the job's name. A pod labelled otherwise falls outside its own job's policy (open to the
        namespace, or inside another job's), and the admission policy would let it write the run
        directory its label names (infra/pod_security.py), not its own."""
        name = get(job, ["metadata", "name"])
        instance = job_selector.get(APP_INSTANCE_LABEL)
        if instance != name:
            self.error(
                ["metadata", "labels", APP_INSTANCE_LABEL],
                ("missing" if instance is None else f"is {instance!r}")
                + f", but the job is named {name!r}: its pods are told apart, and write their run directory, "
                f"by this label; set it to {name!r}",
            )
        for spec_path, _ in pod_specs(job):
            template_labels = get(job, [*spec_path[:-1], "metadata", "labels"])
            template_labels = template_labels if isinstance(template_labels, dict) else {}
            for key, value in job_selector.items():
                if value is not None and template_labels.get(key) != value:
                    self.error(
                        [*spec_path[:-1], "metadata", "labels", key],
                        ("missing" if key not in template_labels else f"is {template_labels[key]!r}")
                        + f", but the job's NetworkPolicy selects its pods by {key}={value}: this pod would fall "
                        f"outside it (reachable from any pod, or inside another job's policy); set it to {value!r}",
                    )

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
