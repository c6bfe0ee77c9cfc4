"""The trainer image: built from workloads/ at deploy time as a CDK image asset (pushed to the
account's CDK asset ECR repository), or an existing image URI from the profile.

Synthesis never runs Docker: the asset step only stages the build context into cdk.out; the image
is built and pushed by `cdk deploy` (or `cdk-assets`) on a machine with Docker.
"""

from __future__ import annotations

from pathlib import Path

from aws_cdk import aws_ecr_assets as ecr_assets
from constructs import Construct

from infra.config import DeploymentConfig
from workloads.errors import ConfigError

WORKLOADS_DIR = Path(__file__).resolve().parent.parent / "workloads"


class TrainerImage(Construct):
    def __init__(self, scope: Construct, construct_id: str, *, config: DeploymentConfig) -> None:
        super().__init__(scope, construct_id)
        if not config.image.build:
            assert config.image.uri is not None  # guaranteed by ImageConfig
            self.image_uri = config.image.uri
            return
        if not (WORKLOADS_DIR / "Dockerfile").is_file():
            raise ConfigError(
                f"image.build is true but {WORKLOADS_DIR / 'Dockerfile'} is missing; restore it or set image.uri"
            )
        asset = ecr_assets.DockerImageAsset(
            self,
            "Asset",
            directory=str(WORKLOADS_DIR),
            platform=ecr_assets.Platform.LINUX_AMD64,
            # Python caches and local runs would change the asset hash without changing the image.
            exclude=["**/__pycache__", "**/*.pyc", "runs", ".pytest_cache"],
        )
        self.image_uri = asset.image_uri
