"""Is NCCL's inter-node traffic on EFA? Checked once per trainer process, from NCCL's own log.

NCCL reaches EFA only through the aws-ofi-nccl plugin (`libnccl-net.so`, found through the
dynamic loader's path) with libfabric's `efa` provider. When the plugin is missing or cannot open
the EFA devices (image without the plugin on LD_LIBRARY_PATH, pod without
`vpc.amazonaws.com/efa` devices), NCCL silently falls back to TCP sockets: a p5 job then runs at a
small fraction of its speed and nothing fails. `FI_PROVIDER=efa` does not change that; it only
restricts libfabric.

So, where `distributed.require_efa` is set (the render sets it for instance types whose facts
say EFA with RDMA; the g5 smoke types have EFA without RDMA and leave it off), the trainer routes
NCCL's NET log to a file before its first communicator, and after it reads what NCCL chose: the
plugin logs `NET/OFI Selected provider is efa` (`Selected Provider` before aws-ofi-nccl 1.14) and
NCCL `Using network Libfabric` (`AWS Libfabric` up to aws-ofi-nccl 1.11, aws/aws-ofi-nccl#530).
Anything else fails the rank with a ConfigError, which the trainer turns into exit 93 (do not
requeue): a restart cannot bring EFA back, and training over TCP is not what the job asked for.

NCCL reads NCCL_DEBUG when it first logs, so its INFO lines for INIT and NET, and its warnings,
may keep going to that file for the life of the process; its path is printed. The environment
itself is restored right after the check, for the processes the trainer starts later.

`python -m workloads.transport --check-plugin` is the image build's assertion that the plugin is
where NCCL looks.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import os
import re
import socket
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from nvrx_eks.facts.errors import ConfigError

#: The file name NCCL dlopen()s for a network plugin when NCCL_NET_PLUGIN is unset.
PLUGIN_LIBRARY = "libnccl-net.so"
#: Symbols an NCCL network plugin exports, one per plugin API version.
PLUGIN_SYMBOLS = tuple(f"ncclNetPlugin_v{v}" for v in range(11, 1, -1))
#: Libraries of the NVIDIA driver, present on GPU nodes only.
DRIVER_LIBRARIES = ("libcuda.so.1", "libnvidia-ml.so.1")
#: Network names aws-ofi-nccl has reported (and accepts in NCCL_NET).
OFI_NETWORK_NAMES = frozenset({"Libfabric", "AWS Libfabric", "OFI"})
EFA_PROVIDER = "efa"

# Releases differ in what follows the provider name (", fabric is ...", "(found N nics)").
_PROVIDER_LINE = re.compile(r"NET/OFI Selected provider is ([\w;+-]+)", re.IGNORECASE)
_NETWORK_LINE = re.compile(r"NCCL INFO Using network (.+?)\s*$")


class TransportError(ConfigError):
    """NCCL is not on EFA where the job requires it."""


@dataclass(frozen=True)
class Verdict:
    ok: bool
    providers: frozenset[str]
    networks: frozenset[str]
    reason: str


def decide(log_text: str) -> Verdict:
    """What NCCL's INIT/NET log says about the transport, and whether it is EFA."""
    providers, networks = set(), set()
    for line in log_text.splitlines():
        if m := _PROVIDER_LINE.search(line):
            providers.add(m.group(1))
        if m := _NETWORK_LINE.search(line):
            networks.add(m.group(1))
    not_ofi = networks - OFI_NETWORK_NAMES
    if not_ofi:
        reason = (
            f"NCCL uses network {', '.join(sorted(not_ofi))} instead of the aws-ofi-nccl plugin "
            "(traffic over TCP sockets, not EFA)"
        )
    elif not providers:
        reason = (
            "NCCL's log has no 'Selected provider' line from the aws-ofi-nccl plugin: the "
            "plugin was not loaded or did not initialize"
        )
    elif providers != {EFA_PROVIDER}:
        reason = f"the aws-ofi-nccl plugin selected libfabric provider {', '.join(sorted(providers))}, not efa"
    else:
        return Verdict(
            True,
            frozenset(providers),
            frozenset(networks),
            "NCCL uses the aws-ofi-nccl plugin with libfabric provider efa",
        )
    return Verdict(False, frozenset(providers), frozenset(networks), reason)


