"""What `cdk deploy` would create, checked on the synthesized templates of the shipped profiles.

One synthesis per profile per session (see conftest.synth); cdk-nag runs in every synthesis, so
each of these tests also fails if an unacknowledged cdk-nag finding appears. One module over 500
lines because its tests share one synthesis per profile; they read one stack after another.
"""

from __future__ import annotations

import email
import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from aws_cdk.assertions import Match, Template
from rich.console import Console

from infra.config import PROFILES_DIR, load_config, resolve_config
from infra.constructs.node_user_data import lustre_efa_user_data
from nvrx_eks.deploy.synth import print_summary
from nvrx_eks.facts.errors import ConfigError
from nvrx_eks.facts.instances import facts_for
from nvrx_eks.facts.kubernetes_versions import SUPPORTED_KUBERNETES_VERSIONS
from nvrx_eks.facts.names import (
    DEPLOYMENT_TAG_KEY,
    FSX_PVC_NAME,
    FSX_RUNS_PATH,
    GPU_NODE_LABEL_KEY,
    GPU_NODE_LABEL_VALUE,
    GPU_TAINT_KEY,
    RUNS_COPY_PREFIX,
    TRAINING_NAMESPACE,
)
from nvrx_eks.facts.stack_outputs import REQUIRED_OUTPUTS
from tests.support.cluster_template import gpu_nodegroup, launch_template_data, system_nodegroup

pytestmark = [pytest.mark.synth, pytest.mark.xdist_group("synth")]


def template(synthesized, role: str) -> Template:
    return Template.from_json(synthesized.templates[role])


# --- GPU nodes: launch template wired for EFA --------------------------------------------------


@pytest.mark.parametrize("profile", ["p5", "p5en", "g5-smoke", "p5-capacity-block"])
def test_gpu_node_updates_terminate_before_they_launch(synth, profile):
    """A reservation, a Capacity Block or a full placement group has no spare GPU instance for the
    default launch-first update: one node at a time, terminated first."""
    assert gpu_nodegroup(synth(profile))["UpdateConfig"] == {"MaxUnavailable": 1, "UpdateStrategy": "MINIMAL"}


@pytest.mark.parametrize("profile,interfaces", [("p5", 32), ("p5en", 16), ("g5-smoke", 1), ("p5-capacity-block", 32)])
def test_launch_template_attaches_every_efa_interface(synth, profile, interfaces):
    synthesized = synth(profile)
    data = launch_template_data(synthesized)
    nics = data["NetworkInterfaces"]
    assert len(nics) == interfaces == facts_for(synthesized.config.gpu_nodes.instance_type).efa_interfaces
    assert [n["NetworkCardIndex"] for n in nics] == list(range(interfaces))
    assert nics[0]["InterfaceType"] == "efa" and nics[0]["DeviceIndex"] == 0
    assert all(n["InterfaceType"] == "efa-only" for n in nics[1:])
    # Security groups go on every interface: the EFA group (self-referencing) and the cluster's.
    assert all(len(n["Groups"]) == 2 for n in nics)
    assert "SecurityGroupIds" not in data
    assert data["InstanceType"] == synthesized.config.gpu_nodes.instance_type


def test_launch_template_hardening_and_storage(synth):
    data = launch_template_data(synth("p5"))
    assert data["MetadataOptions"]["HttpTokens"] == "required"
    assert data["MetadataOptions"]["HttpPutResponseHopLimit"] == 1
    (root,) = data["BlockDeviceMappings"]
    assert root["Ebs"] == {"VolumeSize": 500, "VolumeType": "gp3", "Encrypted": True, "DeleteOnTermination": True}


def test_p5_nodes_in_cluster_placement_group(synth):
    synthesized = synth("p5")
    group = synthesized.one("cluster", "AWS::EC2::PlacementGroup")
    assert group["Properties"]["Strategy"] == "cluster"
    (group_id,) = synthesized.resources("cluster", "AWS::EC2::PlacementGroup")
    assert launch_template_data(synthesized)["Placement"] == {"GroupName": {"Ref": group_id}}


