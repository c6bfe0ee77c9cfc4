"""The last metrics a training job logged: rank 0's latest `step N loss ...` and `eval step N
loss ...` lines (nvrx_eks.facts.training_metrics.METRICS_LINE) in node 0's pod log. `status NAME`
reads them from the end of that log; `logs NAME --follow` keeps them as the lines go by and
repeats them when the stream ends."""

from __future__ import annotations

from nvrx_eks.facts.training_metrics import METRICS_LINE
from nvrx_eks.jobs.client import JobClient
from nvrx_eks.jobs.logs import _log_lines
from nvrx_eks.jobs.status import node_rank

#: How far back `status` searches: log_every steps apart, rank 0's lines are among the last few
#: hundred even with every rank's warnings interleaved.
TAIL_LINES = 2000


class LastMetrics:
    """The latest training-metrics line and the latest evaluation line of the lines seen."""

    def __init__(self) -> None:
        self._latest: dict[str, str] = {}

    def see(self, line: str) -> None:
        found = METRICS_LINE.search(line)
        if found:
            self._latest["eval" if found["eval"] else "train"] = line.strip()

    def lines(self) -> list[str]:
        return [self._latest[kind] for kind in ("train", "eval") if kind in self._latest]


def last_metrics(client: JobClient, name: str) -> list[str]:
    """From the end of node 0's log (rank 0 runs there), if the job has pods."""
    kind, _ = client.find(name)
    pods = [p for p in client.pods(kind, name) if node_rank(p) == 0]
    latest = LastMetrics()
    for pod in pods[:1]:
        for line in _log_lines(client, pod, follow=False, tail_lines=TAIL_LINES):
            latest.see(line)
    return latest.lines()
