"""The sections of a deployment config: endpoint, GPU and system node groups, FSx, add-ons, image,
and an existing cluster the job commands use instead of one deployed here.

Each section validates its own fields and names the fix; DeploymentConfig (infra/config/deployment.py)
composes them and checks what spans sections.
"""

from __future__ import annotations

import ipaddress
import re
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from infra.addons import catalog
from nvrx_eks.facts.instances import INSTANCE_FACTS, InstanceFacts, facts_for
from nvrx_eks.facts.names import GPU_NODE_LABEL_KEY, INSTANCE_TYPE_LABEL_KEY, RUNS_COPY_PREFIX

#: FSx for Lustre PERSISTENT_2 on SSD: throughput tiers in MB/s per TiB of storage.
PERSISTENT_2_THROUGHPUT_TIERS = (125, 250, 500, 1000)
#: Metadata IOPS values FSx accepts for SSD file systems in USER_PROVISIONED mode.
_METADATA_IOPS = (1500, 3000, 6000) + tuple(range(12000, 192001, 12000))
#: Storage step of an EFA-enabled PERSISTENT_2 SSD file system, by throughput tier.
EFA_CAPACITY_STEP_GIB = {1000: 4800, 500: 9600, 250: 19200, 125: 38400}

_RESERVATION_RE = re.compile(r"^cr-[0-9a-f]{8,17}$")
_PLACEMENT_GROUP_RE = re.compile(r"^(?! *$)[ -~]{1,255}$")
_IMAGE_URI_RE = re.compile(r"^[a-z0-9.-]+(:\d+)?/[a-z0-9._/-]+(:[\w.-]+|@sha256:[0-9a-f]{64})$")


def ipv4_network(cidr: str, hint: str = "") -> ipaddress.IPv4Network:
    """The network a CIDR names, or a ValueError that says why it is not one (and `hint`)."""
    try:
        return ipaddress.IPv4Network(cidr, strict=True)
    except ValueError as e:
        raise ValueError(f"'{cidr}' is not an IPv4 network in CIDR form ({e}){hint}") from None


def _require_ordered_sizes(min_size: int, desired_size: int, max_size: int) -> None:
    if not min_size <= desired_size <= max_size:
        raise ValueError(
            f"node counts must satisfy min_size <= desired_size <= max_size, got "
            f"{min_size} <= {desired_size} <= {max_size}; adjust them"
        )