def test_capacity_block_profile_targets_the_reservation(synth):
    synthesized = synth("p5-capacity-block")
    data = launch_template_data(synthesized)
    assert data["InstanceMarketOptions"] == {"MarketType": "capacity-block"}
    target = data["CapacityReservationSpecification"]["CapacityReservationTarget"]
    assert target["CapacityReservationId"] == synthesized.config.gpu_nodes.capacity_reservation_id
    assert "Placement" not in data
    assert not synthesized.resources("cluster", "AWS::EC2::PlacementGroup")
    assert gpu_nodegroup(synthesized)["CapacityType"] == "CAPACITY_BLOCK"
    # Created empty, as every profile's (test_first_deploy.py): instances cannot launch before the
    # block starts; `nvrx-eks capacity up` scales it to desired_size, the block's size, then.
    assert gpu_nodegroup(synthesized)["ScalingConfig"] == {"MinSize": 0, "DesiredSize": 0, "MaxSize": 2}
    assert synthesized.config.gpu_nodes.desired_size == 2
    assert synthesized.templates["cluster"]["Outputs"]["GpuNodeCount"]["Value"] == "2"


def test_gpu_nodegroup(synth):
    synthesized = synth("p5")
    nodegroup = gpu_nodegroup(synthesized)
    assert nodegroup["AmiType"] == "AL2023_x86_64_NVIDIA"
    assert nodegroup["CapacityType"] == "ON_DEMAND"
    assert nodegroup["ScalingConfig"] == {"MinSize": 0, "DesiredSize": 0, "MaxSize": 2}
    assert nodegroup["Labels"] == {GPU_NODE_LABEL_KEY: GPU_NODE_LABEL_VALUE}
    assert nodegroup["Taints"] == [{"Effect": "NO_SCHEDULE", "Key": GPU_TAINT_KEY, "Value": "present"}]
    assert nodegroup["NodeRepairConfig"] == {"Enabled": True}
    assert "InstanceTypes" not in nodegroup  # the launch template names it (see infra/constructs/gpu_nodes.py)
    assert "DiskSize" not in nodegroup  # rejected together with a launch template
    # Only the GPU AZ's private subnet: EFA traffic and the file system stay in one AZ.
    assert len(nodegroup["Subnets"]) == 1


# --- Network ------------------------------------------------------------------------------------


def test_vpc_spans_two_azs_including_the_gpu_az(synth):
    synthesized = synth("p5")
    subnets = synthesized.resources("network", "AWS::EC2::Subnet").values()
    azs = {s["Properties"]["AvailabilityZone"] for s in subnets}
    assert len(azs) >= 2 and synthesized.config.gpu_availability_zone in azs
    private = [
        s
        for s in subnets
        if not s["Properties"].get("MapPublicIpOnLaunch", False) and "18" in s["Properties"]["CidrBlock"][-3:]
    ]
    assert len(private) == len(azs)  # /18 per AZ: room for many pod IPs


def test_network_has_nat_s3_endpoint_and_flow_logs(synth):
    synthesized = synth("p5")
    net = template(synthesized, "network")
    net.resource_count_is("AWS::EC2::NatGateway", 1)
    net.has_resource_properties(
        "AWS::EC2::VPCEndpoint", {"VpcEndpointType": "Gateway", "ServiceName": Match.any_value()}
    )
    net.has_resource_properties("AWS::EC2::FlowLog", {"ResourceType": "VPC", "TrafficType": "REJECT"})
    net.has_resource_properties("AWS::Logs::LogGroup", {"KmsKeyId": Match.any_value()})


def _ingress_rules(synthesized) -> list[dict]:
    rules = [r["Properties"] for r in synthesized.resources("network", "AWS::EC2::SecurityGroupIngress").values()]
    for sg in synthesized.resources("network", "AWS::EC2::SecurityGroup").values():
        rules.extend(sg["Properties"].get("SecurityGroupIngress", []))
    return rules


