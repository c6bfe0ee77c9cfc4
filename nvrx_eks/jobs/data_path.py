"""Where token shards are in the pods: `--data` as the pods see it, and where an object uploaded to
the data bucket appears.

The FSx data repository association (infra/stacks/storage.py) links `fsx.data_repository_path` in the
file system to `s3://<data bucket>/<fsx.data_bucket_prefix>`, and imports new objects
automatically: an object `<data_bucket_prefix>/REST` appears in every pod at
`FSX_MOUNT_PATH + data_repository_path + /REST`.
"""

from __future__ import annotations

from pathlib import PurePosixPath

from infra.config import DeploymentConfig
from nvrx_eks.facts.errors import ConfigError
from nvrx_eks.facts.names import FSX_MOUNT_PATH


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
