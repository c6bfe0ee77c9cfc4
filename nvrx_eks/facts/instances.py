"""The one table of facts about the EFA-capable instance types this project deploys.

Every other module (launch template, node labels, pod resources, manifest validation, the
checkpoint-interval planner's cost figures) reads from here; nothing restates these numbers.

Sources (checked 2026-11):
- GPUs, vCPUs, memory, NVMe, network bandwidth: https://aws.amazon.com/ec2/instance-types/p5/,
  https://aws.amazon.com/ec2/instance-types/p4/, https://aws.amazon.com/ec2/instance-types/g5/
- Network cards and maximum EFA interfaces: `aws ec2 describe-instance-types --query
  'InstanceTypes[].NetworkInfo.{cards:MaximumNetworkCards,efa:EfaInfo.MaximumEfaInterfaces}'`
  and https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/efa-acc-inst-types.html
- FSx EFA clients: https://docs.aws.amazon.com/fsx/latest/LustreGuide/efa-file-systems.html
- On-Demand vCPU quotas: the Service Quotas console, Amazon EC2 ("Running On-Demand P instances"
  L-417A185B, "Running On-Demand G and VT instances" L-DB2E81BA); the quota counts vCPUs of every
  running instance whose type starts with the class letter.
- On-demand prices: https://aws.amazon.com/ec2/pricing/on-demand/ (us-east-1, Linux), read
  2026-11; p5e.48xlarge is sold through Capacity Blocks only and has no on-demand price.
- Capacity Block prices (capacity_block_usd_per_hour: the reservation fee per instance-hour,
  paid up front at purchase for the whole block; the per-second operating-system fee while
  instances run is not included), read 2026-12-02. ESTIMATES: AWS reprices blocks by supply and
  demand (https://aws.amazon.com/ec2/capacityblocks/pricing/ says when next) and a block costs the
  rate of the day it was bought; its real price is on the purchase (the offering's UpfrontFee).
  The AWS page itself could not be read from here; what was found:
  p5e.48xlarge $39.80 and p5en.48xlarge $41.61 ("most regions", after a ~15% rise in January 2026
  from $34.61 and $36.18: sjramblings.io "Your Inference Bill Is Going Up" and
  administraciondesistemas.com, both quoting the AWS page); p5.48xlarge $34.61 (a third-party
  "Q2 2026 snapshot" in a public cost calculator; ap-south-1's $37.76 in another is consistent;
  a copy of the AWS page from before 2025-01-01 listed $39.33 in us-east-1, so read it as $35-40);
  p4d.24xlarge $14.75 (that same pre-2025 copy: the oldest figure here). g5 is not sold as blocks.
- Peak dense bf16 tensor throughput per GPU (PEAK_BF16_DENSE_TFLOPS): NVIDIA's datasheets give
  the figures with 2:4 sparsity; dense is half. H100 SXM5 and H200 SXM: 1,979 TFLOPS sparse ->
  989 dense (https://www.nvidia.com/en-us/data-center/h100/, .../h200/); A100 SXM: 312 dense
  (https://www.nvidia.com/en-us/data-center/a100/). The A10G is an AWS-specific part with no
  published figure: none is stated, and its MFU is reported as n/a rather than guessed.
- Expected all_reduce bus bandwidth (published_allreduce_busbw_gb_s): nccl-tests all_reduce_perf,
  out-of-place busbw of the largest message on two nodes. p5.48xlarge: 487.09 GB/s at 16 GiB
  (aws-samples/awsome-distributed-training, micro-benchmarks/nccl-tests/README.md, "Results",
  2x p5.48xlarge). No figure is published for p5e, p5en, p4d (the same README's 78.33 GB/s is for
  p4de.24xlarge at 2 GiB) or any g5 type: for those the expected figure is the nominal network
  bandwidth in GB/s (network_gbps / 8), the bound a ring all_reduce's busbw reaches when the
  network is the bottleneck. It is a bound, not a measurement: the two published two-node runs
  beat it (p5 by 1.22x, p4de by 1.57x), because two nodes send less across the network than the
  busbw formula counts. g5's EFA has no RDMA (traffic is staged through host memory): that it
  reaches the pass fraction of its bound on healthy hardware is not measured.
"""

