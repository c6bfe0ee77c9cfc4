"""Layer 3, the project rules: what makes the job correct for this deployment (world size = nodes x
processes, GPU/EFA requests = the instance facts, one rendezvous host, the exit-93 rule, timeouts
consistent with the trainer config, image set, PVC = the stack's claim, /dev/shm, IPC_LOCK, GPU
node selection, a deadline that frees the nodes, a NetworkPolicy admitting only the job's own
pods) and pod security (every pod template anywhere in the documents passes Pod Security
baseline with the exceptions infra/pod_security.py allows: the capabilities the pod needs, the
reviewed hostPath allow-list, each allowed host directory mounted by a subdirectory; the job's
own pods must also be as restricted as rendered).

One rule set per concern (pods, security, policy, entrypoint, training); ProjectRules joins them.
"""

from __future__ import annotations

from infra import pod_security
from nvrx_eks.facts import job_names
from nvrx_eks.facts.job_kinds import CUSTOM_KINDS
from nvrx_eks.jobs.validate.findings import Finding, document_id
from nvrx_eks.jobs.validate.rules.base import get, pod_specs
from nvrx_eks.jobs.validate.rules.training import TrainingRules


class ProjectRules(TrainingRules):
    """Every project rule, over one set of documents."""

    def run(self) -> list[Finding]:
        jobs = [d for d in self.documents if (d.get("apiVersion"), d.get("kind")) in CUSTOM_KINDS]
        for doc in self.documents:
            self.doc_id = document_id(doc)
            namespace = get(doc, ["metadata", "namespace"])
            if namespace != self.expected.namespace:
                self.error(
                    ["metadata", "namespace"],
                    f"is {namespace!r}; the training namespace of this deployment is {self.expected.namespace!r}",
                )
        if not jobs:
            self.doc_id = "(manifests)"
            self.error([], "no JobSet or PyTorchJob among the documents")
        for doc in self.documents:
            self.doc_id = document_id(doc)
            fabric_test = get(doc, ["metadata", "labels", job_names.APP_NAME_LABEL]) == job_names.FABRIC_TEST_APP
            allowed = frozenset(
                pod_security.FABRIC_TEST_CAPABILITIES if fabric_test else pod_security.TRAINER_CAPABILITIES
            )
            for path, pod_spec in pod_specs(doc):
                self._check_pod_security(doc, path, pod_spec, allowed)
        for job in jobs:
            self.doc_id = document_id(job)
            if get(job, ["metadata", "labels", job_names.APP_NAME_LABEL]) == job_names.FABRIC_TEST_APP:
                self._check_fabric_test(job)
            else:
                self._check_training_job(job)
            self._check_network_policy(job)
        return self.findings

    def _check_fabric_test(self, job: dict) -> None:
        sites = self._pod_sites(job, job_names.FABRIC_TEST_CONTAINER)
        for site in sites:
            facts = self._instance_facts(site)
            self._check_scheduling(site)
            self._check_image(site, restarted=False)
            self._check_security(site)
            self._check_restricted(site)
            self._check_volumes(site, needs_config=False)
            if facts is not None:
                self._check_resources(site, facts)