def log_path(run_dir: str | Path, rank: int) -> Path:
    return Path(run_dir) / "nccl" / f"rank{rank}-{socket.gethostname()}-{os.getpid()}.log"


_verified_in_this_process = False


@contextlib.contextmanager
def require_efa(required: bool, backend: str, run_dir: str | Path, rank: int) -> Iterator[None]:
    """Wrap the first NCCL process-group creation of the process: before it, send NCCL's NET log
    to a file; after it, fail with TransportError unless NCCL chose EFA. A no-op when not
    required, on gloo, and after the first successful check of the process (in-process restarts
    create communicators through the same plugin)."""
    global _verified_in_this_process
    if not required or backend != "nccl" or _verified_in_this_process:
        yield
        return
    path = log_path(run_dir, rank)
    path.parent.mkdir(parents=True, exist_ok=True)
    log_env = {"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT,NET", "NCCL_DEBUG_FILE": str(path)}
    saved = {name: os.environ.get(name) for name in log_env}
    os.environ.update(log_env)
    try:
        yield
    finally:
        # Processes started later (checkpoint workers) must not inherit the file and truncate it.
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
    text = path.read_text(errors="replace") if path.is_file() else ""
    if not text.strip():
        raise TransportError(
            f"distributed.require_efa: NCCL wrote nothing to {path} while creating the process "
            "group, so the transport cannot be checked (was NCCL initialized before the trainer "
            "set NCCL_DEBUG?); set distributed.require_efa=false to train without the check"
        )
    verdict = decide(text)
    if not verdict.ok:
        raise TransportError(
            f"distributed.require_efa: {verdict.reason} (NCCL's log: {path}). Check that the pod "
            "requests vpc.amazonaws.com/efa devices, that the EFA device plugin runs on the node, "
            "and that the image has libnccl-net.so on LD_LIBRARY_PATH "
            "(python -m workloads.transport --check-plugin); set distributed.require_efa=false "
            "only to train without EFA on purpose"
        )
    _verified_in_this_process = True
    print(f"transport: {verdict.reason}; NCCL's log (INIT, NET, warnings): {path}", file=sys.stderr, flush=True)


def find_plugin(ld_library_path: str) -> Path | None:
    """The libnccl-net.so the dynamic loader would find through LD_LIBRARY_PATH, if any."""
    for directory in ld_library_path.split(":"):
        if directory and (Path(directory) / PLUGIN_LIBRARY).is_file():  # follows the symlink
            return Path(directory) / PLUGIN_LIBRARY
    return None


def check_plugin(ld_library_path: str) -> str:
    """Raise TransportError unless an NCCL network plugin loads from LD_LIBRARY_PATH."""
    plugin = find_plugin(ld_library_path)
    if plugin is None:
        raise TransportError(
            f"no {PLUGIN_LIBRARY} in any LD_LIBRARY_PATH directory ({ld_library_path or 'unset'}); "
            "NCCL would fall back to TCP sockets. Add the aws-ofi-nccl library directory "
            "(/opt/amazon/ofi-nccl/lib or lib/x86_64-linux-gnu) to LD_LIBRARY_PATH"
        )
    try:
        library = ctypes.CDLL(str(plugin))
    except OSError as err:
        # The driver's libraries are mounted into the container by the NVIDIA runtime on a GPU
        # node; an image build has none. Everything else the plugin needs must be in the image.
        if any(driver in str(err) for driver in DRIVER_LIBRARIES):
            return f"{plugin} -> {plugin.resolve()} found; it needs the GPU driver to load ({err})"
        raise TransportError(f"{plugin} does not load: {err}") from None
    exported = [s for s in PLUGIN_SYMBOLS if hasattr(library, s)]
    if not exported:
        raise TransportError(f"{plugin} loads but exports no NCCL net plugin symbol ({PLUGIN_SYMBOLS[0]}...)")
    return f"{plugin} -> {plugin.resolve()} loads and exports {exported[0]}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m workloads.transport", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--check-plugin",
        action="store_true",
        required=True,
        help="exit 1 unless libnccl-net.so loads from an LD_LIBRARY_PATH directory",
    )
    parser.parse_args(argv)
    try:
        print(check_plugin(os.environ.get("LD_LIBRARY_PATH", "")))
    except TransportError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