class StrictModel(BaseModel):
    """Unknown keys are errors: a typo in a profile must not silently fall back to a default."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class EndpointConfig(StrictModel):
    """Who can reach the Kubernetes API server."""

    access: Literal["private", "public-and-private"] = "private"
    #: With public-and-private: the only CIDRs allowed to reach the public endpoint.
    public_cidrs: list[str] = Field(default_factory=list)
    #: The explicit flag required to open the public endpoint to 0.0.0.0/0.
    allow_public_internet: bool = False

    @field_validator("public_cidrs")
    @classmethod
    def _cidrs_are_networks(cls, cidrs: list[str]) -> list[str]:
        for cidr in cidrs:
            ipv4_network(cidr, "; write it like 203.0.113.0/24 with the host bits zero")
        return cidrs

    @model_validator(mode="after")
    def _public_access_is_restricted(self) -> EndpointConfig:
        if self.access == "private" and self.public_cidrs:
            raise ValueError(
                "public_cidrs is set but access is 'private'; set access: public-and-private to use "
                "them, or remove public_cidrs"
            )
        if self.access == "public-and-private":
            if not self.public_cidrs:
                raise ValueError(
                    "access 'public-and-private' needs public_cidrs: list the networks allowed to "
                    "reach the API (e.g. your office's /32), or use access: private"
                )
            if "0.0.0.0/0" in self.public_cidrs and not self.allow_public_internet:
                raise ValueError(
                    "public_cidrs contains 0.0.0.0/0, which opens the Kubernetes API to the whole "
                    "internet; list specific networks, or set allow_public_internet: true if you "
                    "really mean it"
                )
        return self


class GpuNodeGroupConfig(StrictModel):
    instance_type: str = "p5.48xlarge"
    #: The GPU nodes `nvrx-eks capacity up` starts unless told otherwise, and the node count a job
    #: gets without --nodes. The node group itself is always created empty (infra/constructs/
    #: gpu_nodes.py): a deploy never waits for GPU capacity, and a shortfall fails one scaling
    #: request instead of rolling back the cluster stack.
    desired_size: Annotated[int, Field(ge=1)] = 2
    #: The most GPU nodes the group may run: the largest job (active plus spare nodes) it can hold.
    max_size: Annotated[int, Field(ge=1)] = 2
    #: on-demand (optionally into an On-Demand Capacity Reservation) or a Capacity Block for ML.
    capacity_type: Literal["on-demand", "capacity-block"] = "on-demand"
    capacity_reservation_id: str | None = None
    #: A cluster placement group this stack creates, for lowest EFA latency. Must be off with a
    #: capacity reservation: a reservation is placed when it is created, and a group this stack
    #: creates cannot hold it.
    placement_group: bool = True
    #: An existing cluster placement group to launch into instead: the one an On-Demand Capacity
    #: Reservation was created in (its PlacementGroupArn), which the EC2 guide has you name when
    #: launching into such a reservation.
    placement_group_name: str | None = None
    root_volume_gib: Annotated[int, Field(ge=100, le=16384)] = 500
    #: EKS node auto repair: replaces nodes whose GPU/EFA/kubelet health checks fail. The
    #: eks-node-monitoring-agent add-on that reports those checks is installed with it.
    auto_repair: bool = True

    @field_validator("instance_type")
    @classmethod
    def _known_efa_type(cls, instance_type: str) -> str:
        facts_for(instance_type)  # raises with the list of supported types
        return instance_type

    @field_validator("capacity_reservation_id")
    @classmethod
    def _reservation_id_format(cls, rid: str | None) -> str | None:
        if rid is not None and not _RESERVATION_RE.match(rid):
            raise ValueError(f"'{rid}' is not a capacity reservation id; it looks like cr-0123456789abcdef0")
        return rid

    @field_validator("placement_group_name")
    @classmethod
    def _placement_group_name(cls, name: str | None) -> str | None:
        if name is not None and not _PLACEMENT_GROUP_RE.match(name):
            raise ValueError(
                f"'{name}' is not a placement group name (1-255 ASCII characters; `aws ec2 describe-capacity-"
                "reservations --query 'CapacityReservations[].PlacementGroupArn'` names the reservation's)"
            )
        return name

    @model_validator(mode="after")
    def _sizes_and_capacity(self) -> GpuNodeGroupConfig:
        if self.desired_size > self.max_size:
            raise ValueError(
                f"desired_size {self.desired_size} is more than max_size {self.max_size}: node counts must satisfy "
                "desired_size <= max_size; raise max_size or lower desired_size"
            )
        if self.capacity_type == "capacity-block" and self.capacity_reservation_id is None:
            raise ValueError(
                "capacity_type 'capacity-block' needs capacity_reservation_id: the id (cr-...) of "
                "the Capacity Block you purchased"
            )
        if self.capacity_reservation_id is not None and self.placement_group:
            raise ValueError(
                "placement_group must be false when capacity_reservation_id is set: the reservation "
                "fixes placement already and cannot live in a placement group this stack creates "
                "(a reservation made in a cluster placement group: name that group in placement_group_name)"
            )
        if self.placement_group_name is not None and (
            self.placement_group or self.capacity_type != "on-demand" or self.capacity_reservation_id is None
        ):
            raise ValueError(
                "placement_group_name names the cluster placement group an On-Demand Capacity Reservation was "
                "created in: use it with capacity_type on-demand, capacity_reservation_id and placement_group: false"
            )
        return self

    @property
    def facts(self) -> InstanceFacts:
        return INSTANCE_FACTS[self.instance_type]


class SystemNodeGroupConfig(StrictModel):
    """Small on-demand nodes for CoreDNS, controllers and add-ons, so GPU nodes run only training."""

    instance_type: str = "m7i.xlarge"
    min_size: Annotated[int, Field(ge=1)] = 2
    desired_size: Annotated[int, Field(ge=1)] = 2
    max_size: Annotated[int, Field(ge=1)] = 4

    @model_validator(mode="after")
    def _sizes(self) -> SystemNodeGroupConfig:
        _require_ordered_sizes(self.min_size, self.desired_size, self.max_size)
        if self.instance_type in INSTANCE_FACTS:
            raise ValueError(
                f"{self.instance_type} is a GPU type; the system node group should be a small "
                "general-purpose type such as m7i.xlarge"
            )
        return self


class FsxConfig(StrictModel):
    """FSx for Lustre PERSISTENT_2 (SSD) in the GPU availability zone."""

    storage_gib: int = 4800
    throughput_per_tib: int = 250
    #: EFA + GPUDirect Storage between GPU nodes and the file system (fixed at creation).
    efa_enabled: bool = False
    #: None: AUTOMATIC metadata IOPS scaled with capacity. A number: USER_PROVISIONED IOPS.
    metadata_iops: int | None = None
    compression: Literal["LZ4", "NONE"] = "LZ4"
    #: Directory in the file system linked to the data bucket (data repository association).
    data_repository_path: str = "/s3"
    #: Prefix in the data bucket that the association imports from and exports to. It must not
    #: overlap the prefix that receives the run directories' export (`runs`).
    data_bucket_prefix: str = "data"
    #: Days S3 keeps the exported copy of a run file (checkpoint shard, commit record, events)
    #: once the file was deleted or replaced on Lustre; the copy of a file still there never
    #: expires. The export is the second copy of checkpoints: FSx takes no backups of a file
    #: system linked to S3. What this parks scales with the checkpoint cadence: every save retires
    #: the oldest checkpoint, so a run parks (checkpoint size) x (saves per day) x this many days.
    #: The 8b default job on 2 p5 (96 GB of state, a save about every 62 minutes: `nvrx-eks plan`)
    #: retires about 2.2 TB a day: 3 days park about 7 TB (some $150 a month in S3 Standard, an
    #: estimate), where 30 parked about 67 TB. 3 days still undo a mistaken delete found after a
    #: weekend; raise it if you must reach further back than the checkpoints kept on Lustre.
    runs_copy_days: Annotated[int, Field(ge=1, le=3650)] = 3
    #: What `cdk destroy` does with the file system and the data bucket. Training data and
    #: checkpoints live there, so they are kept unless the profile says otherwise.
    removal_policy: Literal["retain", "destroy"] = "retain"

    @field_validator("throughput_per_tib")
    @classmethod
    def _throughput_tier(cls, value: int) -> int:
        if value not in PERSISTENT_2_THROUGHPUT_TIERS:
            raise ValueError(
                f"{value} MB/s/TiB is not a PERSISTENT_2 throughput tier; use one of "
                f"{', '.join(map(str, PERSISTENT_2_THROUGHPUT_TIERS))}"
            )
        return value

    @field_validator("metadata_iops")
    @classmethod
    def _metadata_iops(cls, iops: int | None) -> int | None:
        if iops is not None and iops not in _METADATA_IOPS:
            raise ValueError(
                f"{iops} is not a valid SSD metadata IOPS value; use 1500, 3000, 6000, 12000 or a "
                "multiple of 12000 up to 192000, or omit it for AUTOMATIC"
            )
        return iops

    @field_validator("data_repository_path")
    @classmethod
    def _dra_path(cls, path: str) -> str:
        if not re.fullmatch(r"/[A-Za-z0-9._-]+(/[A-Za-z0-9._-]+)*", path):
            raise ValueError(f"'{path}' must be an absolute directory below the root, such as /s3")
        return path

    @field_validator("data_bucket_prefix")
    @classmethod
    def _data_prefix(cls, prefix: str) -> str:
        first = prefix.strip("/").split("/")[0]
        if first in ("", RUNS_COPY_PREFIX):
            raise ValueError(
                f"'{prefix}' would overlap the '{RUNS_COPY_PREFIX}/' prefix that receives the export of the run "
                "directories (two data repository associations cannot share S3 paths); use a prefix such as data"
            )
        return prefix

    @model_validator(mode="after")
    def _capacity_for_layout(self) -> FsxConfig:
        # FSx sizes storage in whole storage servers. Without EFA: 1.2 TiB, 2.4 TiB or steps of
        # 2.4 TiB. With EFA each server holds more, so the step depends on the throughput tier
        # (FSx for Lustre User Guide, getting-started.html; FSx counts 1 TiB as 1000 GiB here).
        step = EFA_CAPACITY_STEP_GIB[self.throughput_per_tib] if self.efa_enabled else 2400
        valid = self.storage_gib > 0 and self.storage_gib % step == 0
        if not self.efa_enabled and self.storage_gib == 1200:
            valid = True
        if not valid:
            nearest = max(step, round(self.storage_gib / step) * step)
            layout = (
                f"EFA-enabled at {self.throughput_per_tib} MB/s/TiB needs a multiple of {step} GiB"
                if self.efa_enabled
                else "PERSISTENT_2 SSD needs 1200, 2400 or a multiple of 2400 GiB"
            )
            raise ValueError(f"storage_gib {self.storage_gib} is not valid: {layout} (nearest: {nearest})")
        return self

    @property
    def throughput_mbps(self) -> int:
        """Aggregate throughput in MB/s: storage in TiB times the tier, where FSx counts a TiB as
        1000 GiB (4800 GiB at 1000 MB/s/TiB is 4800 MB/s)."""
        return self.storage_gib * self.throughput_per_tib // 1000


def _pin(addon: catalog.ManagedAddon) -> str:
    """A managed add-on's pinned build: only those that follow the Kubernetes minor have none."""
    assert addon.version is not None, addon.name
    return addon.version


