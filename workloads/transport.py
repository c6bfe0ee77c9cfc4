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
where NCCL looks and that what it opens while NCCL initializes it is there too.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import os
import re
import socket
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from nvrx_eks.facts.errors import ConfigError

#: NCCL_NET_PLUGIN, set in the image and in every pod: NCCL then dlopen()s `ofi`, then
#: `libnccl-net-ofi.so` (NCCL src/plugin/plugin_open.cc), which both of aws-ofi-nccl's Debian
#: packages ship: the plain one (which also links it as libnccl-net.so) and the NGC one, which has
#: no libnccl-net.so (contrib/debian-template/libnccl-ofi-ngc-v3.install). So the job finds the
#: plugin whichever package the EFA installer chose.
NET_PLUGIN = "ofi"
#: The file name NCCL dlopen()s for a network plugin when NCCL_NET_PLUGIN is unset.
PLUGIN_LIBRARY = "libnccl-net.so"
#: What the plugin itself dlopen()s while NCCL initializes it, so a plugin that loads can still
#: fail there: aws-ofi-nccl's Debian packages are built with --enable-cudart-dynamic
#: (contrib/debian-template/rules) and open the *unversioned* CUDA runtime (src/nccl_ofi_cuda.cpp),
#: which CUDA runtime images lack (only libcudart.so.N; aws/aws-ofi-nccl#244). On failure the
#: plugin's init returns -ENOTSUP and NCCL falls back off EFA.
PLUGIN_INIT_LIBRARIES = ("libcudart.so",)
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
            "and that the image has the plugin on LD_LIBRARY_PATH "
            "(python -m workloads.transport --check-plugin); set distributed.require_efa=false "
            "only to train without EFA on purpose"
        )
    _verified_in_this_process = True
    print(f"transport: {verdict.reason}; NCCL's log (INIT, NET, warnings): {path}", file=sys.stderr, flush=True)


def plugin_file_names(net_plugin: str) -> list[str]:
    """The names NCCL dlopen()s for NCCL_NET_PLUGIN=`net_plugin`, in its order
    (src/plugin/plugin_open.cc): the name itself, then libnccl-net-<name>.so unless the name is a
    path or already a library file name; libnccl-net.so when unset."""
    if not net_plugin:
        return [PLUGIN_LIBRARY]
    names = [net_plugin]
    if "/" not in net_plugin and not (net_plugin.startswith("lib") and net_plugin.endswith(".so")):
        names.append(f"libnccl-net-{net_plugin}.so")
    return names


def _ld_cache() -> dict[str, str]:
    """{library file name: path} from the dynamic loader's cache (`ldconfig -p`)."""
    try:
        listing = subprocess.run(["ldconfig", "-p"], capture_output=True, text=True, check=False).stdout
    except OSError:
        return {}
    cache: dict[str, str] = {}
    for line in listing.splitlines()[1:]:
        name, _, path = line.strip().partition(" => ")
        cache.setdefault(name.split(" (")[0], path)
    return cache


def resolve_library(name: str, ld_library_path: str) -> Path | None:
    """The file dlopen(name) would open: a path as given, else the first LD_LIBRARY_PATH
    directory holding it, else the loader's cache. (Symlinks are followed when opened, and an
    ldconfig cache may not resolve them, aws/aws-ofi-nccl#993: LD_LIBRARY_PATH is what counts.)"""
    if "/" in name:
        return Path(name) if Path(name).is_file() else None
    for directory in ld_library_path.split(":"):
        if directory and (Path(directory) / name).is_file():  # follows the symlink
            return Path(directory) / name
    cached = _ld_cache().get(name)
    return Path(cached) if cached and Path(cached).is_file() else None


def _load(path: Path) -> ctypes.CDLL | str:
    """The loaded library, or why it needs the GPU node to load (the driver's libraries are
    mounted into the container by the NVIDIA runtime on a GPU node; an image build has none).
    Any other failure raises TransportError."""
    try:
        return ctypes.CDLL(str(path))
    except OSError as err:
        if any(driver in str(err) for driver in DRIVER_LIBRARIES):
            return f"{path} -> {path.resolve()} found; it needs the GPU driver to load ({err})"
        raise TransportError(f"{path} does not load: {err}") from None


def check_plugin(ld_library_path: str, net_plugin: str = NET_PLUGIN) -> str:
    """Raise TransportError unless the library NCCL opens for NCCL_NET_PLUGIN=`net_plugin`
    loads, exports an NCCL net plugin symbol, and every library it opens at init is found."""
    names = plugin_file_names(net_plugin)
    plugin = next((p for p in (resolve_library(n, ld_library_path) for n in names) if p), None)
    if plugin is None:
        raise TransportError(
            f"NCCL_NET_PLUGIN={net_plugin or '(unset)'}: none of {', '.join(names)} is in an "
            f"LD_LIBRARY_PATH directory ({ld_library_path or 'unset'}) or the loader's cache; NCCL "
            "would fall back to TCP sockets. Add the aws-ofi-nccl library directory "
            "(/opt/amazon/ofi-nccl/lib or lib/x86_64-linux-gnu) to LD_LIBRARY_PATH"
        )
    for name in PLUGIN_INIT_LIBRARIES:
        found = resolve_library(name, ld_library_path)
        if found is None:
            raise TransportError(
                f"{plugin} loads {name} when NCCL initializes it (aws-ofi-nccl built with "
                f"--enable-cudart-dynamic), and {name} is in no LD_LIBRARY_PATH directory nor the "
                "loader's cache: the plugin's init would fail and NCCL fall back off EFA. CUDA "
                "runtime images ship only the versioned file: link libcudart.so to libcudart.so.N "
                "beside it (then ldconfig), or install cuda-cudart-dev"
            )
        _load(found)
    library = _load(plugin)
    if isinstance(library, str):
        return library
    exported = [s for s in PLUGIN_SYMBOLS if hasattr(library, s)]
    if not exported:
        raise TransportError(f"{plugin} loads but exports no NCCL net plugin symbol ({PLUGIN_SYMBOLS[0]}...)")
    init = ", ".join(PLUGIN_INIT_LIBRARIES)
    return f"{plugin} -> {plugin.resolve()} loads and exports {exported[0]}; {init} (opened at its init) loads"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m workloads.transport", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--check-plugin",
        action="store_true",
        required=True,
        help="exit 1 unless the plugin NCCL_NET_PLUGIN names, and what it opens at init, load",
    )
    parser.parse_args(argv)
    try:
        print(check_plugin(os.environ.get("LD_LIBRARY_PATH", ""), os.environ.get("NCCL_NET_PLUGIN", "")))
    except TransportError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