from __future__ import annotations

from dataclasses import dataclass

#: Peak dense bf16 tensor-core TFLOP/s of one GPU, by GPU model (sources in the module docstring).
#: The denominator of MFU (workloads/metrics.py).
PEAK_BF16_DENSE_TFLOPS: dict[str, float] = {"H100": 989.0, "H200": 989.0, "A100": 312.0}

#: One GPU's memory as CUDA reports it (torch.cuda.get_device_properties().total_memory), in MiB,
#: by GPU model: the figure the trainer's model.activation_checkpointing=auto divides on the GPU, so
#: the plan and the job summary divide the same one (InstanceFacts.gpu_cuda_memory_bytes). Less
#: than the marketed size (the driver keeps some back), and it moves a little with the driver.
#: NOT verified on this project's instances: read from published logs of torch's device
#: properties (H100 80GB HBM3: 81089 MiB, 81082-81090 seen with other drivers; H200: 143156;
#: A100-SXM4-40GB: 40536; A10G: 22587). The GPU smoke records the device's own figure beside this
#: one (gpu_smoke.json, device.gpus[].total_memory_bytes and instance_facts_total_memory_bytes).
CUDA_TOTAL_MEMORY_MIB: dict[str, int] = {"H100": 81089, "H200": 143156, "A100": 40536, "A10G": 22587}


def cuda_total_memory_bytes(device_name: str) -> int | None:
    """CUDA_TOTAL_MEMORY_MIB's figure for the GPU model a device name names ("NVIDIA H100 80GB
    HBM3"), in bytes; None for a model the table does not hold."""
    mib = next((mib for model, mib in CUDA_TOTAL_MEMORY_MIB.items() if model in device_name), None)
    return None if mib is None else mib << 20


#: The fabric test passes when the largest all_reduce message reaches this fraction of the
#: expected bus bandwidth: 20% allows for run-to-run spread and another placement than the
#: published run's, while a fallback to TCP or a dead EFA device costs far more than that.
FABRIC_TEST_PASS_FRACTION = 0.8


@dataclass(frozen=True)
class VcpuQuota:
    """The Service Quotas limit on running On-Demand vCPUs that an instance class counts against."""

    code: str
    name: str
    #: The instance class letter: every type whose name starts with it counts (p5 and p4d alike).
    instance_class: str

    def counts(self, instance_type: str) -> bool:
        return instance_type.startswith(self.instance_class)


#: The On-Demand vCPU quotas of the GPU instance classes (sources in the module docstring).
ON_DEMAND_VCPU_QUOTAS = {
    quota.instance_class: quota
    for quota in (
        VcpuQuota("L-417A185B", "Running On-Demand P instances", "p"),
        VcpuQuota("L-DB2E81BA", "Running On-Demand G and VT instances", "g"),
    )
}


