"""The EFA transport check (workloads/transport.py): what NCCL's log means, the start-up hook
around the first process group, and the image build's plugin assertion. A gloo run with
require_efa set: tests/runs/trainer/test_run_variants.py."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from nvrx_eks.facts.errors import ConfigError
from tests.support import REPO_ROOT
from workloads import transport
from workloads.transport import TransportError, check_plugin, decide, require_efa

REPO = REPO_ROOT

# NCCL INFO lines as NCCL and aws-ofi-nccl print them (host:pid:tid [gpu] NCCL INFO ...).
EFA_CURRENT = """\
train-worker-0-0:51:51 [0] NCCL INFO NET/Plugin: Loaded net plugin Libfabric (v10)
train-worker-0-0:51:51 [0] NCCL INFO NET/OFI Initializing aws-ofi-nccl 1.19.0
train-worker-0-0:51:51 [0] NCCL INFO NET/OFI Using Libfabric version 2.4
train-worker-0-0:51:51 [0] NCCL INFO NET/OFI Selected provider is efa, fabric is efa (found 32 nics)
train-worker-0-0:51:51 [0] NCCL INFO Using network Libfabric
train-worker-0-0:51:90 [0] NCCL INFO Channel 00/0 : 0[0] -> 8[0] [send] via NET/Libfabric/0/GDRDMA
"""
EFA_OLD_PLUGIN = """\
ip-10-216-179-87:417138:417176 [7] NCCL INFO NET/OFI Selected Provider is efa
ip-10-216-179-87:417138:417176 [7] NCCL INFO Using network AWS Libfabric
"""
SOCKETS = """\
train-worker-0-0:51:51 [0] NCCL INFO NET/Plugin: Could not find: libnccl-net.so. Using internal net plugin.
train-worker-0-0:51:51 [0] NCCL INFO NET/Socket : Using [0]eth0:10.0.12.7<0>
train-worker-0-0:51:51 [0] NCCL INFO Using network Socket
"""
TCP_PROVIDER = """\
train-worker-0-0:51:51 [0] NCCL INFO NET/OFI Selected provider is tcp;ofi_rxm
train-worker-0-0:51:51 [0] NCCL INFO Using network Libfabric
"""
PLUGIN_WITHOUT_PROVIDER = """\
train-worker-0-0:51:51 [0] NCCL INFO NET/Plugin: Loaded net plugin Libfabric (v10)
train-worker-0-0:51:51 [0] NCCL WARN NET/OFI Unable to find a protocol that worked.
train-worker-0-0:51:51 [0] NCCL INFO Using network Socket
"""


@pytest.mark.parametrize("log", [EFA_CURRENT, EFA_OLD_PLUGIN])
def test_efa_through_the_ofi_plugin_passes(log):
    verdict = decide(log)
    assert verdict.ok and verdict.providers == {"efa"}, verdict


@pytest.mark.parametrize(
    "log, reason",
    [
        (SOCKETS, "NCCL uses network Socket"),
        (TCP_PROVIDER, "selected libfabric provider tcp;ofi_rxm, not efa"),
        (PLUGIN_WITHOUT_PROVIDER, "NCCL uses network Socket"),
        ("train-worker-0-0:51:51 [0] NCCL INFO Bootstrap : Using eth0:10.0.12.7<0>\n", "no 'Selected provider'"),
    ],
)
def test_anything_but_efa_fails_with_the_reason(log, reason):
    verdict = decide(log)
    assert not verdict.ok and reason in verdict.reason


@pytest.fixture
def fresh_process(monkeypatch):
    """The hook checks once per process: each test starts as a new process would."""
    monkeypatch.setattr(transport, "_verified_in_this_process", False)
    for name in ("NCCL_DEBUG", "NCCL_DEBUG_SUBSYS", "NCCL_DEBUG_FILE"):
        monkeypatch.delenv(name, raising=False)


def _nccl_writes(log: str) -> None:
    """What NCCL does while the process group is created: log to NCCL_DEBUG_FILE."""
    assert os.environ["NCCL_DEBUG"] == "INFO" and "NET" in os.environ["NCCL_DEBUG_SUBSYS"]
    Path(os.environ["NCCL_DEBUG_FILE"]).write_text(log)


@pytest.mark.parametrize("backend, required", [("gloo", True), ("nccl", False)])
def test_hook_does_nothing_on_gloo_or_when_not_required(tmp_path, fresh_process, backend, required):
    with require_efa(required, backend, tmp_path, rank=0):
        pass
    assert "NCCL_DEBUG_FILE" not in os.environ and not (tmp_path / "nccl").exists()


def test_hook_passes_when_nccl_chose_efa_and_checks_once_per_process(tmp_path, fresh_process, capsys):
    with require_efa(True, "nccl", tmp_path, rank=3):
        _nccl_writes(EFA_CURRENT)
    assert "provider efa" in capsys.readouterr().err
    assert "NCCL_DEBUG_FILE" not in os.environ  # not inherited by processes started later
    (log,) = (tmp_path / "nccl").iterdir()
    assert log.name.startswith("rank3-")
    # An in-process restart creates the next process group through the same plugin.
    with require_efa(True, "nccl", tmp_path, rank=3):
        pass


@pytest.mark.parametrize("log", [SOCKETS, ""])
def test_hook_fails_the_rank_as_a_do_not_requeue_error(tmp_path, fresh_process, log):
    with pytest.raises(TransportError, match="distributed.require_efa") as raised:
        with require_efa(True, "nccl", tmp_path, rank=0):
            _nccl_writes(log)
    # The trainer turns ConfigError raised in a training attempt into exit 93 (train.run).
    assert isinstance(raised.value, ConfigError)
    assert "require_efa=false" in str(raised.value)


def test_render_requires_efa_where_the_instance_has_efa_with_rdma():
    import yaml

    from infra.config import resolve_config
    from nvrx_eks.jobs.render import render_job
    from nvrx_eks.jobs.spec import build_jobspec, load_train_config

    def required(profile: str, *overrides: str) -> bool:
        train = load_train_config(None, list(overrides), None)
        rendered = render_job(build_jobspec(resolve_config(profile), nodes=2, name="t", train=train))
        config_map = next(d for d in rendered.documents if d["kind"] == "ConfigMap")
        (train_yaml,) = config_map["data"].values()
        return yaml.safe_load(train_yaml)["distributed"]["require_efa"]

    assert required("p5") is True
    assert required("g5-smoke") is False  # g5's EFA has no RDMA: the smoke profile trains without the check
    assert required("p5", "distributed.require_efa=false") is False
    assert required("g5-smoke", "distributed.require_efa=true") is True


# --- the image build's plugin assertion ----------------------------------------------------


def _plugin(directory: Path, *, symbol: str | None, plain_link: bool = True) -> Path:
    """A shared library named like aws-ofi-nccl's: libnccl-net-ofi.so exporting `symbol`, plus
    the libnccl-net.so link of the plain package (the NGC package has none)."""
    directory.mkdir(parents=True)
    source = directory / "plugin.c"
    source.write_text(f"int {symbol} = 1;\n" if symbol else "int unrelated = 1;\n")
    real = directory / "libnccl-net-ofi.so"
    subprocess.run(["cc", "-shared", "-fPIC", "-o", str(real), str(source)], check=True)
    if plain_link:
        (directory / transport.PLUGIN_LIBRARY).symlink_to(real.name)
    return directory


def _cuda_runtime(directory: Path, *, unversioned: bool) -> Path:
    """A stand-in CUDA runtime as a runtime image has it (libcudart.so.13 only) or with the
    unversioned link the image adds."""
    directory.mkdir(parents=True)
    (directory / "cudart.c").write_text("int cudaGetDevice = 1;\n")
    real = directory / "libcudart.so.13"
    subprocess.run(["cc", "-shared", "-fPIC", "-o", str(real), str(directory / "cudart.c")], check=True)
    if unversioned:
        (directory / "libcudart.so").symlink_to(real.name)
    return directory


@pytest.fixture(autouse=True)
def _no_host_loader_cache(monkeypatch):
    """The stand-ins are found through LD_LIBRARY_PATH only, not through this machine's
    ldconfig cache (which might hold a real libcudart.so)."""
    monkeypatch.setattr(transport, "_ld_cache", dict)


needs_cc = pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler to build a stand-in plugin library")


def _check_cli(ld_library_path: str, net_plugin: str = transport.NET_PLUGIN) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", "import sys; from workloads import transport; transport._ld_cache = dict; "
         "sys.exit(transport.main(['--check-plugin']))"],
        env={**os.environ, "LD_LIBRARY_PATH": ld_library_path, "NCCL_NET_PLUGIN": net_plugin},
        cwd=REPO, capture_output=True, text=True,
    )  # fmt: skip


def test_plugin_file_names_follow_nccl():
    assert transport.plugin_file_names("") == ["libnccl-net.so"]
    assert transport.plugin_file_names("ofi") == ["ofi", "libnccl-net-ofi.so"]
    assert transport.plugin_file_names("libnccl-net-ofi.so") == ["libnccl-net-ofi.so"]
    assert transport.plugin_file_names("/opt/x/libp.so") == ["/opt/x/libp.so"]


@needs_cc
@pytest.mark.parametrize("plain_link", [True, False], ids=["plain-package", "ngc-package"])
def test_plugin_check_finds_the_plugin_nccl_net_plugin_names(tmp_path, plain_link):
    plugin_dir = _plugin(tmp_path / "ofi-nccl" / "lib", symbol="ncclNetPlugin_v9", plain_link=plain_link)
    cudart = _cuda_runtime(tmp_path / "cuda", unversioned=True)
    message = check_plugin(f"{tmp_path / 'efa'}:{plugin_dir}:{cudart}")
    assert "ncclNetPlugin_v9" in message and "libnccl-net-ofi.so" in message and "libcudart.so" in message
    result = _check_cli(f"{plugin_dir}:{cudart}")
    assert result.returncode == 0, result.stderr


@needs_cc
def test_plugin_check_fails_without_the_unversioned_cuda_runtime(tmp_path):
    """aws-ofi-nccl dlopen()s libcudart.so at init; a CUDA runtime image has only
    libcudart.so.13: the plugin loads, its init fails, NCCL leaves EFA. The build must fail."""
    plugin_dir = _plugin(tmp_path / "ofi-nccl" / "lib", symbol="ncclNetPlugin_v9")
    cudart = _cuda_runtime(tmp_path / "cuda", unversioned=False)
    with pytest.raises(TransportError, match="libcudart.so"):
        check_plugin(f"{plugin_dir}:{cudart}")
    result = _check_cli(f"{plugin_dir}:{cudart}")
    assert result.returncode == 1 and "libcudart.so" in result.stderr and "Traceback" not in result.stderr


@needs_cc
def test_plugin_check_fails_where_nccl_would_fall_back_to_sockets(tmp_path):
    cudart = _cuda_runtime(tmp_path / "cuda", unversioned=True)
    # The EFA installer's multiarch directory is not on the path: NCCL would not find the plugin.
    plugin_dir = _plugin(tmp_path / "ofi-nccl" / "lib" / "x86_64-linux-gnu", symbol="ncclNetPlugin_v9")
    with pytest.raises(TransportError, match="none of ofi, libnccl-net-ofi.so"):
        check_plugin(f"{plugin_dir.parent}:{cudart}")
    # Unset NCCL_NET_PLUGIN with the NGC package: NCCL looks for libnccl-net.so, which it lacks.
    ngc = _plugin(tmp_path / "ngc", symbol="ncclNetPlugin_v9", plain_link=False)
    with pytest.raises(TransportError, match="none of libnccl-net.so"):
        check_plugin(f"{ngc}:{cudart}", net_plugin="")
    not_a_plugin = _plugin(tmp_path / "other", symbol=None)
    with pytest.raises(TransportError, match="exports no NCCL net plugin symbol"):
        check_plugin(f"{not_a_plugin}:{cudart}")
    result = _check_cli(f"{plugin_dir.parent}:{cudart}")
    assert result.returncode == 1 and "error: NCCL_NET_PLUGIN=ofi: none of" in result.stderr
    assert "Traceback" not in result.stderr


@needs_cc
def test_plugin_check_accepts_a_plugin_that_needs_only_the_gpu_driver(tmp_path, monkeypatch):
    """An image build has no GPU driver: a plugin linked against the driver's libraries cannot
    load there, yet is where NCCL looks; any other missing library fails the check. (A stand-in
    driver library name: this machine may have a real libcuda.so.1.)"""
    monkeypatch.setattr(transport, "DRIVER_LIBRARIES", ("libnvrx-test-driver.so.1",))
    cudart = _cuda_runtime(tmp_path / "cuda", unversioned=True)
    for needed, passes in (("driver", True), ("other", False)):
        build = tmp_path / needed
        build.mkdir()
        (build / "stub.c").write_text("int stub = 1;\n")
        soname = "libnvrx-test-driver.so.1" if needed == "driver" else "libnvrx-test-fabric.so.1"
        subprocess.run(["cc", "-shared", "-fPIC", f"-Wl,-soname,{soname}", "-o", str(build / soname),
                        str(build / "stub.c")], check=True)  # fmt: skip
        plugin_dir = build / "lib"
        plugin_dir.mkdir()
        # Referencing the library's symbol keeps it needed (linkers drop unused ones).
        (plugin_dir / "plugin.c").write_text("extern int stub;\nint *ncclNetPlugin_v9 = &stub;\n")
        subprocess.run(["cc", "-shared", "-fPIC", "-o", str(plugin_dir / "libnccl-net-ofi.so"),
                        str(plugin_dir / "plugin.c"), str(build / soname)], check=True)  # fmt: skip
        (build / soname).unlink()  # as in the image: the library is not there
        if passes:
            assert "needs the GPU driver" in check_plugin(f"{plugin_dir}:{cudart}")
        else:
            with pytest.raises(TransportError, match="does not load"):
                check_plugin(f"{plugin_dir}:{cudart}")
