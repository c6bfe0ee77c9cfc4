"""The ft_launcher command line for a TrainConfig: one function, used by `nvrx-eks local` now and
rendered into the Kubernetes manifests, so it assumes nothing about this machine (no localhost, no
local paths beyond what the caller passes). No torch.

Contract:
    build_ft_launcher_argv(cfg, *, config_path, nnodes, nproc_per_node, rdzv_endpoint,
                           rdzv_id="nvrx-eks", launcher="ft_launcher", log_dir=None) -> list[str]
    build_preflight_argv(*, config_path, world_size, python="python") -> list[str]
    build_coordinator_argv(cfg, *, nnodes, rdzv_endpoint, rdzv_id, python="python") -> list[str]
    inprocess_store_port(rdzv_endpoint) -> int
    inprocess_store_endpoint(rdzv_endpoint) -> str
    inprocess_store_port_above(port) -> int
    rendezvous_port_of_store(store_port) -> int

Flags checked against nvidia-resiliency-ext 0.7.0 (fault_tolerance/launcher.py): c10d is the only
rendezvous backend and barrier the only FT rendezvous implementation; timeouts accept "none".

Ports: the rendezvous endpoint HOST:P is the job's coordinator (workloads.coordinator), a process
on no training node. It serves ft_launcher's rendezvous store on P (every launcher joins as a
client: `is_host=false`) and the trainer's in-process restart store (NVRx Wrapper store plus the
per-restart process-group prefixes) on P+1, passed to every rank explicitly (`--store HOST:P+1`).
Deriving it from the endpoint rather than from MASTER_PORT (a random free port chosen by the
launcher) keeps concurrent local runs from colliding: each owns P and P+1 and nothing else.
"""

from __future__ import annotations

from nvrx_eks.facts.checkpoint_layout import iteration_file
from nvrx_eks.facts.exit_codes import EXIT_DO_NOT_REQUEUE
from workloads.config import TrainConfig


def _seconds(value: float | None) -> str:
    return "none" if value is None else f"{value:g}"


#: ft_launcher's barrier rendezvous closes itself when it sees several launchers on one host,
#: unless this says they are simulated nodes (`nvrx-eks local --nodes`, rehearsed pods).
MULTI_LAUNCHER_ENV = "NVRX_ENABLE_MULTI_LAUNCHERS_PER_NODE"

#: The in-process store listens this far above the rendezvous endpoint's port.
_STORE_PORT_OFFSET = 1


def inprocess_store_port_above(port: int) -> int:
    """The in-process store's port for the rendezvous port `port` (in a rank started without
    --store-port: MASTER_PORT)."""
    return port + _STORE_PORT_OFFSET


def split_endpoint(endpoint: str) -> tuple[str, int]:
    """(HOST, PORT) of HOST:PORT."""
    host, sep, port = endpoint.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ValueError(f"endpoint {endpoint!r}: expected HOST:PORT")
    return host, int(port)


def inprocess_store_port(rdzv_endpoint: str) -> int:
    """The in-process store's port for the rendezvous endpoint HOST:PORT (what templates receive)."""
    return inprocess_store_port_above(split_endpoint(rdzv_endpoint)[1])


def inprocess_store_endpoint(rdzv_endpoint: str) -> str:
    """HOST:PORT of the in-process store the coordinator at the rendezvous endpoint serves."""
    return f"{split_endpoint(rdzv_endpoint)[0]}:{inprocess_store_port(rdzv_endpoint)}"


def rendezvous_port_of_store(store_port: int) -> int:
    """The rendezvous endpoint's port, from the in-process store port a rank was given."""
    return store_port - _STORE_PORT_OFFSET