class AddonVersions(StrictModel):
    """Overrides of the pinned add-on and chart versions; each defaults to its record's pin in
    infra/addons/catalog.py. The per-minor EKS add-ons default to None: the build
    nvrx_eks/facts/kubernetes_versions.py pins for `kubernetes_version`."""

    vpc_cni: str | None = None
    coredns: str | None = None
    kube_proxy: str | None = None
    pod_identity_agent: str | None = None
    node_monitoring_agent: str | None = None
    fsx_csi_driver: str = _pin(catalog.FSX_CSI_DRIVER)
    cloudwatch_observability: str = _pin(catalog.CLOUDWATCH_OBSERVABILITY)
    efa_device_plugin_chart: str = catalog.EFA_DEVICE_PLUGIN.version
    nvidia_device_plugin_chart: str = catalog.NVIDIA_DEVICE_PLUGIN.version
    dcgm_exporter_chart: str = catalog.DCGM_EXPORTER.version
    jobset_chart: str = catalog.JOBSET.version
    training_operator: str = catalog.TRAINING_OPERATOR.version
    #: Image of the one-shot Job that applies the training operator's kustomize overlay
    #: (it needs kubectl and git, which the kubectl provider Lambda cannot do for remote bases).
    #: None: the image nvrx_eks/facts/kubernetes_versions.py pins for `kubernetes_version`.
    training_operator_installer_image: str | None = None


