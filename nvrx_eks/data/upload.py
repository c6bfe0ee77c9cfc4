"""`nvrx-eks data upload DIR s3://BUCKET/PREFIX`: put a shard set where the pods will see it.

The FSx data repository association (infra/stacks/storage.py) links `fsx.data_repository_path` in the
file system to `s3://<data bucket>/<fsx.data_bucket_prefix>`, and imports new objects
automatically: an object `<data_bucket_prefix>/REST` appears in every pod at
`FSX_MOUNT_PATH + data_repository_path + /REST`. Shards go first and the manifest last, so a
job that sees the manifest sees every shard it lists.
"""

from __future__ import annotations

from pathlib import Path, PurePosixPath

from boto3.exceptions import S3UploadFailedError
from botocore.exceptions import BotoCoreError, ClientError
from rich.console import Console

from infra.config import DeploymentConfig
from nvrx_eks.deploy.stack_outputs import aws_error
from nvrx_eks.facts.errors import ConfigError
from nvrx_eks.jobs.spec import FSX_MOUNT_PATH
from workloads.shards import MANIFEST_NAME, read_manifest


def parse_s3_url(url: str, flag: str = "--upload") -> tuple[str, str]:
    if not url.startswith("s3://") or not url[5:].split("/", 1)[0]:
        raise ConfigError(
            f"{flag}: '{url}' is not an s3://BUCKET/PREFIX URL; give the data "
            "bucket and a prefix under its data prefix, e.g. s3://my-bucket/data/corpus"
        )
    bucket, _, prefix = url[5:].partition("/")
    return bucket, prefix.strip("/")


def pod_path(config: DeploymentConfig, prefix: str) -> str:
    """Where objects under `prefix` in the data bucket appear in the pods."""
    data_prefix = config.fsx.data_bucket_prefix.strip("/")
    parts = PurePosixPath(prefix).parts
    if data_prefix and tuple(parts[: len(PurePosixPath(data_prefix).parts)]) != PurePosixPath(data_prefix).parts:
        raise ConfigError(
            f"s3 URL: prefix '{prefix}' is outside '{data_prefix}/', the only prefix the FSx data "
            f"repository association imports (fsx.data_bucket_prefix); use s3://BUCKET/{data_prefix}/NAME"
        )
    rest = PurePosixPath(*parts[len(PurePosixPath(data_prefix).parts) :]) if data_prefix else PurePosixPath(prefix)
    return str(PurePosixPath(FSX_MOUNT_PATH) / config.fsx.data_repository_path.lstrip("/") / rest)


def data_in_pods(data: str, config: DeploymentConfig, data_bucket: str | None) -> str:
    """`--data` as the pods see it: an s3:// URL of the data bucket becomes the FSx path its data
    repository association imports it at; a path stays a path (relative ones go under /fsx). Any
    other URL, or an absolute path outside /fsx, is refused with the fix. `data_bucket`: the
    deployed bucket's name, checked when known (offline it is not)."""
    if data.startswith("s3://"):
        bucket, prefix = parse_s3_url(data, "--data")
        if data_bucket is not None and bucket != data_bucket:
            raise ConfigError(
                f"--data: {data} is in bucket {bucket}, but the file system imports s3://{data_bucket}; "
                f"upload there (nvrx-eks data upload DIR s3://{data_bucket}/...)"
            )
        return pod_path(config, prefix)
    path = PurePosixPath(data)
    if "://" in data or (path.is_absolute() and not path.is_relative_to(FSX_MOUNT_PATH)):
        raise ConfigError(
            f"--data: {data} is not where the pods can read it; give a path on the FSx volume ({FSX_MOUNT_PATH}/..., "
            "or relative to it) or the s3://<data bucket>/<data prefix>/... URL its data repository imports"
        )
    return data


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
