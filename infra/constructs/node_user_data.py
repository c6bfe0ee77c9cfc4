"""User data of the GPU nodes: a MIME multipart document that nodeadm (AL2023) reads.

Part 1, always: a nodeadm NodeConfig. RAID0 over the instance-store NVMe puts containerd and the
kubelet on local disks: the multi-GB CUDA image unpacks there instead of on the EBS root.

Part 2, only with fsx.efa_enabled: the node's Lustre client reaches the file system over EFA. An
EFA-enabled FSx file system serves TCP clients too, so without it every mount silently runs over
TCP (at most 100 Gbps instead of 700 Gbps on p5); the FSx CSI driver does not configure the client.
The steps follow the FSx for Lustre user guide ("Configuring EFA clients") and the EKS user guide
("Optimize Amazon FSx for Lustre performance on nodes (EFA)"): load LNet with the EFA LND bound to
the primary interface, keep the TCP network on that interface, add EFA interfaces to an `efa`
network, turn on discovery and prefer EFA with a UDSP rule. The EFA driver itself is part of the
EKS AL2023 NVIDIA AMI.

User data runs once per instance, but LNet's configuration is lost at every reboot (node repair,
driver update): so the part installs the steps as a systemd unit that runs on every boot before
kubelet, as the EKS guide's FSx tuning page does, and kubelet requires it. A node whose client
cannot use EFA (no kefalnd for the kernel, no EFA device joined LNet) therefore never becomes
Ready, and node auto repair replaces it, instead of training on a file system at a seventh of its
speed; `journalctl -u nvrx-eks-lustre-efa` on the node says why.
"""

from __future__ import annotations

from infra.config import DeploymentConfig
from nvrx_eks.facts.instances import InstanceFacts

MIME_BOUNDARY = "==NVRXEKS=="
NODEADM_CONTENT_TYPE = "application/node.eks.aws"
SHELL_CONTENT_TYPE = 'text/x-shellscript; charset="us-ascii"'

_NODE_CONFIG = """apiVersion: node.eks.aws/v1alpha1
kind: NodeConfig
spec:
  instance:
    localStorage:
      strategy: RAID0
"""

#: The unit and the script it runs. The script names this module by its former path,
#: infra/node_user_data.py: changing a byte of the user data makes a new launch template version,
#: which replaces every GPU node on deploy (one at a time, terminating first: gpu_nodes.py).
LUSTRE_EFA_UNIT_NAME = "nvrx-eks-lustre-efa.service"
LUSTRE_EFA_SCRIPT_PATH = "/usr/local/sbin/nvrx-eks-lustre-efa"

_LUSTRE_EFA_SCRIPT = """#!/bin/bash
# Lustre client over EFA for FSx for Lustre (see infra/node_user_data.py for the sources).
# Runs on every boot before kubelet (nvrx-eks-lustre-efa.service); kubelet needs it to succeed.
set -euo pipefail
shopt -s nullglob
exec > >(logger -s -t nvrx-eks-lustre-efa) 2>&1
fail() { echo "FSx would mount over TCP, not EFA: $*; kubelet stays down" >&2; exit 1; }

rpm -q lustre-client >/dev/null || dnf install -y lustre-client
modinfo kefalnd >/dev/null 2>&1 || fail "kernel $(uname -r) has no kefalnd module (the EFA LND of lustre-client)"

# The primary ENA interface carries the default route (EFA-only interfaces have no IP address).
eth_intf="$(ip -o -4 route show to default | awk 'NR == 1 {print $5}')"
[[ -n "$eth_intf" ]] || fail "no interface carries the default route"
echo "primary interface: $eth_intf"

# LNet's TCP network stays on the primary interface; the EFA LND is bound to it too.
modprobe lnet
modprobe kefalnd ipif_name="$eth_intf"
modprobe ksocklnd
lnetctl lnet configure
lnetctl net del --net tcp 2>/dev/null || true
lnetctl net add --net tcp --if "$eth_intf"

devices=(/sys/class/infiniband/*)
echo "found ${#devices[@]} EFA device(s)"
for index in __DEVICE_INDEXES__; do
  if (( index < ${#devices[@]} )); then
    lnetctl net add --net efa --if "$(basename "${devices[$index]}")" --peer-credits 32
  fi
done

lnetctl set discovery 1
lnetctl udsp add --src efa --priority 0
modprobe lustre
efa_nets="$(lnetctl net show | grep -c '@efa' || true)"
[[ "$efa_nets" -gt 0 ]] || fail "no EFA interface joined LNet"
echo "LNet has $efa_nets EFA interface(s)"
"""

_LUSTRE_EFA_UNIT = f"""[Unit]
Description=Lustre client over EFA for FSx for Lustre (nvrx-eks)
Wants=network-online.target
After=network-online.target
Before=nodeadm-run.service kubelet.service

[Service]
Type=oneshot
RemainAfterExit=yes
ExecStart={LUSTRE_EFA_SCRIPT_PATH}

[Install]
WantedBy=multi-user.target
RequiredBy=kubelet.service
"""

#: The user-data part: install the script and the unit, enable it, run it for this first boot
#: (cloud-init's user data runs before nodeadm starts kubelet).
_LUSTRE_EFA_INSTALLER = f"""#!/bin/bash
# Installs the Lustre-over-EFA client set-up as a unit run on every boot (infra/node_user_data.py).
set -euo pipefail
cat > {LUSTRE_EFA_SCRIPT_PATH} <<'SCRIPT'
__SCRIPT__SCRIPT
chmod 0755 {LUSTRE_EFA_SCRIPT_PATH}
cat > /etc/systemd/system/{LUSTRE_EFA_UNIT_NAME} <<'UNIT'
{_LUSTRE_EFA_UNIT}UNIT
systemctl daemon-reload
systemctl enable --now {LUSTRE_EFA_UNIT_NAME}
"""


def lustre_efa_device_indexes(facts: InstanceFacts) -> list[int]:
    """Which EFA devices (in /sys/class/infiniband order) join LNet's efa network."""
    count = facts.efa_interfaces
    stride = facts.efa_devices_per_pcie_switch
    if stride:
        return list(range(0, count, stride))
    # Other types: the first and the last device (one if there is only one).
    return sorted({0, count - 1})


def lustre_efa_client_script(facts: InstanceFacts) -> str:
    """The boot script the unit runs."""
    indexes = " ".join(str(i) for i in lustre_efa_device_indexes(facts))
    return _LUSTRE_EFA_SCRIPT.replace("__DEVICE_INDEXES__", indexes)


def lustre_efa_unit() -> str:
    return _LUSTRE_EFA_UNIT


def lustre_efa_user_data(facts: InstanceFacts) -> str:
    """The user-data shell part: writes the script and the unit, enables and starts the unit."""
    return _LUSTRE_EFA_INSTALLER.replace("__SCRIPT__", lustre_efa_client_script(facts))


def gpu_node_user_data(config: DeploymentConfig) -> str:
    parts = [(NODEADM_CONTENT_TYPE, _NODE_CONFIG)]
    if config.fsx.efa_enabled:
        parts.append((SHELL_CONTENT_TYPE, lustre_efa_user_data(config.gpu_nodes.facts)))
    lines = ["MIME-Version: 1.0", f'Content-Type: multipart/mixed; boundary="{MIME_BOUNDARY}"', ""]
    for content_type, body in parts:
        lines += [f"--{MIME_BOUNDARY}", f"Content-Type: {content_type}", "", body]
    lines += [f"--{MIME_BOUNDARY}--", ""]
    return "\n".join(lines)
