"""Rules for the trainer entrypoint: one rendezvous host and port, ft_launcher and the preflight
exactly as the trainer config builds them, and a grace period long enough to stop."""

from __future__ import annotations

import re
import shlex

from nvrx_eks.facts.instances import InstanceFacts
from nvrx_eks.facts.job_names import RENDEZVOUS_PORT
from nvrx_eks.jobs.spec import TRAIN_CONFIG_PATH
from nvrx_eks.jobs.validate.rules.base import MISSING, PodSite, RuleBase, get
from workloads.config import TrainConfig
from workloads.launch import build_ft_launcher_argv, build_preflight_argv


class EntrypointRules(RuleBase):
    """The trainer container's entrypoint script against the trainer config."""

    def _check_entrypoint(
        self,
        site: PodSite,
        train: TrainConfig | None,
        nodes: int | None,
        facts: InstanceFacts,
        world_size: int | None,
        expected_host: str,
        name: str,
    ) -> None:
        if site.container is None:
            return
        cpath = site.path + ["spec", "containers", site.container_index]
        if "command" in site.container:
            self.error(
                cpath + ["command"],
                "must not be set: it replaces the image's tini entrypoint, which reaps NVRx's detached "
                "monitor processes and passes SIGTERM to ft_launcher; put the entrypoint in args",
            )
        args = site.container.get("args")
        if not (isinstance(args, list) and len(args) == 3 and args[:2] == ["/bin/sh", "-c"]):
            self.error(cpath + ["args"], "must be [/bin/sh, -c, <entrypoint>] as rendered")
            return
        script_path = cpath + ["args", 2]
        launcher, preflight, dns_host = _parse_entrypoint(str(args[2]))
        if launcher is None:
            self.error(script_path, "no ft_launcher command in the entrypoint")
            return
        flags = _flags(launcher)
        endpoint = flags.get("--rdzv-endpoint")
        host, _, port = (endpoint or "").rpartition(":")
        if host != expected_host:
            self.error(
                script_path,
                f"--rdzv-endpoint host is {host or endpoint!r}; every node must rendezvous at pod 0's stable "
                f"DNS name {expected_host!r}",
            )
        elif port != str(RENDEZVOUS_PORT):
            self.error(script_path, f"--rdzv-endpoint port is {port!r}; the rendezvous port is {RENDEZVOUS_PORT}")
        if dns_host is not None and dns_host != expected_host:
            self.error(script_path, f"waits for DNS name {dns_host!r} instead of the rendezvous host {expected_host!r}")
        if nodes is not None and flags.get("--nnodes") != str(nodes):
            self.error(script_path, f"ft_launcher --nnodes is {flags.get('--nnodes')}, but the job has {nodes} nodes")
        if flags.get("--nproc-per-node") != str(facts.gpus):
            self.error(
                script_path,
                f"ft_launcher --nproc-per-node is {flags.get('--nproc-per-node')}, but {facts.instance_type} "
                f"has {facts.gpus} GPUs",
            )
        if preflight is None:
            self.error(script_path, "no trainer preflight before ft_launcher (it turns unfixable errors into exit 93)")
        elif world_size is not None and _flags(preflight).get("--world-size") != str(world_size):
            self.error(
                script_path,
                f"preflight --world-size is {_flags(preflight).get('--world-size')}, but nodes x GPUs = {world_size}",
            )
        if train is None:
            return
        grace = get(site.pod, ["spec", "terminationGracePeriodSeconds"])
        needed = train.recommended_termination_grace_period_s()
        if not isinstance(grace, int) or grace < needed:
            self.error(
                site.path + ["spec", "terminationGracePeriodSeconds"],
                f"is {grace if grace is not MISSING else 'missing'}; the trainer config needs {needed} s for "
                "ft_launcher to stop ranks after an in-flight checkpoint",
            )
        if nodes is not None and endpoint:
            expected = build_ft_launcher_argv(
                train,
                config_path=TRAIN_CONFIG_PATH,
                nnodes=nodes,
                nproc_per_node=facts.gpus,
                rdzv_endpoint=endpoint,
                rdzv_id=name,
            )
            difference = _first_difference(launcher, expected)
            if difference:
                self.error(script_path, f"ft_launcher flags disagree with the trainer config: {difference}")
        if world_size is not None and preflight is not None:
            expected_pre = build_preflight_argv(config_path=TRAIN_CONFIG_PATH, world_size=world_size)
            difference = _first_difference(preflight, expected_pre)
            if difference:
                self.error(script_path, f"preflight command disagrees with the trainer config: {difference}")


def _parse_entrypoint(script: str) -> tuple[list[str] | None, list[str] | None, str | None]:
    """(ft_launcher argv, preflight argv, host waited for) from the rendered entrypoint script."""
    launcher = preflight = dns_host = None
    for line in script.splitlines():
        try:
            tokens = shlex.split(line, comments=True)
        except ValueError:
            continue
        if not tokens:
            continue
        if tokens and tokens[-1] == "&":
            tokens = tokens[:-1]
        if "||" in tokens:
            tokens = tokens[: tokens.index("||")]
        if tokens and tokens[0] == "ft_launcher":
            launcher = tokens
        elif "--preflight" in tokens:
            preflight = tokens
    # The DNS wait's host is the argument after the closing quote of `python -c '...'`.
    match = re.search(r"^' (\S+) \|\| finish", script, flags=re.MULTILINE)
    if match:
        dns_host = shlex.split(match[1])[0]
    return launcher, preflight, dns_host


def _flags(argv: list[str]) -> dict[str, str]:
    flags: dict[str, str] = {}
    for i, token in enumerate(argv):
        if token.startswith("--") and i + 1 < len(argv):
            flags.setdefault(token, argv[i + 1])
    return flags


def _first_difference(actual: list[str], expected: list[str]) -> str | None:
    if actual == expected:
        return None
    actual_flags, expected_flags = _flags(actual), _flags(expected)
    for flag, value in expected_flags.items():
        if flag not in actual_flags:
            return f"{flag} is missing (expected {value})"
        if actual_flags[flag] != value:
            return f"{flag} is {actual_flags[flag]}, expected {value}"
    for flag in actual_flags:
        if flag not in expected_flags:
            return f"unexpected {flag}"
    return f"arguments differ: {shlex.join(actual)!r} vs {shlex.join(expected)!r}"
