"""The Lustre-over-EFA client set-up of the GPU nodes (infra/constructs/node_user_data.py): a unit
run on every boot before kubelet, which kubelet requires, and its script run under bash against
stand-in system commands: the primary interface from the default route; `dnf install` retried with
backoff; a failure at first boot registering the node with a taint that names it (a NodeConfig
drop-in for nodeadm), and on a later boot keeping kubelet down, each with one line saying why."""

from __future__ import annotations

import configparser
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from infra.constructs.node_user_data import (
    DNF_ATTEMPTS,
    FIRST_BOOT_DONE_PATH,
    LUSTRE_EFA_SCRIPT_PATH,
    LUSTRE_EFA_UNIT_NAME,
    TAINT_DROP_IN_PATH,
    lustre_efa_client_script,
    lustre_efa_taint_drop_in,
    lustre_efa_unit,
    lustre_efa_user_data,
)
from nvrx_eks.facts.instances import INSTANCE_FACTS
from nvrx_eks.facts.names import (
    GPU_TAINT_EFFECT,
    GPU_TAINT_KEY,
    GPU_TAINT_VALUE,
    LUSTRE_EFA_TAINT_KEY,
    LUSTRE_EFA_TAINT_VALUE,
)

P5 = INSTANCE_FACTS["p5.48xlarge"]
SHELLCHECK = Path(sys.executable).parent / "shellcheck"
#: The boot script reads this machine's /sys/class/infiniband; a machine with devices of its own
#: would feed them to the stand-in lnetctl.
NO_LOCAL_EFA = pytest.mark.skipif(
    Path("/sys/class/infiniband").exists(), reason="this machine has EFA/IB devices of its own"
)


def test_the_unit_runs_every_boot_before_kubelet_which_requires_it():
    unit = configparser.ConfigParser()
    unit.read_string(lustre_efa_unit())
    assert "kubelet.service" in unit["Unit"]["Before"].split()
    assert "nodeadm-run.service" in unit["Unit"]["Before"].split()  # its taint drop-in is read there
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


def test_the_taint_drop_in_is_a_node_config_that_keeps_the_gpu_taint():
    """kubelet keeps the last --register-with-taints it is given, and nodeadm appends the drop-in's
    flags after the user data's: the drop-in must repeat the node group's GPU taint."""
    config = yaml.safe_load(lustre_efa_taint_drop_in())
    assert config["apiVersion"] == "node.eks.aws/v1alpha1" and config["kind"] == "NodeConfig"
    (flag,) = config["spec"]["kubelet"]["flags"]
    name, _, taints = flag.partition("=")
    assert name == "--register-with-taints"
    assert taints.split(",") == [
        f"{GPU_TAINT_KEY}={GPU_TAINT_VALUE}:{GPU_TAINT_EFFECT}",
        f"{LUSTRE_EFA_TAINT_KEY}={LUSTRE_EFA_TAINT_VALUE}:NoSchedule",
    ]
    assert TAINT_DROP_IN_PATH.startswith("/etc/eks/nodeadm.d/") and TAINT_DROP_IN_PATH.endswith(".yaml")


STUBS = {
    "rpm": '[ "$STUB_CLIENT_INSTALLED" = yes ]',
    # Fails the first STUB_DNF_FAILURES calls, then succeeds.
    "dnf": (
        'n=$(( $(cat "$STUB_DNF_COUNT") + 1 )); echo "$n" > "$STUB_DNF_COUNT"; echo "dnf $*" >> "$STUB_CALLS"\n'
        '[ "$n" -gt "$STUB_DNF_FAILURES" ] || { echo "Errors during downloading metadata for repository" >&2; exit 1; }'
    ),
    "sleep": 'echo "sleep $*" >> "$STUB_CALLS"',
    "modinfo": '[ "$STUB_KEFALND" = yes ]',
    "ip": 'echo "default via 10.1.0.1 dev ens5 proto dhcp src 10.1.2.3 metric 512"',
    "modprobe": 'echo "modprobe $*" >> "$STUB_CALLS"',
    "lnetctl": (
        '[ "$1 $2" = "net show" ] && { printf "%s\\n" "$STUB_NET_SHOW"; exit 0; }\necho "lnetctl $*" >> "$STUB_CALLS"'
    ),
    "logger": "cat >&2",
}


