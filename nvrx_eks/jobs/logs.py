"""`nvrx-eks logs`: the job's pod logs, every node prefixed `nodeN |`, one node's, or one rank's lines;
and the last metrics a job logged: rank 0's latest `step N loss ...` and `eval step N loss ...`
lines (nvrx_eks.facts.training_metrics.METRICS_LINE) in node 0's pod log, which `status NAME`
reads from the end of that log and `logs NAME --follow` repeats when the stream ends."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator

from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import HTTPError as Urllib3Error

from nvrx_eks.facts import job_names
from nvrx_eks.facts.errors import ConfigError
from nvrx_eks.facts.training_metrics import EVENT_LINE, METRICS_LINE
from nvrx_eks.jobs.client import JobClient, api_error
from nvrx_eks.jobs.status import gpus_per_pod, node_rank
from workloads.events import SHARED_LINE_STARTS

#: How far back `status` searches: log_every steps apart, rank 0's lines are among the last few
#: hundred even with every rank's warnings interleaved.
TAIL_LINES = 2000


def stream_logs(
    client: JobClient,
    name: str,
    *,
    node: int | None = None,
    rank: int | None = None,
    follow: bool = False,
    tail_lines: int | None = None,
    events: bool = False,
    write: Callable[[str], None] | None = None,
) -> int:
    """Print the pods' logs (prefixed `nodeN |`), or one node's, or one rank's lines, or with
    `events` only the trainer's event lines (faults, restarts, checkpoint commits, the run's
    end); returns the number of lines written."""
    kind, _ = client.find(name)
    pods = client.pods(kind, name)
    if not pods:
        raise ConfigError(f"{kind.kind} {name} has no pods yet; see `nvrx-eks status {name}`")
    filters: list[Callable[[str], bool]] = []
    if rank is not None:
        # The trainer tags its log lines `[rankN]`; ranks of one node share a pod.
        node = rank // gpus_per_pod(pods[0])
        tag = f"[rank{rank}]"
        filters.append(lambda line: tag in line)
    if events:
        filters.append(EventLineFilter())

    if node is not None:
        selected = [p for p in pods if node_rank(p) == node]
        if not selected:
            raise ConfigError(f"--node/--rank: node {node} does not exist; the job has {len(pods)} pods")
        pods = selected
    write = write or (lambda line: client.console.print(line, markup=False, highlight=False, soft_wrap=True))
    latest = LastMetrics()  # rank 0's, repeated when a follow ends
    lock = threading.Lock()
    count = 0

    def pump(pod: k8s.V1Pod) -> None:
        nonlocal count
        prefix = f"node{node_rank(pod)} | " if len(pods) > 1 else ""
        for line in _log_lines(client, pod, follow=follow, tail_lines=tail_lines):
            if node_rank(pod) == 0:
                latest.see(line)
            with lock:  # the event filter remembers what any pod's lines showed
                if all(keep(line) for keep in filters):
                    write(prefix + line)
                    count += 1

    if follow and len(pods) > 1:
        threads = [threading.Thread(target=pump, args=(p,), daemon=True) for p in pods]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    else:
        for pod in pods:
            pump(pod)
    for line in latest.lines() if follow else []:
        write(f"last metrics | {line}")
    return count


class EventLineFilter:
    """Keeps the trainer's event lines (nvrx_eks.facts.training_metrics.EVENT_LINE); of the lines
    several ranks log for one happening (a node-loss on each rank of its node), only the first."""

    def __init__(self) -> None:
        self._shown: set[str] = set()

    def __call__(self, line: str) -> bool:
        found = EVENT_LINE.search(line)
        if found is None:
            return False
        text = found["text"].strip()
        if text.startswith(SHARED_LINE_STARTS):
            if text in self._shown:
                return False
            self._shown.add(text)
        return True


def _log_lines(client: JobClient, pod: k8s.V1Pod, *, follow: bool, tail_lines: int | None) -> Iterator[str]:
    container = pod.spec.containers[0].name if pod.spec and pod.spec.containers else job_names.TRAINER_CONTAINER
    try:
        response = client.core.read_namespaced_pod_log(
            pod.metadata.name,
            client.namespace,
            container=container,
            follow=follow,
            tail_lines=tail_lines,
            _preload_content=False,
        )
    except (ApiException, Urllib3Error) as e:
        raise api_error(e, f"reading the log of {pod.metadata.name}") from None
    buffered = b""
    try:
        for chunk in response.stream(4096):
            buffered += chunk
            *lines, buffered = buffered.split(b"\n")
            for line in lines:
                yield line.decode(errors="replace")
        if buffered:
            yield buffered.decode(errors="replace")
    finally:
        response.release_conn()


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
