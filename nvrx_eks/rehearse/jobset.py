"""What the Job and JobSet controllers do when a pod of a rehearsed JobSet ends, read from the
rendered JobSet itself (never restated here):

- a pod's exit code matching the Job's podFailurePolicy `FailJob` rule (93) fails its Job at once
  (reason PodFailurePolicy);
- with `backoffLimitPerIndex`, a failed pod fails only its index (no replacement pod) and the
  Job fails once more than `maxFailedIndexes` indexes failed; else a failure beyond
  `backoffLimit` fails the Job (BackoffLimitExceeded);
- the Job succeeds when `successPolicy.succeededCount` indexes succeeded (the other pods are then
  deleted), else when every index succeeded;
- a failed Job makes the JobSet apply the first `failurePolicy.rules` entry whose
  `onJobFailureReasons` lists the reason: FailJobSet ends it; otherwise the JobSet restarts
  (recreates every pod) while fewer than `failurePolicy.maxRestarts` restarts were made.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

REASON_POD_FAILURE_POLICY = "PodFailurePolicy"
REASON_BACKOFF_LIMIT = "BackoffLimitExceeded"
REASON_FAILED_INDEXES = "FailedIndexes"


@dataclass
class JobState:
    """One attempt of the JobSet's single replicated Job."""

    spec: dict[str, Any]  # the replicated Job's template spec
    succeeded: set[int] = field(default_factory=set)
    failed: set[int] = field(default_factory=set)
    failure_reason: str | None = None

    @property
    def completions(self) -> int:
        return int(self.spec.get("completions", self.spec.get("parallelism", 1)))

    def _fails_job(self, exit_code: int) -> bool:
        for rule in (self.spec.get("podFailurePolicy") or {}).get("rules") or []:
            codes = rule.get("onExitCodes") or {}
            if (
                rule.get("action") == "FailJob"
                and codes.get("operator") == "In"
                and exit_code in codes.get("values", [])
            ):
                return True
        return False

    def pod_ended(self, index: int, exit_code: int) -> None:
        if exit_code == 0:
            self.succeeded.add(index)
            return
        self.failed.add(index)
        if self._fails_job(exit_code):
            self.failure_reason = REASON_POD_FAILURE_POLICY
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


def jobset_action(jobset_spec: dict[str, Any], reason: str, restarts_done: int) -> str:
    """ "fail" or "restart": the JobSet's answer to its Job failing for `reason`."""
    policy = jobset_spec.get("failurePolicy") or {}
    for rule in policy.get("rules") or []:
        if reason in (rule.get("onJobFailureReasons") or [reason]):
            action = rule.get("action")
            if action == "FailJobSet":
                return "fail"
            if action in ("RestartJobSetAndIgnoreMaxRestarts",):
                return "restart"
            break
    return "restart" if restarts_done < int(policy.get("maxRestarts", 0)) else "fail"
