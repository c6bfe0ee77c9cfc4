"""What the Job and JobSet controllers do when a pod of a rehearsed JobSet ends, read from the
rendered JobSet itself (never restated here):

- a pod whose exit code (93) or condition (DisruptionTarget: a pod the cluster stopped) matches
  one of the Job's podFailurePolicy `FailJob` rules fails its Job at once (reason
  PodFailurePolicy, with the Job controller's message for that rule);
- with `backoffLimitPerIndex`, a failed pod fails only its index (no replacement pod) and the
  Job fails once more than `maxFailedIndexes` indexes failed; else a failure beyond
  `backoffLimit` fails the Job (BackoffLimitExceeded);
- the Job succeeds when `successPolicy.succeededCount` indexes succeeded (the other pods are then
  deleted), else when every index succeeded;
- a failed Job makes the JobSet apply the first `failurePolicy.rules` entry whose
  `onJobFailureReasons` lists the reason and whose `onJobFailureMessagePatterns`, if any, match
  the message: FailJobSet ends it; RestartJobSetAndIgnoreMaxRestarts recreates every pod without
  counting; otherwise the JobSet restarts (recreates every pod) while fewer than
  `failurePolicy.maxRestarts` counted restarts were made.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from nvrx_eks.facts import job_kinds
from nvrx_eks.facts.names import TRAINING_NAMESPACE as NAMESPACE

REASON_POD_FAILURE_POLICY = "PodFailurePolicy"
REASON_BACKOFF_LIMIT = "BackoffLimitExceeded"
REASON_FAILED_INDEXES = "FailedIndexes"
DISRUPTION_TARGET = "DisruptionTarget"


@dataclass
class JobState:
    """One attempt of the JobSet's single replicated Job."""

    spec: dict[str, Any]  # the replicated Job's template spec
    succeeded: set[int] = field(default_factory=set)
    failed: set[int] = field(default_factory=set)
    failure_reason: str | None = None
    failure_message: str = ""

    @property
    def completions(self) -> int:
        return int(self.spec.get("completions", self.spec.get("parallelism", 1)))

    def _fail_job_message(self, exit_code: int, disrupted: bool, pod: str) -> str | None:
        """The Job controller's message when a FailJob rule matches the ended pod, else None."""
        container = self.spec["template"]["spec"]["containers"][0]["name"]
        for index, rule in enumerate((self.spec.get("podFailurePolicy") or {}).get("rules") or []):
            if rule.get("action") != "FailJob":
                continue
            codes = rule.get("onExitCodes") or {}
            if codes.get("operator") == "In" and exit_code in codes.get("values", []):
                return job_kinds.FAIL_JOB_EXIT_CODE_MESSAGE.format(
                    container=container, namespace=NAMESPACE, pod=pod, code=exit_code, index=index
                )
            conditions = {c.get("type") for c in rule.get("onPodConditions") or []}
            if disrupted and DISRUPTION_TARGET in conditions:
                return job_kinds.FAIL_JOB_POD_CONDITION_MESSAGE.format(
                    namespace=NAMESPACE, pod=pod, condition=DISRUPTION_TARGET, index=index
                )
        return None

    def pod_ended(self, index: int, exit_code: int, *, disrupted: bool = False, pod: str = "") -> None:
        """Pod `index` ended with `exit_code`; `disrupted`: the cluster stopped it (an eviction,
        a preemption, a drain), which gives the pod the DisruptionTarget condition."""
        if exit_code == 0:
            self.succeeded.add(index)
            return
        self.failed.add(index)
        message = self._fail_job_message(exit_code, disrupted, pod or f"pod-{index}")
        if message is not None:
            self.failure_reason, self.failure_message = REASON_POD_FAILURE_POLICY, message
        elif self.spec.get("backoffLimitPerIndex") is not None:
            if len(self.failed) > int(self.spec.get("maxFailedIndexes", 0)):
                self.failure_reason = REASON_FAILED_INDEXES
        elif len(self.failed) > int(self.spec.get("backoffLimit", 6)):
            self.failure_reason = REASON_BACKOFF_LIMIT

    @property
    def succeeded_job(self) -> bool:
        needed = (self.spec.get("successPolicy") or {}).get("rules")
        count = next((r.get("succeededCount") for r in needed or [] if r.get("succeededCount")), None)
        return len(self.succeeded) >= (count or self.completions)


def jobset_action(jobset_spec: dict[str, Any], reason: str, counted_restarts: int, message: str = "") -> str:
    """ "fail", "restart" (counted against maxRestarts) or "restart-uncounted": the JobSet's
    answer to its Job failing for `reason` with `message`."""
    policy = jobset_spec.get("failurePolicy") or {}
    for rule in policy.get("rules") or []:
        patterns = rule.get("onJobFailureMessagePatterns") or []
        if reason in (rule.get("onJobFailureReasons") or [reason]) and (
            not patterns or any(re.search(p, message) for p in patterns)
        ):
            action = rule.get("action")
            if action == "FailJobSet":
                return "fail"
            if action == "RestartJobSetAndIgnoreMaxRestarts":
                return "restart-uncounted"
            break
    return "restart" if counted_restarts < int(policy.get("maxRestarts", 0)) else "fail"
