"""User data of the GPU nodes: a MIME multipart document that nodeadm (AL2023) reads.

Part 1, always: a nodeadm NodeConfig. RAID0 over the instance-store NVMe puts containerd and the
kubelet on local disks: the multi-GB CUDA image unpacks there instead of on the EBS root.

Part 2, only with fsx.efa_enabled: a boot script that makes the node's Lustre client reach the
file system over EFA. An EFA-enabled FSx file system serves TCP clients too, so without it every
mount silently runs over TCP (at most 100 Gbps instead of 700 Gbps on p5); the FSx CSI driver does
not configure the client. The steps follow the FSx for Lustre user guide ("Configuring EFA
clients") and the EKS user guide ("Optimize Amazon FSx for Lustre performance on nodes (EFA)"):
load LNet with the EFA LND bound to the primary interface, keep the TCP network on that interface,
add EFA interfaces to an `efa` network, turn on discovery and prefer EFA with a UDSP rule. The
EFA driver itself is part of the EKS AL2023 NVIDIA AMI.
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

#: The script names this module by its former path, infra/node_user_data.py: changing a byte of
#: the user data makes a new launch template version, which replaces every GPU node on deploy.
_LUSTRE_EFA_SCRIPT = """#!/bin/bash
# Lustre client over EFA for FSx for Lustre (see infra/node_user_data.py for the sources).
set -euo pipefail
exec > >(logger -s -t nvrx-eks-lustre-efa) 2>&1

dnf install -y lustre-client

# LNet's TCP network stays on the primary ENA interface; the EFA LND is bound to it too.
eth_intf="$(/sbin/ip -br -4 addr show | grep "$(hostname -i)/" | awk '{print $1}')"
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
if [[ "$efa_nets" -eq 0 ]]; then
  echo "no EFA interface was added to LNet: FSx mounts would run over TCP" >&2
  exit 1
fi
echo "LNet has $efa_nets EFA interface(s)"
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
    indexes = " ".join(str(i) for i in lustre_efa_device_indexes(facts))
    return _LUSTRE_EFA_SCRIPT.replace("__DEVICE_INDEXES__", indexes)


def gpu_node_user_data(config: DeploymentConfig) -> str:
    parts = [(NODEADM_CONTENT_TYPE, _NODE_CONFIG)]
    if config.fsx.efa_enabled:
        parts.append((SHELL_CONTENT_TYPE, lustre_efa_client_script(config.gpu_nodes.facts)))
    lines = ["MIME-Version: 1.0", f'Content-Type: multipart/mixed; boundary="{MIME_BOUNDARY}"', ""]
    for content_type, body in parts:
        lines += [f"--{MIME_BOUNDARY}", f"Content-Type: {content_type}", "", body]
    lines += [f"--{MIME_BOUNDARY}--", ""]
    return "\n".join(lines)