class AddonsConfig(StrictModel):
    versions: AddonVersions = AddonVersions()
    install_training_operator: bool = False
    #: GPU metrics: the CloudWatch observability add-on (Container Insights, which runs its own
    #: DCGM exporter on GPU nodes), or a standalone DCGM exporter for Prometheus. One of them.
    cloudwatch_observability: bool = True
    dcgm_exporter: bool = False

    @model_validator(mode="after")
    def _one_dcgm_exporter(self) -> AddonsConfig:
        if self.cloudwatch_observability and self.dcgm_exporter:
            raise ValueError(
                "dcgm_exporter and cloudwatch_observability both run a DCGM exporter on every GPU "
                "node and would collide on its port; enable only one of them"
            )
        return self


class ImageConfig(StrictModel):
    """The trainer image: built from workloads/ at deploy time, or an existing URI."""

    build: bool = True
    uri: str | None = None

    @model_validator(mode="after")
    def _one_source(self) -> ImageConfig:
        if self.build and self.uri:
            raise ValueError("set either build: true or uri, not both")
        if not self.build and not self.uri:
            raise ValueError("set build: true to build workloads/Dockerfile at deploy time, or give uri")
        if self.uri and not _IMAGE_URI_RE.match(self.uri):
            raise ValueError(
                f"'{self.uri}' is not an image reference with a tag or digest, such as "
                "123456789012.dkr.ecr.us-east-1.amazonaws.com/trainer:1.0"
            )
        return self