def test_efa_security_group_allows_all_traffic_within_itself(synth):
    synthesized = synth("p5")
    (node_sg_id,) = [k for k in synthesized.resources("network", "AWS::EC2::SecurityGroup") if k.startswith("GpuNode")]
    self_rules = [
        r
        for r in _ingress_rules(synthesized)
        if r.get("GroupId") == {"Fn::GetAtt": [node_sg_id, "GroupId"]}
        and r.get("SourceSecurityGroupId") == {"Fn::GetAtt": [node_sg_id, "GroupId"]}
    ]
    assert any(r["IpProtocol"] == "-1" for r in self_rules)


def test_lustre_ports_open_only_from_gpu_nodes_without_efa(synth):
    synthesized = synth("g5-smoke")
    sgs = synthesized.resources("network", "AWS::EC2::SecurityGroup")
    (fsx_sg,) = [k for k in sgs if k.startswith("Fsx")]
    (node_sg,) = [k for k in sgs if k.startswith("GpuNode")]
    to_fsx = [r for r in _ingress_rules(synthesized) if r.get("GroupId") == {"Fn::GetAtt": [fsx_sg, "GroupId"]}]
    assert {(r["FromPort"], r["ToPort"]) for r in to_fsx} == {(988, 988), (1018, 1023)}
    sources = {json.dumps(r["SourceSecurityGroupId"]) for r in to_fsx}
    assert sources == {json.dumps({"Fn::GetAtt": [s, "GroupId"]}) for s in (fsx_sg, node_sg)}
    assert not any("CidrIp" in r for r in to_fsx)


def test_efa_fsx_security_groups_reference_each_other_by_id(synth):
    synthesized = synth("p5")
    sgs = synthesized.resources("network", "AWS::EC2::SecurityGroup")
    (fsx_sg,) = [k for k in sgs if k.startswith("Fsx")]
    rules = [r for r in _ingress_rules(synthesized) if r.get("GroupId") == {"Fn::GetAtt": [fsx_sg, "GroupId"]}]
    assert rules and all(r["IpProtocol"] == "-1" and "SourceSecurityGroupId" in r for r in rules)
    assert not any("CidrIp" in r for r in rules)  # CIDR rules do not satisfy EFA


# --- Storage ------------------------------------------------------------------------------------


def test_fsx_persistent_2_in_gpu_az_with_efa(synth):
    synthesized = synth("p5")
    fs = synthesized.one("storage", "AWS::FSx::FileSystem")
    props = fs["Properties"]
    lustre = props["LustreConfiguration"]
    assert props["StorageCapacity"] == 4800 and props["StorageType"] == "SSD"
    assert props["FileSystemTypeVersion"] == "2.15"
    assert lustre["DeploymentType"] == "PERSISTENT_2"
    assert lustre["PerUnitStorageThroughput"] == 1000
    assert lustre["DataCompressionType"] == "LZ4"
    assert lustre["EfaEnabled"] is True
    assert lustre["MetadataConfiguration"] == {"Mode": "AUTOMATIC"}
    assert len(props["SubnetIds"]) == 1
    assert fs["DeletionPolicy"] == "Retain" and fs["UpdateReplacePolicy"] == "Retain"


def test_smoke_profile_deletes_its_data_on_destroy(synth):
    synthesized = synth("g5-smoke")
    fs = synthesized.one("storage", "AWS::FSx::FileSystem")
    assert fs["DeletionPolicy"] == "Delete"
    assert fs["Properties"]["LustreConfiguration"]["EfaEnabled"] is False


