"""The Lustre-over-EFA client set-up of the GPU nodes (infra/constructs/node_user_data.py): a unit
run on every boot before kubelet, which kubelet requires, and its script run under bash against
stand-in system commands: the primary interface from the default route, a kernel without the EFA
LND or no EFA device in LNet failing the unit (so kubelet stays down) with one line saying why."""

from __future__ import annotations

import configparser
import os
import subprocess
import sys
from pathlib import Path

import pytest

from infra.constructs.node_user_data import (
    LUSTRE_EFA_SCRIPT_PATH,
    LUSTRE_EFA_UNIT_NAME,
    lustre_efa_client_script,
    lustre_efa_unit,
    lustre_efa_user_data,
)
from nvrx_eks.facts.instances import INSTANCE_FACTS

P5 = INSTANCE_FACTS["p5.48xlarge"]
SHELLCHECK = Path(sys.executable).parent / "shellcheck"


def test_the_unit_runs_every_boot_before_kubelet_which_requires_it():
    unit = configparser.ConfigParser()
    unit.read_string(lustre_efa_unit())
    assert "kubelet.service" in unit["Unit"]["Before"].split()
    assert "network-online.target" in unit["Unit"]["After"].split()
    assert unit["Service"]["Type"] == "oneshot" and unit["Service"]["RemainAfterExit"] == "yes"
    assert unit["Service"]["ExecStart"] == LUSTRE_EFA_SCRIPT_PATH
    assert unit["Install"]["RequiredBy"] == "kubelet.service"
    assert unit["Install"]["WantedBy"] == "multi-user.target"


def test_user_data_installs_the_script_and_the_unit_and_enables_it(tmp_path):
    user_data = lustre_efa_user_data(P5)
    assert lustre_efa_client_script(P5) in user_data and lustre_efa_unit() in user_data
    assert user_data.rstrip().endswith(f"systemctl enable --now {LUSTRE_EFA_UNIT_NAME}")
    for name, text in (("user-data.sh", user_data), ("boot.sh", lustre_efa_client_script(P5))):
        (tmp_path / name).write_text(text)
        result = subprocess.run(
            [str(SHELLCHECK), "--shell=bash", "--severity=style", str(tmp_path / name)],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert result.returncode == 0, name + result.stdout + result.stderr


STUBS = {
    "rpm": "exit 0",
    "dnf": "exit 0",
    "modinfo": '[ "$STUB_KEFALND" = yes ]',
    "ip": 'echo "default via 10.1.0.1 dev ens5 proto dhcp src 10.1.2.3 metric 512"',
    "modprobe": 'echo "modprobe $*" >> "$STUB_CALLS"',
    "lnetctl": (
        '[ "$1 $2" = "net show" ] && { printf "%s\\n" "$STUB_NET_SHOW"; exit 0; }\necho "lnetctl $*" >> "$STUB_CALLS"'
    ),
    "logger": "cat >&2",
}


def _boot(tmp_path: Path, *, kefalnd: bool, net_show: str) -> tuple[subprocess.CompletedProcess, str]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, body in STUBS.items():
        (bin_dir / name).write_text(f"#!/bin/bash\n{body}\n")
        (bin_dir / name).chmod(0o755)
    calls = tmp_path / "calls"
    calls.touch()
    env = {
        **os.environ,
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "STUB_CALLS": str(calls),
        "STUB_KEFALND": "yes" if kefalnd else "no",
        "STUB_NET_SHOW": net_show,
    }
    result = subprocess.run(["bash", "-c", lustre_efa_client_script(P5)], env=env, capture_output=True, text=True)
    return result, calls.read_text()


@pytest.mark.skipif(Path("/sys/class/infiniband").exists(), reason="this machine has EFA/IB devices of its own")
def test_boot_script_binds_lnet_to_the_interface_of_the_default_route(tmp_path):
    result, calls = _boot(tmp_path, kefalnd=True, net_show="nid: 10.1.2.3@efa")
    assert result.returncode == 0, result.stderr
    assert "modprobe kefalnd ipif_name=ens5" in calls
    assert "lnetctl net add --net tcp --if ens5" in calls
    assert "primary interface: ens5" in result.stderr


def test_boot_script_fails_naming_a_kernel_without_the_efa_lnd(tmp_path):
    result, calls = _boot(tmp_path, kefalnd=False, net_show="nid: 10.1.2.3@efa")
    assert result.returncode == 1
    assert "has no kefalnd module" in result.stderr and "kubelet stays down" in result.stderr
    assert "lnetctl" not in calls  # nothing configured half-way


def test_boot_script_fails_when_no_efa_interface_joined_lnet(tmp_path):
    result, _ = _boot(tmp_path, kefalnd=True, net_show="nid: 10.1.2.3@tcp")
    assert result.returncode == 1 and "no EFA interface joined LNet" in result.stderr