class Boot:
    """One run of the boot script under the stand-ins, its state files in a scratch root."""

    def __init__(self, tmp_path: Path):
        self.root = tmp_path / "node"
        self.bin = tmp_path / "bin"
        self.bin.mkdir()
        for name, body in STUBS.items():
            (self.bin / name).write_text(f"#!/bin/bash\n{body}\n")
            (self.bin / name).chmod(0o755)
        self.calls_file = tmp_path / "calls"
        self.dnf_count = tmp_path / "dnf-count"

    @property
    def drop_in(self) -> Path:
        return Path(f"{self.root}{TAINT_DROP_IN_PATH}")

    @property
    def first_boot_done(self) -> Path:
        return Path(f"{self.root}{FIRST_BOOT_DONE_PATH}")

    def run(
        self,
        *,
        kefalnd: bool = True,
        net_show: str = "nid: 10.1.2.3@efa",
        installed: bool = True,
        dnf_failures: int = 0,
    ) -> subprocess.CompletedProcess:
        self.calls_file.write_text("")
        self.dnf_count.write_text("0")
        env = {
            **os.environ,
            "PATH": f"{self.bin}:{os.environ['PATH']}",
            "STUB_CALLS": str(self.calls_file),
            "STUB_CLIENT_INSTALLED": "yes" if installed else "no",
            "STUB_DNF_COUNT": str(self.dnf_count),
            "STUB_DNF_FAILURES": str(dnf_failures),
            "STUB_KEFALND": "yes" if kefalnd else "no",
            "STUB_NET_SHOW": net_show,
        }
        script = lustre_efa_client_script(P5, root=str(self.root))
        return subprocess.run(["bash", "-c", script], env=env, capture_output=True, text=True, timeout=60)

    @property
    def calls(self) -> list[str]:
        return self.calls_file.read_text().splitlines()


@NO_LOCAL_EFA
def test_boot_script_binds_lnet_to_the_interface_of_the_default_route(tmp_path):
    boot = Boot(tmp_path)
    result = boot.run()
    assert result.returncode == 0, result.stderr
    assert "modprobe kefalnd ipif_name=ens5" in boot.calls
    assert "lnetctl net add --net tcp --if ens5" in boot.calls
    assert "primary interface: ens5" in result.stderr
    assert boot.first_boot_done.exists() and not boot.drop_in.exists()


@NO_LOCAL_EFA
def test_a_failing_dnf_install_is_retried_with_growing_pauses(tmp_path):
    boot = Boot(tmp_path)
    result = boot.run(installed=False, dnf_failures=2)
    assert result.returncode == 0, result.stderr
    assert [c for c in boot.calls if c.split()[0] in ("dnf", "sleep")] == [
        "dnf install -y lustre-client",
        "sleep 10",
        "dnf install -y lustre-client",
        "sleep 20",
        "dnf install -y lustre-client",
    ]
    assert "dnf install lustre-client failed (attempt 2 of 5); retrying in 20s" in result.stderr
    assert not boot.drop_in.exists()


def test_dnf_failing_every_attempt_registers_the_node_tainted_at_first_boot(tmp_path):
    boot = Boot(tmp_path)
    result = boot.run(installed=False, dnf_failures=DNF_ATTEMPTS)
    assert result.returncode == 0, result.stderr  # kubelet starts: the node joins, tainted
    assert [c for c in boot.calls if c.startswith("sleep")] == ["sleep 10", "sleep 20", "sleep 40", "sleep 80"]
    assert f"dnf install lustre-client failed {DNF_ATTEMPTS} times" in result.stderr
    assert boot.drop_in.read_text() == lustre_efa_taint_drop_in()
    assert f"registers with the taint {LUSTRE_EFA_TAINT_KEY}={LUSTRE_EFA_TAINT_VALUE}:NoSchedule" in result.stderr
    assert not any(c.startswith(("modprobe", "lnetctl")) for c in boot.calls)  # nothing configured half-way


def test_a_kernel_without_the_efa_lnd_registers_the_node_tainted_at_first_boot(tmp_path):
    boot = Boot(tmp_path)
    result = boot.run(kefalnd=False)
    assert result.returncode == 0, result.stderr
    assert "FSx would mount over TCP, not EFA: kernel" in result.stderr and "has no kefalnd module" in result.stderr
    assert boot.drop_in.read_text() == lustre_efa_taint_drop_in()
    assert boot.first_boot_done.exists()
    assert not any(c.startswith("lnetctl") for c in boot.calls)


@NO_LOCAL_EFA
def test_no_efa_interface_in_lnet_registers_the_node_tainted_at_first_boot(tmp_path):
    boot = Boot(tmp_path)
    result = boot.run(net_show="nid: 10.1.2.3@tcp")
    assert result.returncode == 0 and "no EFA interface joined LNet" in result.stderr
    assert boot.drop_in.exists()


def test_a_later_boot_keeps_kubelet_down_instead(tmp_path):
    """The node registered on its first boot; a taint flag no longer applies, so the unit fails
    and kubelet, which requires it, stays down (node auto repair replaces the node)."""
    boot = Boot(tmp_path)
    boot.first_boot_done.parent.mkdir(parents=True)
    boot.first_boot_done.touch()  # what the first boot's set-up leaves, whatever it found
    result = boot.run(kefalnd=False)
    assert result.returncode == 1
    assert "has no kefalnd module" in result.stderr and "kubelet stays down" in result.stderr
    assert not boot.drop_in.exists()


@NO_LOCAL_EFA
def test_a_later_good_boot_after_a_tainted_first_boot_says_to_remove_the_taint(tmp_path):
    boot = Boot(tmp_path)
    assert boot.run(kefalnd=False).returncode == 0 and boot.drop_in.exists()
    result = boot.run()
    assert result.returncode == 0, result.stderr
    assert f"LNet is on EFA now; remove the {LUSTRE_EFA_TAINT_KEY} taint this node registered with" in result.stderr