def test_data_repository_association_links_the_bucket(synth):
    synthesized = synth("p5")
    (dra,) = [
        a["Properties"]
        for a in synthesized.resources("storage", "AWS::FSx::DataRepositoryAssociation").values()
        if a["Properties"]["FileSystemPath"] == synthesized.config.fsx.data_repository_path
    ]
    assert dra["FileSystemPath"] == "/s3"
    assert dra["BatchImportMetaDataOnCreate"] is True
    assert dra["S3"]["AutoImportPolicy"]["Events"] == ["NEW", "CHANGED", "DELETED"]
    # A dataset deleted on Lustre (to free space) stays in S3.
    assert dra["S3"]["AutoExportPolicy"]["Events"] == ["NEW", "CHANGED"]
    (bucket_id,) = [k for k in synthesized.resources("storage", "AWS::S3::Bucket") if k.startswith("DataBucket")]
    assert json.dumps({"Ref": bucket_id}) in json.dumps(dra["DataRepositoryPath"])


def test_data_bucket_encrypted_ssl_only_logged_and_retained(synth):
    synthesized = synth("p5")
    buckets = synthesized.resources("storage", "AWS::S3::Bucket")
    (data_id,) = [k for k in buckets if k.startswith("DataBucket")]
    data = buckets[data_id]
    assert data["DeletionPolicy"] == "Retain"
    props = data["Properties"]
    assert props["BucketEncryption"]["ServerSideEncryptionConfiguration"]
    assert props["PublicAccessBlockConfiguration"] == {
        "BlockPublicAcls": True,
        "BlockPublicPolicy": True,
        "IgnorePublicAcls": True,
        "RestrictPublicBuckets": True,
    }
    assert "DestinationBucketName" in props["LoggingConfiguration"]
    policies = [p["Properties"] for p in synthesized.resources("storage", "AWS::S3::BucketPolicy").values()]
    denies_insecure = [
        s
        for p in policies
        if p["Bucket"] == {"Ref": data_id}
        for s in p["PolicyDocument"]["Statement"]
        if s["Effect"] == "Deny" and s["Condition"] == {"Bool": {"aws:SecureTransport": "false"}}
    ]
    assert denies_insecure


def test_fsx_volume_is_a_static_pv_and_pvc_in_the_training_namespace(synth):
    synthesized = synth("p5")
    manifests = [
        r["Properties"]["Manifest"]
        for r in synthesized.resources("cluster", "Custom::AWSCDK-EKS-KubernetesResource").values()
    ]
    text = json.dumps(manifests)
    assert "fsx.csi.aws.com" in text and "PersistentVolumeClaim" in text
    assert FSX_PVC_NAME in text and TRAINING_NAMESPACE in text
    assert '\\"persistentVolumeReclaimPolicy\\":\\"Retain\\"' in text


# --- Cluster ------------------------------------------------------------------------------------


def test_cluster_version_encryption_and_logging(synth):
    synthesized = synth("p5")
    cluster = synthesized.one("cluster", "AWS::EKS::Cluster")["Properties"]
    assert cluster["Version"] == synthesized.config.kubernetes_version in SUPPORTED_KUBERNETES_VERSIONS
    (encryption,) = cluster["EncryptionConfig"]
    assert encryption["Resources"] == ["secrets"]
    key_id = encryption["Provider"]["KeyArn"]["Fn::GetAtt"][0]
    assert synthesized.templates["cluster"]["Resources"][key_id]["Properties"]["EnableKeyRotation"] is True
    # cdk-nag's EKS2 does not see aws_eks_v2 clusters: every control-plane log type, checked here.
    enabled = cluster["Logging"]["ClusterLogging"]["EnabledTypes"]
    assert sorted(t["Type"] for t in enabled) == ["api", "audit", "authenticator", "controllerManager", "scheduler"]


def test_public_endpoint_restricted_to_profile_cidrs(synth):
    # cdk-nag's EKS1 does not see aws_eks_v2 clusters: the endpoint restriction is checked here.
    synthesized = synth("p5")
    vpc_config = synthesized.one("cluster", "AWS::EKS::Cluster")["Properties"]["ResourcesVpcConfig"]
    assert vpc_config["EndpointPrivateAccess"] is True
    assert vpc_config["EndpointPublicAccess"] is True
    assert vpc_config["PublicAccessCidrs"] == synthesized.config.endpoint.public_cidrs
    assert "0.0.0.0/0" not in vpc_config["PublicAccessCidrs"]


