"""The last line of defence of a training job: a deadline after which Kubernetes ends it and
frees the GPU nodes, whatever state the trainer is in.

Every other layer relies on a process that still runs its own code: NVRx's restarts, the
launcher's timeouts, the exit-93 rule. A trainer stuck where none of them reaches (a rank hung in
interpreter shutdown, a launcher that never notices) would otherwise hold the nodes forever. A
deadline was chosen over a progress-based liveness probe because it depends on nothing inside the
pod: a probe has to read a progress file the trainer writes, so it fails in exactly the cases a
backstop exists for (a trainer that writes in the wrong place, a file system that hangs), and a
probe failure under restartPolicy Never only restarts the job.

The deadline is an upper bound of a run that finishes, so it never ends one:
  setup + steps x max step time
  + each in-process restart NVRx may make: its hard timeout + barrier timeout to regroup
    + one checkpoint interval replayed
  + each ft_launcher restart: setup again + one checkpoint interval replayed
  + (PyTorchJob only) each pod recreation, the same; a JobSet recreates its Jobs and each new
    Job starts its own deadline
  + the pod's termination grace period.
`max step time` defaults to the trainer's own step section timeout (a longer step is already a
fault), which gives a loose bound; `--max-step-time-s` with the measured step time (plus
margin) gives a tight one. The clock starts when the Job starts, which includes any time its pods
wait Pending for nodes: submit when the GPU nodes are up (submit warns when they are not), or
leave the bound loose.
"""

from __future__ import annotations

import math

from nvrx_eks.facts.errors import ConfigError
from workloads.config import TrainConfig

#: The longest deadline Kubernetes can keep: the Job controller turns activeDeadlineSeconds into
#: a Go time.Duration, int64 nanoseconds (about 292 years), and a longer one overflows there.
MAX_DEADLINE_S = (2**63 - 1) // 10**9


def max_step_time_s(train: TrainConfig, configured: float | None) -> float:
    return configured if configured is not None else train.fault_tolerance.section_timeouts_s.step


def active_deadline_s(train: TrainConfig, *, kubernetes_restarts: int, step_time_s: float | None = None) -> int:
    """`kubernetes_restarts`: pod recreations the deadline must cover (0 where each recreation
    gets a deadline of its own)."""
    step = max_step_time_s(train, step_time_s)
    setup = train.fault_tolerance.section_timeouts_s.setup
    replay = min(train.checkpoint.interval_steps, train.steps) * step
    ip = train.inprocess
    # An unbounded in-process restart loop is one of the things the deadline must end, so only
    # a bounded count earns time.
    inprocess = ip.max_restarts if ip.enabled and ip.max_restarts else 0
    relaunches = train.fault_tolerance.max_restarts + kubernetes_restarts
    total = (
        setup
        + train.steps * step
        + inprocess * (ip.hard_timeout_s + ip.barrier_timeout_s + replay)
        + relaunches * (setup + replay)
        + train.recommended_termination_grace_period_s()
    )
    return _deadline(total)


def minimum_deadline_s(train: TrainConfig) -> int:
    """Below this a job could not even finish starting (the setup section) and stop cleanly."""
    return _deadline(train.fault_tolerance.section_timeouts_s.setup + train.recommended_termination_grace_period_s())


def _deadline(total_s: float) -> int:
    """Whole seconds of a deadline that Kubernetes can keep. The trainer config bounds its times
    only from below, so `--set fault_tolerance.section_timeouts_s.step=inf` (or a huge `steps`)
    would otherwise reach here as infinity or as a number no Job can hold."""
    if not (math.isfinite(total_s) and total_s <= MAX_DEADLINE_S):
        raise ConfigError(
            f"the job's deadline (activeDeadlineSeconds) comes to {total_s:g} s, beyond the {MAX_DEADLINE_S} s "
            "Kubernetes can keep: lower steps, --max-step-time-s or fault_tolerance.section_timeouts_s "
            "(--set or --train-config)"
        )
    return math.ceil(total_s)
