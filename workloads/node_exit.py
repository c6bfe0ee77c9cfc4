"""Taking this rank's node out of the job: SIGKILL its launcher, every process the launcher
started, then this rank. No torch.

Two callers: the `node-loss` fault, which simulates a node lost whole, and a rank that found its
node unfit to train (workloads.nonfinite: its loss non-finite while its peers' is not). What
follows is what follows a lost node, at whichever layer has a replacement:
- with spare nodes, a spare takes the node's ranks in process (workloads.spares);
- without, the node's pod fails: its entrypoint sees ft_launcher killed and exits 137, which no
  rule of the JobSet's failure policy matches but its default, RestartJobSet (counted against
  maxRestarts; 93 alone fails the JobSet): every pod is recreated and the ranks resume from the
  newest committed checkpoint. `nvrx-eks local` does the same (its launch_lost and relaunch).

Why a kill and not a SIGTERM to the launcher: SIGTERM is the stop-with-a-checkpoint path, and
after a non-finite step every rank's state is already damaged (the reduce-scatter spread the
faulty rank's gradients before the step's result was known): nothing of it may be saved.
"""

from __future__ import annotations

import os
import signal


def leave_with_node() -> None:
    """SIGKILL this rank's launcher (its parent), everything the launcher started, then itself.
    The launcher goes first so that it cannot restart the workers it sees dying."""
    import psutil

    launcher = psutil.Process(os.getppid())
    others = [p for p in launcher.children(recursive=True) if p.pid != os.getpid()]
    for proc in (launcher, *others):
        try:
            proc.kill()
        except psutil.NoSuchProcess:
            continue
    os.kill(os.getpid(), signal.SIGKILL)