def test_private_endpoint_profile_has_no_public_access(synth):
    base = resolve_config("g5-smoke")
    private = base.model_copy(
        update={"endpoint": base.endpoint.model_copy(update={"access": "private", "public_cidrs": []})}
    )
    vpc_config = synth(private).one("cluster", "AWS::EKS::Cluster")["Properties"]["ResourcesVpcConfig"]
    assert vpc_config["EndpointPublicAccess"] is False
    assert vpc_config["EndpointPrivateAccess"] is True


def test_admin_access_entry(synth):
    synthesized = synth("p5")
    (entry,) = [
        e["Properties"]
        for e in synthesized.resources("cluster", "AWS::EKS::AccessEntry").values()
        if e["Properties"]["PrincipalArn"] == synthesized.config.admin_principal_arn
    ]
    (policy,) = entry["AccessPolicies"]
    assert policy["AccessScope"] == {"Type": "cluster"}
    assert "AmazonEKSClusterAdminPolicy" in json.dumps(policy["PolicyArn"])


def test_system_node_group_runs_the_add_ons(synth):
    synthesized = synth("p5")
    system = system_nodegroup(synthesized)
    assert system["AmiType"] == "AL2023_x86_64_STANDARD"
    assert system["InstanceTypes"] == [synthesized.config.system_nodes.instance_type]
    assert "Taints" not in system


# --- Add-ons ------------------------------------------------------------------------------------


def test_eks_managed_add_ons_pinned_with_pod_identity(synth):
    synthesized = synth("p5")
    versions = synthesized.config.addons.versions
    addons = {
        a["Properties"]["AddonName"]: a["Properties"]
        for a in synthesized.resources("cluster", "AWS::EKS::Addon").values()
    }
    assert set(addons) == {
        "vpc-cni",
        "coredns",
        "kube-proxy",
        "eks-pod-identity-agent",
        "aws-fsx-csi-driver",
        "amazon-cloudwatch-observability",
        "eks-node-monitoring-agent",
    }
    assert addons["aws-fsx-csi-driver"]["AddonVersion"] == versions.fsx_csi_driver
    (association,) = addons["aws-fsx-csi-driver"]["PodIdentityAssociations"]
    assert association["ServiceAccount"] == "fsx-csi-controller-sa"
    role_id = association["RoleArn"]["Fn::GetAtt"][0]
    trust = synthesized.templates["cluster"]["Resources"][role_id]["Properties"]["AssumeRolePolicyDocument"]
    (statement,) = trust["Statement"]
    assert statement["Principal"] == {"Service": "pods.eks.amazonaws.com"}
    assert sorted(statement["Action"]) == ["sts:AssumeRole", "sts:TagSession"]
    # Only for this account's cluster and the add-on's own service account.
    equals = statement["Condition"]["StringEquals"]
    assert equals["aws:SourceAccount"] == resolve_config("p5").account
    assert equals["aws:RequestTag/kubernetes-service-account"] == "fsx-csi-controller-sa"
    assert "aws:RequestTag/eks-cluster-name" in equals


def test_helm_add_ons_device_plugins_and_jobset(synth):
    synthesized = synth("p5")
    charts = {
        c["Properties"]["Chart"]: c["Properties"]
        for c in synthesized.resources("cluster", "Custom::AWSCDK-EKS-HelmChart").values()
    }
    assert {"aws-efa-k8s-device-plugin", "nvidia-device-plugin", "jobset"} <= set(charts)
    assert "dcgm-exporter" not in charts  # the p5 profile uses the CloudWatch add-on's exporter
    versions = synthesized.config.addons.versions
    assert charts["jobset"]["Version"] == versions.jobset_chart
    assert charts["jobset"]["Repository"].startswith("oci://")
    for device_plugin in ("aws-efa-k8s-device-plugin", "nvidia-device-plugin"):
        values = json.loads(charts[device_plugin]["Values"])
        assert values["nodeSelector"] == {GPU_NODE_LABEL_KEY: GPU_NODE_LABEL_VALUE}
        assert {"key": GPU_TAINT_KEY, "operator": "Exists", "effect": "NoSchedule"} in values["tolerations"]


