"""`nvrx-eks data upload DIR s3://BUCKET/PREFIX`: put a shard set where the pods will see it
(nvrx_eks/jobs/data_path.py says where). Shards go first and the manifest last, so a job that
sees the manifest sees every shard it lists.
"""

from __future__ import annotations

from pathlib import Path

from boto3.exceptions import S3UploadFailedError
from botocore.exceptions import BotoCoreError, ClientError
from rich.console import Console

from infra.config import DeploymentConfig
from nvrx_eks.deploy.stack_outputs import aws_error
from nvrx_eks.facts.errors import ConfigError
from nvrx_eks.jobs.data_path import parse_s3_url, pod_path
from workloads.shards import MANIFEST_NAME, read_manifest


def upload(config: DeploymentConfig, shard_dir: Path, url: str, console: Console, *, s3_client=None) -> str:
    """Upload a complete shard set; returns the path the pods will read it at."""
    manifest = read_manifest(shard_dir) if shard_dir.is_dir() else None
    if manifest is None:
        raise ConfigError(
            f"DIR: {shard_dir} holds no {MANIFEST_NAME}; give the --out directory of `nvrx-eks data prepare`"
        )
    if not manifest.get("complete"):
        raise ConfigError(f"DIR: {shard_dir} is only partly prepared; rerun the same `data prepare` command first")
    bucket, prefix = parse_s3_url(url)
    path_in_pods = pod_path(config, prefix)
    if s3_client is None:
        import boto3

        s3_client = boto3.client("s3", region_name=config.region)
    files = [shard_dir / s["file"] for s in manifest["shards"]] + [shard_dir / MANIFEST_NAME]
    for index, file in enumerate(files, start=1):
        key = f"{prefix}/{file.name}" if prefix else file.name
        try:
            s3_client.upload_file(str(file), bucket, key)
        except (BotoCoreError, ClientError, S3UploadFailedError) as e:
            # The manifest goes last: a job sees no part of a set whose upload stopped early.
            # boto3 wraps S3's ClientError (raised while handling it): the ClientError names the code.
            cause = e.__context__ if isinstance(e.__context__, ClientError) else e
            raise aws_error(cause, config, f"uploading {file.name} to s3://{bucket}/{key}") from None
        console.print(f"[{index}/{len(files)}] s3://{bucket}/{key}", markup=False, highlight=False)
    console.print(f"in the pods: {path_in_pods} (render/submit --data {path_in_pods})", markup=False, highlight=False)
    return path_in_pods