#: A Kubernetes object name that is also a DNS label (namespaces, claims).
_DNS_LABEL_RE = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
#: A label key: an optional DNS-subdomain prefix and '/', then a name of 1-63 characters.
_LABEL_KEY_RE = re.compile(
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$"
)
_LABEL_VALUE_RE = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?$")


class ExistingClusterConfig(StrictModel):
    """A Kubernetes cluster this project did not create, as the job commands reach it: when a
    config has this section, render, validate, submit, status, logs, delete and preflight use it
    instead of the cluster stack's outputs, and nothing is deployed for it. The GPU nodes are
    still described by gpu_nodes (instance_type sizes the pods, max_size caps a job) and the
    cluster's Kubernetes version by kubernetes_version."""

    #: The kubeconfig context that names the cluster and the credentials (as `kubectl --context`).
    context: str
    #: The kubeconfig file; None: $KUBECONFIG, else ~/.kube/config, as kubectl reads them.
    kubeconfig: str | None = None
    #: Where the jobs, their ConfigMaps and NetworkPolicies go; it must exist.
    namespace: str
    #: A ReadWriteMany claim in `namespace` (an FSx for Lustre file system bound statically, or any
    #: shared file system): mounted at /fsx in every pod for data, checkpoints and run directories.
    pvc: str
    #: The trainer image the pods run (a tag or digest; nothing is built for this cluster).
    image: str
    #: Labels the pods select on beyond the two every job pod selects (the GPU pool label and the
    #: instance type), e.g. a node pool of your own.
    node_selector: dict[str, str] = Field(default_factory=dict)

    @field_validator("context")
    @classmethod
    def _context(cls, context: str) -> str:
        if not context.strip():
            raise ValueError("give the kubeconfig context of the cluster (`kubectl config get-contexts` lists them)")
        return context

    @field_validator("namespace", "pvc")
    @classmethod
    def _dns_label(cls, name: str) -> str:
        if len(name) > 63 or not _DNS_LABEL_RE.match(name):
            raise ValueError(
                f"'{name}' is not a Kubernetes name: lower-case letters, digits and '-', at most 63 characters"
            )
        return name

    @field_validator("image")
    @classmethod
    def _image(cls, uri: str) -> str:
        if not _IMAGE_URI_RE.match(uri):
            raise ValueError(
                f"'{uri}' is not an image reference with a tag or digest, such as "
                "123456789012.dkr.ecr.us-east-1.amazonaws.com/trainer:1.0"
            )
        return uri

    @field_validator("node_selector")
    @classmethod
    def _labels(cls, selector: dict[str, str]) -> dict[str, str]:
        for key, value in selector.items():
            if key in (GPU_NODE_LABEL_KEY, INSTANCE_TYPE_LABEL_KEY):
                raise ValueError(
                    f"'{key}' is selected on by every job pod already (the GPU pool label, and the instance type "
                    "from gpu_nodes.instance_type); remove it"
                )
            if len(key) > 253 or not _LABEL_KEY_RE.match(key):
                raise ValueError(f"'{key}' is not a label key such as example.com/pool")
            if not isinstance(value, str) or not _LABEL_VALUE_RE.match(value):
                raise ValueError(f"{key}: '{value}' is not a label value (at most 63 letters, digits, '-', '_', '.')")
        return selector
