"""Rules for how the job fails and ends: node count and completion mode, the exit-93 rule and the
restart policies around it, hot spares, and the deadline backstop."""

from __future__ import annotations

import re

from nvrx_eks.facts import job_kinds
from nvrx_eks.facts.exit_codes import EXIT_DO_NOT_REQUEUE
from nvrx_eks.jobs.backstop import minimum_deadline_s
from nvrx_eks.jobs.validate.rules.base import MISSING, PodSite, RuleBase, get, node_replicated_jobs
from workloads.config import TrainConfig


class PolicyRules(RuleBase):
    """How the job fails, restarts and ends."""

    def _node_count(self, job: dict, sites: list[PodSite]) -> int | None:
        if job["kind"] == "JobSet":
            total = 0
            for i, rj in node_replicated_jobs(job):
                base = ["spec", "replicatedJobs", i]
                replicas = get(rj, ["replicas"])
                parallelism = get(rj, ["template", "spec", "parallelism"])
                completions = get(rj, ["template", "spec", "completions"])
                if replicas not in (1, MISSING):
                    self.error(base + ["replicas"], "must be 1: one Indexed Job holds all nodes")
                if not isinstance(parallelism, int):
                    self.error(base + ["template", "spec", "parallelism"], "must be the node count (an integer)")
                    return None
                if completions != parallelism:
                    self.error(
                        base + ["template", "spec", "completions"],
                        f"is {completions}, must equal parallelism ({parallelism}): every node runs until the end",
                    )
                if get(rj, ["template", "spec", "completionMode"]) != "Indexed":
                    self.error(
                        base + ["template", "spec", "completionMode"],
                        "must be Indexed: pod host names (and the rendezvous name) come from the index",
                    )
                total += parallelism
            return total
        specs = get(job, ["spec", "pytorchReplicaSpecs"]) or {}
        total = 0
        for rtype, rs in specs.items():
            replicas = get(rs, ["replicas"])
            if not isinstance(replicas, int):
                self.error(["spec", "pytorchReplicaSpecs", rtype, "replicas"], "must be an integer")
                return None
            if rtype == "Master" and replicas != 1:
                self.error(["spec", "pytorchReplicaSpecs", rtype, "replicas"], "must be 1 (the rendezvous host)")
            total += replicas
        if "Master" not in specs:
            self.error(["spec", "pytorchReplicaSpecs", "Master"], "missing: node 0 (the rendezvous host) is the Master")
        return total

    def _check_failure_policy(self, job: dict, sites: list[PodSite], spares: int = 0) -> None:
        code = EXIT_DO_NOT_REQUEUE
        if job["kind"] == "JobSet":
            rules = get(job, ["spec", "failurePolicy", "rules"])
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
                        and _matches_exit_code_failure(r.get("onJobFailureMessagePatterns"), code)
                    ):
                        self.error(
                            ["spec", "failurePolicy", "rules", i],
                            f"matches PodFailurePolicy failures before the exit-{code} rule and restarts them",
                        )
            if not isinstance(get(job, ["spec", "failurePolicy", "maxRestarts"]), int):
                self.error(["spec", "failurePolicy", "maxRestarts"], "missing: other failures would never be restarted")
            for k, (i, rj) in enumerate(node_replicated_jobs(job)):
                base = ["spec", "replicatedJobs", i, "template", "spec"]
                site = sites[k] if k < len(sites) else None
                container = site.container.get("name") if site and site.container else None
                pfp = get(rj, ["template", "spec", "podFailurePolicy", "rules"])
                has_rule = isinstance(pfp, list) and any(
                    isinstance(r, dict)
                    and r.get("action") == "FailJob"
                    and get(r, ["onExitCodes", "operator"]) == "In"
                    and code in (get(r, ["onExitCodes", "values"]) or [])
                    and get(r, ["onExitCodes", "containerName"]) in (MISSING, None, container)
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
                elif get(rj, ["template", "spec", "backoffLimit"]) != 0:
                    self.error(
                        base + ["backoffLimit"],
                        "must be 0: one failed pod must fail the Job so the JobSet restarts all ranks together",
                    )
                restart_policy = get(rj, ["template", "spec", "template", "spec", "restartPolicy"])
                if restart_policy != "Never":
                    self.error(
                        base + ["template", "spec", "restartPolicy"],
                        "must be Never: pod failure policies need it, and a container restarted in place would "
                        "rejoin a rendezvous the others left",
                    )
        else:
            for rtype, rs in (get(job, ["spec", "pytorchReplicaSpecs"]) or {}).items():
                if get(rs, ["restartPolicy"]) != "ExitCode":
                    self.error(
                        ["spec", "pytorchReplicaSpecs", rtype, "restartPolicy"],
                        f"must be ExitCode: only then does exit {code} fail the job while other exits are retried",
                    )
            if not isinstance(get(job, ["spec", "runPolicy", "backoffLimit"]), int):
                self.error(["spec", "runPolicy", "backoffLimit"], "missing: retries would be unbounded")

    def _check_spare_policy(self, rj: dict, base: list, spares: int) -> None:
        """With hot spares, a pod failure while spares remain must leave the surviving pods running
        (a spare replaces the lost node in process) and must not start a replacement pod (its
        launcher would re-enter the rendezvous and restart every node); one more failure than
        there are spares must fail the Job, so that the JobSet recreates every pod."""
        spec = get(rj, ["template", "spec"])
        if get(spec, ["backoffLimitPerIndex"]) != 0:
            self.error(
                base + ["backoffLimitPerIndex"],
                f"must be 0 with {spares} spare node(s): a failed pod fails only its index, which is not retried, "
                "so the surviving pods are not recreated",
            )
        if get(spec, ["maxFailedIndexes"]) != spares:
            self.error(
                base + ["maxFailedIndexes"],
                f"must be {spares} (the spare nodes): one failure more than there are spares must fail the Job "
                "so the JobSet restarts every pod",
            )
        if get(spec, ["backoffLimit"]) == 0:
            self.error(base + ["backoffLimit"], "must not be 0 with spare nodes: one failed pod would fail the Job")
        parallelism = get(spec, ["parallelism"])
        rules = get(spec, ["successPolicy", "rules"])
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
                for i in range(len(get(job, ["spec", "replicatedJobs"]) or []))
            ]
        else:
            places = [["spec", "runPolicy", "activeDeadlineSeconds"]]
        for path in places:
            value = get(job, path)
            if not isinstance(value, int) or isinstance(value, bool):
                self.error(path, "missing: a trainer hung where no restart reaches it would hold the nodes forever")
            elif value < floor:
                self.error(
                    path,
                    f"is {value} s, below the {floor} s the trainer config needs to start and stop (setup section "
                    "timeout + termination grace); the job would be killed before training",
                )
        if job["kind"] == "JobSet":
            rules = get(job, ["spec", "failurePolicy", "rules"])
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


def _matches_exit_code_failure(patterns: object, code: int) -> bool:
    """Whether a JobSet rule with these onJobFailureMessagePatterns (none: every message) matches
    the Job controller's message for a pod that exited `code` (RE2 patterns, read with Python's
    re: the same for the literal patterns a rule needs; one re cannot read counts as a match)."""
    if not patterns or not isinstance(patterns, list):
        return True
    message = job_kinds.FAIL_JOB_EXIT_CODE_MESSAGE.format(
        container="trainer", namespace="training", pod="train-worker-0-0", code=code, index=0
    )
    for pattern in patterns:
        try:
            if re.search(str(pattern), message):
                return True
        except re.error:
            return True
    return False
