"""Storage: FSx for Lustre (PERSISTENT_2) in the GPU AZ, linked to an encrypted S3 data bucket.

Checkpoints and pre-tokenized data live on Lustre, linked to the bucket by two data repository
associations:
- data: fsx.data_repository_path <-> s3://bucket/<fsx.data_bucket_prefix>, imports new and
  changed objects and exports new and changed files;
- runs: the run directories (/runs on the file system, where checkpoints are written) ->
  s3://bucket/runs/, export only. This is the second copy of checkpoints: FSx takes no backups
  of a file system linked to S3 (FSx for Lustre user guide, "Working with backups"). Deletions
  are exported too, into a versioned bucket: the copy of what is on Lustre now never expires (a
  paused run's only checkpoints stay for as long as the run does), and a file deleted on Lustre
  (checkpoint retention, a removed run) stays as a noncurrent version for fsx.runs_copy_days
  before S3 expires it. Nothing is imported into /runs, so a writer to the bucket cannot plant a
  checkpoint.
Both are kept on `cdk destroy` unless the profile sets fsx.removal_policy: destroy.

The EKS control-plane log group (the API server's audit log among them) lives here too, created
with a retention before the cluster exists: EKS writes into /aws/eks/<cluster>/cluster when it
exists and otherwise creates it without one, and that group outlives every stack. It belongs
with what a default teardown keeps (who did what to the cluster is wanted most after an
incident), and a cluster stack that rolls back or is destroyed and deployed again finds it here,
instead of failing on a name that already exists.
"""

from __future__ import annotations

from aws_cdk import CfnDeletionPolicy, Duration, RemovalPolicy, Stack
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_fsx as fsx
from aws_cdk import aws_logs as logs
from aws_cdk import aws_s3 as s3
from constructs import Construct

from infra.config import DeploymentConfig
from infra.config.sections import FsxConfig
from infra.constructs.log_groups import encrypted_log_group
from infra.constructs.secure_defaults import private_bucket
from nvrx_eks.facts.names import FSX_RUNS_PATH, RUNS_COPY_PREFIX

#: FSx for Lustre version: 2.15 is required for EFA and is the current long-term release.
LUSTRE_VERSION = "2.15"
#: How long the control-plane logs (API, audit, authenticator, controller manager, scheduler)
#: are kept: long enough to look back on an incident, bounded so they stop adding up.
CONTROL_PLANE_LOG_RETENTION = logs.RetentionDays.THREE_MONTHS


