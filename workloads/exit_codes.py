"""Process exit codes of the trainer, stated once.

EXIT_DO_NOT_REQUEUE (93) is the code NVRx's ft_launcher itself uses for "NVRx decided the job must
not be restarted" (nvidia_resiliency_ext.fault_tolerance.utils.DEFAULT_NO_RESTART_EXIT_CODE). The
trainer exits with it for errors that no restart can fix: an invalid TrainConfig, a checkpoint
from another world size or model preset, a fault spec naming a rank that does not exist, a
checkpoint.dir that is read-only, not writable or full, no committed checkpoint that loads. Kubernetes
failure policies match on it to fail the job instead of recreating pods.

How it reaches the scheduler: `python -m workloads.train --preflight` runs before ft_launcher in the
container command and exits 93 itself for everything that can be checked before ranks start. A rank
that hits such an error later exits 93; ft_launcher restarts ranks on any failure, but its progress
tracker (fed by the checkpoint's committed-step file, see launch.py) stops after
`fault_tolerance.max_no_progress_cycles` restarts without progress and then exits 93 as well.
"""

EXIT_DO_NOT_REQUEUE = 93

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