def test_smoke_profile_uses_the_dcgm_exporter_chart(synth):
    synthesized = synth("g5-smoke")
    charts = {
        c["Properties"]["Chart"] for c in synthesized.resources("cluster", "Custom::AWSCDK-EKS-HelmChart").values()
    }
    addons = {a["Properties"]["AddonName"] for a in synthesized.resources("cluster", "AWS::EKS::Addon").values()}
    assert "dcgm-exporter" in charts and "amazon-cloudwatch-observability" not in addons


# --- Image and outputs --------------------------------------------------------------------------


def test_trainer_image_is_an_asset_built_at_deploy_time(synth):
    synthesized = synth("p5")
    assets = json.loads((synthesized.outdir / f"{synthesized.stack_names['cluster']}.assets.json").read_text())
    (image,) = assets["dockerImages"].values()
    assert image["source"]["platform"] == "linux/amd64"
    context = synthesized.outdir / image["source"]["directory"]
    # The build context is staged; Docker is not needed to synth (tests/contract/trainer/test_image_gates.py checks
    # that it holds every COPY source).
    assert (context / image["source"]["dockerFile"]).is_file()


def test_cluster_stack_exports_every_output_the_cli_reads(synth):
    synthesized = synth("p5")
    outputs = synthesized.templates["cluster"]["Outputs"]
    assert {key.value for key in REQUIRED_OUTPUTS} <= set(outputs)
    assert outputs["GpuInstanceType"]["Value"] == "p5.48xlarge"
    assert outputs["FsxPvcName"]["Value"] == FSX_PVC_NAME
    assert "update-kubeconfig" in json.dumps(outputs["UpdateKubeconfigCommand"]["Value"])


def test_every_taggable_resource_carries_the_deployment_tag(synth):
    synthesized = synth("p5")
    tag = {"Key": DEPLOYMENT_TAG_KEY, "Value": synthesized.config.name}
    for role, resource_type in (
        ("network", "AWS::EC2::VPC"),
        ("storage", "AWS::S3::Bucket"),
        ("cluster", "AWS::EKS::Cluster"),
    ):
        template(synthesized, role).has_resource_properties(resource_type, {"Tags": Match.array_with([tag])})
    # Teardown sweeps orphans (ENIs, volumes) by this tag, so the nodes' resources carry it too.
    lt_tags = launch_template_data(synthesized)["TagSpecifications"]
    assert {t["ResourceType"] for t in lt_tags} == {"instance", "volume", "network-interface"}
    assert all({"Key": DEPLOYMENT_TAG_KEY, "Value": synthesized.config.name} in t["Tags"] for t in lt_tags)


def test_training_operator_is_optional_and_off_by_default(synth):
    def manifests(synthesized):
        return json.dumps(
            [
                r["Properties"]["Manifest"]
                for r in synthesized.resources("cluster", "Custom::AWSCDK-EKS-KubernetesResource").values()
            ]
        )

    base = resolve_config("g5-smoke")
    assert "training-operator" not in manifests(synth(base))
    with_operator = base.model_copy(
        update={"addons": base.addons.model_copy(update={"install_training_operator": True})}
    )
    text = manifests(synth(with_operator))
    assert "manifests/overlays/standalone?ref=" + base.addons.versions.training_operator in text
    assert "--server-side" in text


# --- GPU node user data -------------------------------------------------------------------------


def user_data_parts(synthesized) -> dict[str, str]:
    """The launch template's MIME multipart user data, by part content type."""
    message = email.message_from_string(launch_template_data(synthesized)["UserData"]["Fn::Base64"])
    assert message.is_multipart()
    return {part.get_content_type(): part.get_payload() for part in message.get_payload()}


