"""The trainer's metrics for CloudWatch: embedded metric format (EMF) documents sent as UDP
datagrams to the node's CloudWatch agent (the transport, the names and units:
nvrx_eks/facts/training_metrics.py). Stdlib only.

An EMF document is one JSON object: the metric values and dimension values as top-level fields,
and under `_aws` the timestamp (ms since the epoch), the log group, and which fields are metrics
(with their units) in which namespace under which dimension sets. The agent passes it to CloudWatch
Logs, which extracts the metrics ("Specification: Embedded metric format", CloudWatch User Guide).
"""

from __future__ import annotations

import json
import logging
import os
import socket
import time
from typing import Any
from urllib.parse import urlparse

from nvrx_eks.facts.training_metrics import NAMESPACE

log = logging.getLogger("workloads.train")

#: Set in every pod by the kubelet: where an unset `metrics.cloudwatch` sends.
KUBERNETES_ENV = "KUBERNETES_SERVICE_HOST"


def cloudwatch_wanted(setting: bool | None) -> bool:
    """metrics.cloudwatch, or when unset: inside a Kubernetes pod (where the add-on's agent runs)."""
    return setting if setting is not None else KUBERNETES_ENV in os.environ


def emf_document(
    metrics: dict[str, float],
    units: dict[str, str],
    dimensions: dict[str, str],
    properties: dict[str, Any] | None = None,
    timestamp_ms: int | None = None,
    *,
    log_group: str,
) -> dict[str, Any]:
    """One EMF document: `metrics` (name -> value, each with its unit in `units`) under one
    dimension set, plus `properties`, fields kept in the log event but not made metrics, for the
    agent to write to `log_group`."""
    return {
        **dimensions,
        **(properties or {}),
        "_aws": {
            "Timestamp": timestamp_ms if timestamp_ms is not None else int(time.time() * 1000),
            "LogGroupName": log_group,
            "CloudWatchMetrics": [
                {
                    "Dimensions": [list(dimensions)],
                    "Metrics": [{"Name": name, "Unit": units[name]} for name in metrics],
                    "Namespace": NAMESPACE,
                }
            ],
        },
        **metrics,
    }


class EmfSender:
    """Sends EMF documents to the agent, one newline-terminated datagram each. Never blocks and
    never raises: metrics must not stop training. The agent's name is resolved once; a name that
    does not resolve (no add-on) turns the sender off with one warning."""

    def __init__(self, endpoint: str):
        parsed = urlparse(endpoint)
        self.address: tuple[str, int] | None = None
        self.warned = False
        try:
            family, _, _, _, address = socket.getaddrinfo(parsed.hostname, parsed.port, type=socket.SOCK_DGRAM)[0]
        except OSError as err:
            log.warning("CloudWatch metrics off: %s does not resolve (%s)", endpoint, err)
            return
        self.socket = socket.socket(family, socket.SOCK_DGRAM)
        self.socket.setblocking(False)
        self.address = (str(address[0]), int(address[1]))

    def send(self, document: dict[str, Any]) -> None:
        if self.address is None:
            return
        try:
            self.socket.sendto((json.dumps(document, separators=(",", ":")) + "\n").encode(), self.address)
        except OSError as err:
            if not self.warned:
                log.warning("CloudWatch metrics: a datagram to %s failed (%s); dropping such", self.address, err)
                self.warned = True

    def close(self) -> None:
        if self.address is not None:
            self.socket.close()
            self.address = None
