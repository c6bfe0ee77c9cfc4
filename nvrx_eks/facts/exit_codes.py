"""Process exit codes of the trainer and the operator commands, stated once.

EXIT_DO_NOT_REQUEUE (93) is the code NVRx's ft_launcher itself uses for "NVRx decided the job must
not be restarted" (nvidia_resiliency_ext.fault_tolerance.utils.DEFAULT_NO_RESTART_EXIT_CODE). The
trainer exits with it for errors that no restart can fix: an invalid TrainConfig, a checkpoint
from another world size or model preset, a fault spec naming a rank that does not exist, a
checkpoint.dir that is read-only, not writable or full, no committed checkpoint that loads. Kubernetes
failure policies match on it to fail the job instead of recreating pods.

How it reaches the scheduler: `python -m workloads.train --preflight` runs before ft_launcher in the
container command and exits 93 itself for everything that can be checked before ranks start. A rank
that hits such an error later exits 93 too. ft_launcher restarts ranks whatever code they exit
with, so the rank first records its decision for the job attempt and asks ft_launcher to shut the
workload down; the launcher's wrapper (container entrypoint, `nvrx-eks local`) exits 93 on finding
the record (workloads.do_not_requeue). A record the run dir refuses (read-only, full) goes to a
directory of the rank's own node that its wrapper also reads (the pod's /dev/shm). Without any
record it is restarted like any failure, until ft_launcher's restarts or its no-progress limit
(`fault_tolerance.max_no_progress_cycles`) run out.
"""

EXIT_DO_NOT_REQUEUE = 93

# A mistake the user can fix (a config field, an option, a missing checkout): the operator
# commands (`nvrx-eks`, the CDK app, the GPU smoke test) print one message naming it and exit
# with this, the code argparse and Click use for usage errors, never with a traceback.
EXIT_CONFIG_ERROR = 2

# 128 + SIGTERM: the trainer stopped because it was asked to (eviction, preemption, kubectl delete)
# after finishing or abandoning its in-flight checkpoint. Non-zero on purpose: the run is not done,
# so neither ft_launcher nor the Kubernetes job may record it as a success.
EXIT_TERMINATED = 143

# The longest a rank takes to exit once it has decided to (an error no restart can fix, the end
# of the run, a honoured SIGTERM): a watchdog in the trainer (workloads.train.arm_exit_watchdog)
# enforces it, so a way out that blocks (a barrier with a dead peer, a checkpoint worker that
# ignores SIGTERM) still ends with the intended exit code. Checked against the config's grace
# periods by workloads.train.exit_bound_s.
EXIT_BOUND_S = 60.0
