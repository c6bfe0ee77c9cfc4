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
EKS AL2023 NVIDIA AMI; lustre-client is not (amazon-eks-ami's install-worker.sh), so the first
boot installs it from the Amazon Linux repositories.

LNet's configuration is lost at every reboot (node repair, driver update), so the part installs
the steps as a systemd unit that runs on every boot before nodeadm starts the kubelet. What
happens when a step fails depends on whether the node ever registered:
- first boot: `dnf install` is retried with backoff (a repository hiccup through the NAT is the
  likeliest failure), and if the set-up still fails (no kefalnd for the kernel, no EFA device in
  LNet, the repository down for minutes) the node registers anyway, with the taint
  nvrx-eks.io/lustre-efa=missing:NoSchedule. nodeadm-run merges NodeConfig drop-ins from
  /etc/eks/nodeadm.d/ over the user data and reconfigures the kubelet when they change the
  config it cached (amazon-eks-ami nodeadm-run.service, `nodeadm init`); kubelet flags are
  appended and the last --register-with-taints wins, so the drop-in repeats the node group's own
  GPU taint. The node joins, so a scale-up completes instead of failing with NodeCreationFailure
  (which at creation time rolled the whole stack back), but no job pod tolerates the taint, so no
  job trains on a file system reached over TCP; `kubectl get nodes` shows it, and
  `journalctl -u nvrx-eks-lustre-efa` on the node says why;
- a later boot of a node that registered: the Node object exists, and a kubelet cannot add a
  taint to it (the taint flag applies only at registration, and the NodeRestriction admission
  plugin refuses a node changing its own taints), so the unit fails and kubelet, which requires
  it, stays down: the node goes NotReady, its pods are rescheduled, and node auto repair replaces
  it with a fresh instance, which gets a first boot of its own.
"""

from __future__ import annotations

from infra.config import DeploymentConfig
from nvrx_eks.facts.instances import InstanceFacts
from nvrx_eks.facts.names import (
    GPU_TAINT_EFFECT,
    GPU_TAINT_KEY,
    GPU_TAINT_VALUE,
    LUSTRE_EFA_TAINT_KEY,
    LUSTRE_EFA_TAINT_VALUE,
)

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

#: The unit and the script it runs. Changing a byte of the user data makes a new launch
#: template version, which replaces every running GPU node on deploy (one at a time, terminating
#: first: gpu_nodes.py); `nvrx-eks deploy` warns first.
LUSTRE_EFA_UNIT_NAME = "nvrx-eks-lustre-efa.service"
LUSTRE_EFA_SCRIPT_PATH = "/usr/local/sbin/nvrx-eks-lustre-efa"
#: Written at the end of the first boot's set-up, whatever its outcome: from then on the node
#: has registered, and a failure can no longer become a taint.
FIRST_BOOT_DONE_PATH = "/var/lib/nvrx-eks/lustre-efa-first-boot-done"
#: The NodeConfig drop-in a failed first boot leaves for nodeadm-run (a directory it reads).
TAINT_DROP_IN_PATH = "/etc/eks/nodeadm.d/90-nvrx-eks-lustre-efa-missing.yaml"

#: `dnf install lustre-client`: attempts, the first pause (doubled after each failure) and how
#: long one attempt may take. Pauses total 150 s; a repository that is down longer than that
#: taints the node rather than keeping the scale-up waiting.
DNF_ATTEMPTS = 5
DNF_FIRST_PAUSE_S = 10
DNF_ATTEMPT_TIMEOUT_S = 300

#: The taints a node registers with when the set-up failed: the node group's own (the last
#: --register-with-taints flag replaces the earlier ones) and the one naming the problem.
MISSING_TAINTS = (
    f"{GPU_TAINT_KEY}={GPU_TAINT_VALUE}:{GPU_TAINT_EFFECT}",
    f"{LUSTRE_EFA_TAINT_KEY}={LUSTRE_EFA_TAINT_VALUE}:NoSchedule",
)

_TAINT_DROP_IN = f"""# Written by {LUSTRE_EFA_UNIT_NAME}: the Lustre client could not use EFA at first boot.
apiVersion: node.eks.aws/v1alpha1
kind: NodeConfig
spec:
  kubelet:
    flags:
      - --register-with-taints={",".join(MISSING_TAINTS)}
"""

_LUSTRE_EFA_SCRIPT = f"""#!/bin/bash
# Lustre client over EFA for FSx for Lustre (infra/constructs/node_user_data.py: sources, and why
# a failure taints the node at first boot but keeps kubelet down on a later boot).
set -euo pipefail
shopt -s nullglob
exec > >(logger -s -t nvrx-eks-lustre-efa) 2>&1

first_boot_done="__ROOT__{FIRST_BOOT_DONE_PATH}"
taint_drop_in="__ROOT__{TAINT_DROP_IN_PATH}"
problem="a step failed (the lines above say which)"
fail() {{ problem="$*"; exit 1; }}

finish() {{
  local status=$?
  trap - EXIT
  if (( status == 0 )); then
    if [[ -e "$taint_drop_in" ]]; then
      echo "LNet is on EFA now; remove the {LUSTRE_EFA_TAINT_KEY} taint this node registered with" >&2
    fi
    mkdir -p "$(dirname "$first_boot_done")" && touch "$first_boot_done"
    exit 0
  fi
  echo "FSx would mount over TCP, not EFA: $problem" >&2
  if [[ -e "$first_boot_done" ]]; then
    echo "this node registered on an earlier boot and cannot taint itself now: kubelet stays down" >&2
    exit 1
  fi
  mkdir -p "$(dirname "$taint_drop_in")" "$(dirname "$first_boot_done")"
  cat > "$taint_drop_in" <<'NODECONFIG'
__TAINT_DROP_IN__NODECONFIG
  touch "$first_boot_done"
  echo "the node registers with the taint {MISSING_TAINTS[1]}, so no job pod lands on it" >&2
  exit 0
}}
trap finish EXIT

install_lustre_client() {{
  local attempt pause={DNF_FIRST_PAUSE_S}
  for attempt in $(seq 1 {DNF_ATTEMPTS}); do
    timeout {DNF_ATTEMPT_TIMEOUT_S} dnf install -y lustre-client && return 0
    (( attempt < {DNF_ATTEMPTS} )) || break
    echo "dnf install lustre-client failed (attempt $attempt of {DNF_ATTEMPTS}); retrying in ${{pause}}s" >&2
    sleep "$pause"
    pause=$(( pause * 2 ))
  done
  fail "dnf install lustre-client failed {DNF_ATTEMPTS} times"
}}

rpm -q lustre-client >/dev/null || install_lustre_client
modinfo kefalnd >/dev/null 2>&1 || fail "kernel $(uname -r) has no kefalnd module (the EFA LND of lustre-client)"

# The primary ENA interface carries the default route (EFA-only interfaces have no IP address).
eth_intf="$(ip -o -4 route show to default | awk 'NR == 1 {{print $5}}')"
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
echo "found ${{#devices[@]}} EFA device(s)"
for index in __DEVICE_INDEXES__; do
  if (( index < ${{#devices[@]}} )); then
    lnetctl net add --net efa --if "$(basename "${{devices[$index]}}")" --peer-credits 32
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
#: (cloud-init's user data runs before nodeadm-run starts kubelet).
_LUSTRE_EFA_INSTALLER = f"""#!/bin/bash
# Installs the Lustre-over-EFA client set-up as a unit run on every boot (infra/constructs/node_user_data.py).
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


def lustre_efa_taint_drop_in() -> str:
    """The NodeConfig a failed first boot drops into /etc/eks/nodeadm.d/."""
    return _TAINT_DROP_IN


def lustre_efa_client_script(facts: InstanceFacts, *, root: str = "") -> str:
    """The boot script the unit runs. `root` prefixes the two state files (the first-boot mark and
    the taint drop-in) so that a run under stand-in commands keeps them in a scratch directory."""
    indexes = " ".join(str(i) for i in lustre_efa_device_indexes(facts))
    return (
        _LUSTRE_EFA_SCRIPT.replace("__DEVICE_INDEXES__", indexes)
        .replace("__TAINT_DROP_IN__", _TAINT_DROP_IN)
        .replace("__ROOT__", root)
    )


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