class StorageStack(Stack):
    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        config: DeploymentConfig,
        subnet: ec2.ISubnet,
        security_group: ec2.ISecurityGroup,
        **kwargs,
    ) -> None:
        super().__init__(scope, construct_id, **kwargs)
        fsx_cfg = config.fsx
        data_prefix = fsx_cfg.data_bucket_prefix.strip("/")  # never empty: the config refuses it
        keep_data = fsx_cfg.removal_policy == "retain"
        removal = RemovalPolicy.RETAIN if keep_data else RemovalPolicy.DESTROY

        self.access_log_bucket = self._access_log_bucket(removal)
        self.control_plane_logs = encrypted_log_group(
            self,
            "ControlPlaneLogs",
            name=config.control_plane_log_group,
            retention=CONTROL_PLANE_LOG_RETENTION,
            description=f"{config.name}: EKS control-plane log encryption",
        )
        self.data_bucket = self._data_bucket(fsx_cfg, data_prefix, removal)
        self.file_system = self._file_system(fsx_cfg, subnet, security_group, keep_data)
        self.data_repository_association = self._data_association(fsx_cfg, data_prefix)
        self.runs_export = self._runs_export()

    def _access_log_bucket(self, removal: RemovalPolicy) -> s3.Bucket:
        return private_bucket(
            self,
            "AccessLogBucket",
            removal_policy=removal,
            # ACLs off. S3 server access logging still delivers: with ACLs disabled it needs a
            # bucket policy granting logging.s3.amazonaws.com, which CDK writes for the source
            # bucket (feature flag @aws-cdk/aws-s3:serverAccessLogsUseBucketPolicy in cdk.json).
            object_ownership=s3.ObjectOwnership.BUCKET_OWNER_ENFORCED,
            lifecycle_rules=[s3.LifecycleRule(expiration=Duration.days(90))],
        )

    def _data_bucket(self, fsx_cfg: FsxConfig, data_prefix: str, removal: RemovalPolicy) -> s3.Bucket:
        """The versioned bucket behind both data repository associations."""
        return private_bucket(
            self,
            "DataBucket",
            removal_policy=removal,
            versioned=True,
            server_access_logs_bucket=self.access_log_bucket,
            server_access_logs_prefix="data-bucket/",
            lifecycle_rules=[
                # Old versions of overwritten data files add up quickly; keep a week of them.
                s3.LifecycleRule(prefix=f"{data_prefix}/", noncurrent_version_expiration=Duration.days(7)),
                # Run files deleted or replaced on Lustre; the current copy never expires.
                s3.LifecycleRule(
                    prefix=f"{RUNS_COPY_PREFIX}/",
                    noncurrent_version_expiration=Duration.days(fsx_cfg.runs_copy_days),
                    expired_object_delete_marker=True,
                ),
            ],
        )

    def _file_system(
        self, fsx_cfg: FsxConfig, subnet: ec2.ISubnet, security_group: ec2.ISecurityGroup, keep_data: bool
    ) -> fsx.CfnFileSystem:
        lustre = fsx.CfnFileSystem.LustreConfigurationProperty(
            deployment_type="PERSISTENT_2",
            per_unit_storage_throughput=fsx_cfg.throughput_per_tib,
            data_compression_type=fsx_cfg.compression,
            efa_enabled=fsx_cfg.efa_enabled,
            metadata_configuration=fsx.CfnFileSystem.MetadataConfigurationProperty(
                mode="USER_PROVISIONED" if fsx_cfg.metadata_iops else "AUTOMATIC",
                iops=fsx_cfg.metadata_iops,
            ),
            # Sunday 05:00 UTC: maintenance restarts Lustre servers, so keep it out of the week.
            weekly_maintenance_start_time="7:05:00",
            # FSx takes no backups of a file system linked to S3; the runs export is the copy.
            automatic_backup_retention_days=0,
        )
        file_system = fsx.CfnFileSystem(
            self,
            "Lustre",
            file_system_type="LUSTRE",
            file_system_type_version=LUSTRE_VERSION,
            storage_type="SSD",
            storage_capacity=fsx_cfg.storage_gib,
            subnet_ids=[subnet.subnet_id],
            security_group_ids=[security_group.security_group_id],
            lustre_configuration=lustre,
        )
        # A log group of that name left by something else fails this stack: let it fail in
        # seconds, before the file system's twenty-minute create starts.
        file_system.node.add_dependency(self.control_plane_logs)
        policy = CfnDeletionPolicy.RETAIN if keep_data else CfnDeletionPolicy.DELETE
        file_system.cfn_options.deletion_policy = policy
        file_system.cfn_options.update_replace_policy = policy
        return file_system

    def _data_association(self, fsx_cfg: FsxConfig, data_prefix: str) -> fsx.CfnDataRepositoryAssociation:
        """fsx.data_repository_path <-> the bucket's data prefix, both ways."""
        association = fsx.CfnDataRepositoryAssociation(
            self,
            "DataRepositoryAssociation",
            file_system_id=self.file_system.ref,
            file_system_path=fsx_cfg.data_repository_path,
            data_repository_path=f"s3://{self.data_bucket.bucket_name}/{data_prefix}",
            batch_import_meta_data_on_create=True,
            s3=fsx.CfnDataRepositoryAssociation.S3Property(
                auto_import_policy=fsx.CfnDataRepositoryAssociation.AutoImportPolicyProperty(
                    events=["NEW", "CHANGED", "DELETED"]
                ),
                # Export NEW and CHANGED only: a dataset deleted on Lustre (to free space) stays
                # in S3, where it came from.
                auto_export_policy=fsx.CfnDataRepositoryAssociation.AutoExportPolicyProperty(events=["NEW", "CHANGED"]),
            ),
        )
        association.cfn_options.deletion_policy = CfnDeletionPolicy.DELETE
        return association

    def _runs_export(self) -> fsx.CfnDataRepositoryAssociation:
        """The run directories -> the bucket's runs/ prefix, export only (the module docstring says why)."""
        export = fsx.CfnDataRepositoryAssociation(
            self,
            "RunsExport",
            file_system_id=self.file_system.ref,
            file_system_path=FSX_RUNS_PATH,
            data_repository_path=f"s3://{self.data_bucket.bucket_name}/{RUNS_COPY_PREFIX}/",
            batch_import_meta_data_on_create=False,
            s3=fsx.CfnDataRepositoryAssociation.S3Property(
                auto_export_policy=fsx.CfnDataRepositoryAssociation.AutoExportPolicyProperty(
                    events=["NEW", "CHANGED", "DELETED"]
                ),
            ),
        )
        export.cfn_options.deletion_policy = CfnDeletionPolicy.DELETE
        # FSx works on one association request at a time per file system.
        export.add_dependency(self.data_repository_association)
        return export

    @property
    def mount_name(self) -> str:
        return self.file_system.attr_lustre_mount_name

    @property
    def dns_name(self) -> str:
        return self.file_system.attr_dns_name