def build_ft_launcher_argv(
    cfg: TrainConfig,
    *,
    config_path: str,
    nnodes: int | str,
    nproc_per_node: int,
    rdzv_endpoint: str,
    rdzv_id: str = "nvrx-eks",
    launcher: str = "ft_launcher",
    log_dir: str | None = None,
) -> list[str]:
    """ft_launcher argv that starts `nproc_per_node` trainer ranks on each of `nnodes` nodes.

    `nnodes` is an int or "MIN:MAX"; `rdzv_endpoint` is HOST:PORT of the job's coordinator (in
    Kubernetes the stable DNS name of the coordinator pod). `config_path` is where the TrainConfig YAML is
    found on every node (the ConfigMap mount).
    """
    ft = cfg.fault_tolerance
    argv = [
        launcher,
        "--nnodes",
        str(nnodes),
        "--nproc-per-node",
        str(nproc_per_node),
        "--rdzv-backend",
        "c10d",
        "--rdzv-endpoint",
        rdzv_endpoint,
        "--rdzv-id",
        rdzv_id,
        # The coordinator hosts the rendezvous store; no launcher does, so none is critical.
        "--rdzv-conf",
        "is_host=false",
        "--ft-rdzv-impl",
        "barrier",
        # With spare nodes a node that lost a rank leaves instead of restarting its workers: a
        # restarted node re-enters the rendezvous and ft_launcher then restarts every node
        # (any-failed), while the survivors can continue in process with a spare
        # (workloads.spares).
        "--max-restarts",
        str(0 if cfg.distributed.spare_nodes else ft.max_restarts),
        # A forwarded SIGTERM (eviction) gives ranks one checkpoint finalize before SIGKILL.
        "--term-timeout",
        _seconds(cfg.launcher_term_timeout_s()),
        "--workers-stop-timeout",
        _seconds(ft.workers_stop_timeout_s),
        "--ft-workload-check-interval",
        _seconds(ft.workload_check_interval_s),
        "--ft-no-restart-exit-code",
        str(EXIT_DO_NOT_REQUEUE),
        "--ft-max-no-progress-cycles",
        str(ft.max_no_progress_cycles),
        # Progress = a newer committed checkpoint; the trainer rewrites this file at each commit.
        "--ft-checkpoint-iteration-file",
        iteration_file(cfg.checkpoint_dir),
    ]
    if ft.monitor == "heartbeat":
        argv += [
            "--ft-initial-rank-heartbeat-timeout",
            _seconds(ft.initial_heartbeat_timeout_s),
            "--ft-rank-heartbeat-timeout",
            _seconds(ft.heartbeat_timeout_s),
            "--ft-rank-out-of-section-timeout",
            "none",
        ]
    else:
        st = ft.section_timeouts_s
        sections = f"setup:{st.setup:g},step:{st.step:g},checkpointing:{cfg.checkpoint_section_timeout_s():g}"
        argv += [
            "--ft-initial-rank-heartbeat-timeout",
            "none",
            "--ft-rank-heartbeat-timeout",
            "none",
            "--ft-rank-section-timeouts",
            sections,
            "--ft-rank-out-of-section-timeout",
            _seconds(ft.out_of_section_timeout_s),
        ]
    if log_dir is not None:
        argv += ["--log-dir", log_dir]
    argv += [
        "-m",
        "workloads.train",
        "--config",
        config_path,
        "--store",
        inprocess_store_endpoint(rdzv_endpoint),
    ]
    return argv


def build_coordinator_argv(
    cfg: TrainConfig, *, nnodes: int | str, rdzv_endpoint: str, rdzv_id: str, python: str = "python"
) -> list[str]:
    """The job's coordinator (workloads.coordinator), serving the rendezvous endpoint the launchers
    of build_ft_launcher_argv join, for the same `nnodes` and `rdzv_id`. After SIGTERM it keeps
    the stores up as long as the ranks may take to stop (the launchers' --term-timeout)."""
    return [
        python,
        "-m",
        "workloads.coordinator",
        "--nnodes",
        str(nnodes),
        "--rdzv-endpoint",
        rdzv_endpoint,
        "--rdzv-id",
        rdzv_id,
        "--stop-grace-s",
        f"{cfg.launcher_term_timeout_s():g}",
    ]


def build_preflight_argv(*, config_path: str, world_size: int, python: str = "python") -> list[str]:
    """The check to run before ft_launcher in the container command (`PREFLIGHT && exec LAUNCHER`):
    exits 93 on errors no restart can fix (invalid config, incompatible checkpoint, missing data),
    before any rank starts, so the job fails instead of crash-looping."""
    return [python, "-m", "workloads.train", "--config", config_path, "--preflight", "--world-size", str(world_size)]
