"""Names the stacks create and the job manifests rely on: stated here once, used by both sides."""

from __future__ import annotations

#: A deployment's name when its config gives none: the prefix of its stacks, its cluster's name.
DEFAULT_DEPLOYMENT_NAME = "nvrx-eks"

#: Namespace where training jobs, the FSx PVC and the trainer ConfigMaps live.
TRAINING_NAMESPACE = "training"
#: Static PersistentVolume / PersistentVolumeClaim bound to the FSx for Lustre file system.
FSX_PV_NAME = "fsx-lustre-pv"
FSX_PVC_NAME = "fsx-lustre"
FSX_STORAGE_CLASS = ""  # static provisioning: empty class so no dynamic provisioner claims it
#: Where the FSx claim is mounted in every pod: data, checkpoints and run directories live there.
FSX_MOUNT_PATH = "/fsx"
#: Directory of the file system that holds the jobs' run directories (checkpoints, events);
#: pods see it as <mount path>/runs. Exported to S3 as the second copy of checkpoints.
FSX_RUNS_PATH = "/runs"
#: The same directory relative to the claim's root, as a pod's volume mount names it (subPath):
#: each job's run directory is <RUNS_DIR>/<job name> (job_names.run_dir_on_claim), the only part
#: of the claim its pods may mount writable (infra/pod_security.py).
RUNS_DIR = FSX_RUNS_PATH.strip("/")
#: Prefix of the data bucket that receives that export.
RUNS_COPY_PREFIX = "runs"

#: Label on GPU nodes (node group labels) that job pods select on, and its value.
GPU_NODE_LABEL_KEY = "nvrx-eks.io/node-pool"
GPU_NODE_LABEL_VALUE = "gpu"
SYSTEM_NODE_LABEL_VALUE = "system"
#: Label carrying the instance type, so pods can assert they landed on the expected hardware.
INSTANCE_TYPE_LABEL_KEY = "node.kubernetes.io/instance-type"
#: Taint on GPU nodes so only GPU workloads (and the GPU daemonsets) schedule there.
GPU_TAINT_KEY = "nvidia.com/gpu"
GPU_TAINT_VALUE = "present"
GPU_TAINT_EFFECT = "NoSchedule"
#: Taint a GPU node registers with when its Lustre client could not be put on EFA at first boot
#: (infra/constructs/node_user_data.py): the node joins, so a deploy or scale-up completes, but
#: no job pod tolerates it, so none trains on a file system reached over TCP.
LUSTRE_EFA_TAINT_KEY = "nvrx-eks.io/lustre-efa"
LUSTRE_EFA_TAINT_VALUE = "missing"

#: Extended resources advertised by the device plugins.
GPU_RESOURCE = "nvidia.com/gpu"
EFA_RESOURCE = "vpc.amazonaws.com/efa"

#: Tag put on every resource of a deployment; teardown sweeps orphans by it.
DEPLOYMENT_TAG_KEY = "nvrx-eks:deployment"
#: Label EKS puts on every node of a managed node group: the group's name.
NODEGROUP_LABEL_KEY = "eks.amazonaws.com/nodegroup"