@dataclass(frozen=True)
class InstanceFacts:
    instance_type: str
    gpu_model: str
    gpus: int
    gpu_memory_gib: int  # per GPU
    vcpus: int
    memory_gib: int
    network_cards: int
    efa_interfaces: int  # maximum EFA interfaces the type supports: one per network card here
    network_gbps: int
    nvme_gib: int  # local instance-store NVMe, total
    on_demand_usd_per_hour: float | None  # us-east-1; None where no on-demand offer exists
    #: A Capacity Block's reservation fee per instance-hour (an estimate: module docstring);
    #: None where the type is not sold as Capacity Blocks.
    capacity_block_usd_per_hour: float | None = None
    #: Can mount an EFA-enabled FSx for Lustre file system over EFA (with GPUDirect Storage):
    #: FSx names P5, P5e, P5en (and P6-B200) as its EFA/GDS clients; p4d and g5 use TCP (ENA).
    fsx_efa_client: bool = False
    #: The EFA device supports RDMA (read), so NCCL can move GPU memory straight to the NIC
    #: (GPUDirect RDMA). g5's EFA has no RDMA: traffic is staged through host memory.
    efa_rdma: bool = False
    #: NUMA nodes (CPU sockets) the GPUs are spread over, in GPU index order: 2-socket hosts
    #: (p5: 2x AMD EPYC 7R13 for 192 vCPUs; p4d: 2x Xeon 8275CL; g5.48xlarge: 2x EPYC 7R32)
    #: carry GPUs 0-3 on node 0 and 4-7 on node 1. ft_launcher binds ranks by it.
    numa_nodes: int = 1
    #: EFA devices that share one PCIe switch, where they sit four to a switch (p5, p5e): one
    #: device per switch carries Lustre (the EKS guide's layout: every 4th device). None: the
    #: guide gives no layout, and the first and the last device carry it.
    efa_devices_per_pcie_switch: int | None = None
    #: nccl-tests all_reduce busbw (GB/s) of the largest message on two nodes, where a run is
    #: published (source in the module docstring); None: nothing is published for the type.
    published_allreduce_busbw_gb_s: float | None = None

    @property
    def family(self) -> str:
        return self.instance_type.split(".", 1)[0]

    @property
    def on_demand_vcpu_quota(self) -> VcpuQuota:
        return ON_DEMAND_VCPU_QUOTAS[self.family[0]]

    @property
    def gpu_cuda_memory_bytes(self) -> int:
        """One GPU's memory as CUDA reports it (CUDA_TOTAL_MEMORY_MIB): what must hold the job."""
        return CUDA_TOTAL_MEMORY_MIB[self.gpu_model] << 20

    @property
    def peak_bf16_tflops(self) -> float | None:
        """Per GPU, dense; None where no figure is published (see the module docstring)."""
        return PEAK_BF16_DENSE_TFLOPS.get(self.gpu_model)

    @property
    def expected_allreduce_busbw_gb_s(self) -> float:
        """The published figure, else the nominal network bandwidth in GB/s (module docstring)."""
        if self.published_allreduce_busbw_gb_s is not None:
            return self.published_allreduce_busbw_gb_s
        return self.network_gbps / 8

    @property
    def fabric_test_min_busbw_gb_s(self) -> float:
        """The bus bandwidth the fabric test's largest message must reach to pass."""
        return round(FABRIC_TEST_PASS_FRACTION * self.expected_allreduce_busbw_gb_s, 1)

    @property
    def gpus_per_efa(self) -> float:
        return self.gpus / self.efa_interfaces

    @property
    def allocatable_memory_gib(self) -> int:
        """Memory a pod can request: leave 10% (min 8 GiB) for the kubelet, system daemons and
        the page cache the Lustre client needs."""
        return self.memory_gib - max(8, self.memory_gib // 10)

    @property
    def allocatable_vcpus(self) -> int:
        """vCPUs a pod can request: leave 4 (min 10%) for kubelet, device plugins and daemonsets."""
        return self.vcpus - max(4, self.vcpus // 10)


def _p5_class(
    instance_type: str,
    gpu: str,
    gpu_memory_gib: int,
    cards: int,
    usd: float | None,
    block_usd: float,
    per_switch: int | None,
    busbw: float | None = None,
) -> InstanceFacts:
    """p5 / p5e / p5en share everything but the GPU and the network card layout."""
    return InstanceFacts(
        instance_type, gpu, gpus=8, gpu_memory_gib=gpu_memory_gib, vcpus=192, memory_gib=2048,
        network_cards=cards, efa_interfaces=cards, network_gbps=3200, nvme_gib=8 * 3576,
        on_demand_usd_per_hour=usd, capacity_block_usd_per_hour=block_usd,
        fsx_efa_client=True, efa_rdma=True, numa_nodes=2,
        efa_devices_per_pcie_switch=per_switch, published_allreduce_busbw_gb_s=busbw,
    )  # fmt: skip


INSTANCE_FACTS: dict[str, InstanceFacts] = {
    f.instance_type: f
    for f in (
        # 8x H100 SXM 80 GB; 32 network cards, EFAv2 at 3200 Gbps in total; 8x 3.84 TB NVMe.
        _p5_class("p5.48xlarge", "H100", 80, cards=32, usd=55.04, block_usd=34.61, per_switch=4, busbw=487.09),
        # 8x H200 141 GB; same network layout as p5; sold as Capacity Blocks only.
        _p5_class("p5e.48xlarge", "H200", 141, cards=32, usd=None, block_usd=39.80, per_switch=4),
        # 8x H200 141 GB; EFAv3 on 16 network cards, 3200 Gbps in total.
        _p5_class("p5en.48xlarge", "H200", 141, cards=16, usd=63.30, block_usd=41.61, per_switch=None),
        # 8x A100 40 GB; 4 network cards, EFA at 400 Gbps; 8x 1 TB NVMe.
        InstanceFacts(
            "p4d.24xlarge",
            "A100",
            gpus=8,
            gpu_memory_gib=40,
            vcpus=96,
            memory_gib=1152,
            network_cards=4,
            efa_interfaces=4,
            network_gbps=400,
            nvme_gib=8 * 931,
            on_demand_usd_per_hour=21.96,
            capacity_block_usd_per_hour=14.75,
            efa_rdma=True,
            numa_nodes=2,
        ),  # fmt: skip
        # Low-cost rehearsal types: A10G 24 GB GPUs, one EFA interface, no RDMA.
        InstanceFacts(
            "g5.8xlarge",
            "A10G",
            gpus=1,
            gpu_memory_gib=24,
            vcpus=32,
            memory_gib=128,
            network_cards=1,
            efa_interfaces=1,
            network_gbps=25,
            nvme_gib=838,
            on_demand_usd_per_hour=2.448,
        ),  # fmt: skip
        InstanceFacts(
            "g5.12xlarge",
            "A10G",
            gpus=4,
            gpu_memory_gib=24,
            vcpus=48,
            memory_gib=192,
            network_cards=1,
            efa_interfaces=1,
            network_gbps=40,
            nvme_gib=3539,
            on_demand_usd_per_hour=5.672,
        ),  # fmt: skip
        InstanceFacts(
            "g5.48xlarge",
            "A10G",
            gpus=8,
            gpu_memory_gib=24,
            vcpus=192,
            memory_gib=768,
            network_cards=1,
            efa_interfaces=1,
            network_gbps=100,
            nvme_gib=7078,
            on_demand_usd_per_hour=16.288,
            numa_nodes=2,
        ),  # fmt: skip
    )
}


def facts_for(instance_type: str) -> InstanceFacts:
    """Facts for an instance type, or a ValueError that lists the supported ones."""
    try:
        return INSTANCE_FACTS[instance_type]
    except KeyError:
        supported = ", ".join(sorted(INSTANCE_FACTS))
        raise ValueError(
            f"'{instance_type}' is not a supported EFA-capable GPU instance type; use one of: {supported}"
        ) from None


#: Where each kind of node price comes from (module docstring), as the cost lines name it.
ON_DEMAND_PRICE_SOURCE = "the on-demand price, us-east-1 Linux, read 2026-11"
CAPACITY_BLOCK_PRICE_SOURCE = (
    "the Capacity Block reservation fee: an ESTIMATE read 2026-12-02 from reports of the AWS page (your block's "
    "price is on its purchase)"
)


@dataclass(frozen=True)
class NodePrice:
    """What one GPU node costs per hour, and on what terms (nvrx_eks/facts/instances.py)."""

    usd_per_hour: float
    #: How it is bought: "on-demand" or "Capacity Block".
    basis: str
    source: str
    #: A Capacity Block is paid at purchase for its whole duration, used or not: an idle or lost
    #: hour of it is work not done, not money that stopping would save.
    paid_up_front: bool


def node_price(facts: InstanceFacts, capacity_type: str) -> NodePrice | None:
    """The price a node group of `capacity_type` (gpu_nodes.capacity_type: on-demand or
    capacity-block) pays per node-hour; None where the type is not sold that way."""
    if capacity_type == "capacity-block":
        usd = facts.capacity_block_usd_per_hour
        return None if usd is None else NodePrice(usd, "Capacity Block", CAPACITY_BLOCK_PRICE_SOURCE, True)
    usd = facts.on_demand_usd_per_hour
    return None if usd is None else NodePrice(usd, "on-demand", ON_DEMAND_PRICE_SOURCE, False)