def test_gpu_user_data_configures_the_efa_lustre_client_when_fsx_uses_efa(synth, tmp_path):
    parts = user_data_parts(synth("p5"))
    assert list(parts) == ["application/node.eks.aws", "text/x-shellscript"]
    node_config = yaml.safe_load(parts["application/node.eks.aws"])
    assert node_config["kind"] == "NodeConfig"
    assert node_config["spec"]["instance"]["localStorage"] == {"strategy": "RAID0"}
    script = parts["text/x-shellscript"]
    # Installs the set-up as a unit run on every boot before kubelet (tests/unit/infra/test_node_user_data.py).
    assert script == lustre_efa_user_data(synth("p5").config.gpu_nodes.facts)
    assert script.startswith("#!/bin/bash\n")
    for step in (
        "modprobe kefalnd",
        "lnetctl lnet configure",
        "lnetctl net add --net efa",
        "lnetctl set discovery 1",
        "lnetctl udsp add --src efa --priority 0",
    ):
        assert step in script, step
    # p5: one EFA device per PCIe switch, 8 of the 32.
    assert "for index in 0 4 8 12 16 20 24 28; do" in script
    path = tmp_path / "lustre-efa.sh"
    path.write_text(script)
    result = subprocess.run(
        [str(Path(sys.executable).parent / "shellcheck"), "--shell=bash", "--severity=style", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_gpu_user_data_has_no_efa_lustre_part_without_fsx_efa(synth):
    synthesized = synth("g5-smoke")
    assert not synthesized.config.fsx.efa_enabled
    assert list(user_data_parts(synthesized)) == ["application/node.eks.aws"]


# --- Issue-15 infrastructure: second copy, network policy, installer, key grants ---------------


def test_run_directories_are_exported_to_s3_as_the_second_copy_of_checkpoints(synth):
    synthesized = synth("p5")
    associations = {
        a["Properties"]["FileSystemPath"]: a
        for a in synthesized.resources("storage", "AWS::FSx::DataRepositoryAssociation").values()
    }
    assert set(associations) == {"/s3", FSX_RUNS_PATH}
    runs = associations[FSX_RUNS_PATH]["Properties"]
    # Export only, deletions included (they become noncurrent versions, below); nothing is imported.
    assert runs["S3"] == {"AutoExportPolicy": {"Events": ["NEW", "CHANGED", "DELETED"]}}
    assert runs["BatchImportMetaDataOnCreate"] is False
    assert json.dumps(runs["DataRepositoryPath"]).endswith(f'/{RUNS_COPY_PREFIX}/"]]}}')
    data_path = json.dumps(associations["/s3"]["Properties"]["DataRepositoryPath"])
    assert data_path.endswith('"/data"]]}')  # S3 paths of the two associations do not overlap
    # The copy of a file still on Lustre never expires (a paused run's only checkpoints); one
    # deleted or replaced there is kept fsx.runs_copy_days as a noncurrent version.
    (bucket,) = [
        b["Properties"]
        for k, b in synthesized.resources("storage", "AWS::S3::Bucket").items()
        if k.startswith("DataBucket")
    ]
    assert bucket["VersioningConfiguration"] == {"Status": "Enabled"}
    rules = bucket["LifecycleConfiguration"]["Rules"]
    runs_rules = [r for r in rules if r.get("Prefix", "").startswith(f"{RUNS_COPY_PREFIX}/") or "Prefix" not in r]
    assert runs_rules == [
        {
            "Prefix": f"{RUNS_COPY_PREFIX}/",
            "NoncurrentVersionExpiration": {"NoncurrentDays": synthesized.config.fsx.runs_copy_days},
            "ExpiredObjectDeleteMarker": True,
            "Status": "Enabled",
        }
    ]
    assert not any("ExpirationInDays" in r for r in runs_rules)
    # FSx takes no backups of a file system linked to S3 (they would be refused).
    lustre = synthesized.one("storage", "AWS::FSx::FileSystem")["Properties"]["LustreConfiguration"]
    assert lustre["AutomaticBackupRetentionDays"] == 0


def test_a_data_prefix_overlapping_the_runs_copy_is_a_config_error(tmp_path):
    raw = yaml.safe_load((PROFILES_DIR / "p5.yaml").read_text())
    raw["fsx"]["data_bucket_prefix"] = ""
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(raw))
    with pytest.raises(ConfigError, match="fsx.data_bucket_prefix: '' would overlap the 'runs/' prefix"):
        load_config(path)


def test_vpc_cni_enforces_network_policies(synth):
    (cni,) = [
        a["Properties"]
        for a in synth("p5").resources("cluster", "AWS::EKS::Addon").values()
        if a["Properties"]["AddonName"] == "vpc-cni"
    ]
    assert json.loads(cni["ConfigurationValues"]) == {"enableNetworkPolicy": "true"}


def test_training_operator_installer_removes_its_cluster_admin_binding(synth):
    base = resolve_config("g5-smoke")
    with_operator = base.model_copy(
        update={"addons": base.addons.model_copy(update={"install_training_operator": True})}
    )
    (manifest,) = [
        json.loads(r["Properties"]["Manifest"])
        for r in synth(with_operator).resources("cluster", "Custom::AWSCDK-EKS-KubernetesResource").values()
        if "training-operator" in json.dumps(r["Properties"]["Manifest"])
    ]
    (binding,) = [m for m in manifest if m["kind"] == "ClusterRoleBinding"]
    (job,) = [m for m in manifest if m["kind"] == "Job"]
    (container,) = job["spec"]["template"]["spec"]["containers"]
    command = container["command"][-1]
    # The binding is deleted only after the install succeeded, by the Job itself.
    assert command.index("kubectl apply --server-side") < command.index(
        f"&& kubectl delete clusterrolebinding {binding['metadata']['name']}"
    )
    assert container["image"] == synth(with_operator).config.training_operator_installer_image


def test_flow_log_key_grant_is_limited_to_the_flow_log_group(synth):
    synthesized = synth("p5")
    (key,) = synthesized.resources("network", "AWS::KMS::Key").values()
    (log_group,) = synthesized.resources("network", "AWS::Logs::LogGroup").values()
    statements = [
        s for s in key["Properties"]["KeyPolicy"]["Statement"] if "logs." in json.dumps(s.get("Principal", {}))
    ]
    assert statements, "no key policy statement for CloudWatch Logs"
    name = log_group["Properties"]["LogGroupName"]
    for statement in statements:
        context = statement["Condition"]["ArnEquals"]["kms:EncryptionContext:aws:logs:arn"]
        assert json.dumps(context).endswith(f':log-group:{name}"]]}}'), context


def test_access_log_bucket_has_acls_disabled_and_admits_log_delivery(synth):
    synthesized = synth("p5")
    buckets = synthesized.resources("storage", "AWS::S3::Bucket")
    (log_bucket_id,) = [k for k in buckets if k.startswith("AccessLogBucket")]
    ownership = buckets[log_bucket_id]["Properties"]["OwnershipControls"]["Rules"]
    assert ownership == [{"ObjectOwnership": "BucketOwnerEnforced"}]
    (policy,) = [
        p["Properties"]["PolicyDocument"]
        for p in synthesized.resources("storage", "AWS::S3::BucketPolicy").values()
        if p["Properties"]["Bucket"] == {"Ref": log_bucket_id}
    ]
    delivery = [s for s in policy["Statement"] if s.get("Principal") == {"Service": "logging.s3.amazonaws.com"}]
    assert delivery and all(s["Effect"] == "Allow" and s["Action"] == "s3:PutObject" for s in delivery)


def test_fsx_throughput_is_counted_in_fsx_units(synth):
    """FSx counts a TiB of storage as 1000 GiB: 4800 GiB at 1000 MB/s/TiB is 4800 MB/s."""
    assert resolve_config("p5").fsx.throughput_mbps == 4800
    assert resolve_config("g5-smoke").fsx.throughput_mbps == 150  # 1200 GiB x 125 MB/s/TiB
    console = Console(record=True, width=200)
    print_summary(synth("p5").result, console)
    assert "(~4800 MB/s)" in console.export_text()
