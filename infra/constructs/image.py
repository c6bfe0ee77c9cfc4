"""The trainer image: built at deploy time as a CDK image asset (pushed to the account's CDK
asset ECR repository), or an existing image URI from the profile.

The build context is the repository root, narrowed by its .dockerignore to what the
Dockerfile's COPY instructions need (pyproject.toml for the pinned Python requirements, the
workloads package). CDK reads that .dockerignore when it stages the context, so the staged
directory and a `docker build` of the checkout see the same files.

Synthesis never runs Docker: the asset step only stages the build context into cdk.out; the image
is built and pushed by `cdk deploy` (or `cdk-assets`) on a machine with Docker.
"""

from __future__ import annotations

from aws_cdk import IgnoreMode
from aws_cdk import aws_ecr_assets as ecr_assets
from constructs import Construct

from infra.config import DeploymentConfig
from nvrx_eks.facts.checkout import checkout_root
from nvrx_eks.facts.errors import ConfigError

#: The Dockerfile, relative to the build context (the checkout's root).
DOCKERFILE = "workloads/Dockerfile"


class TrainerImage(Construct):
    def __init__(self, scope: Construct, construct_id: str, *, config: DeploymentConfig) -> None:
        super().__init__(scope, construct_id)
        if not config.image.build:
            assert config.image.uri is not None  # guaranteed by ImageConfig
            self.image_uri = config.image.uri
            return
        build_context = checkout_root()
        for needed in (DOCKERFILE, ".dockerignore"):
            if not (build_context / needed).is_file():
                raise ConfigError(
                    f"image.build is true but {build_context / needed} is missing; restore it or set image.uri"
                )
        asset = ecr_assets.DockerImageAsset(
            self,
            "Asset",
            directory=str(build_context),
            file=DOCKERFILE,
            platform=ecr_assets.Platform.LINUX_AMD64,
            # Docker's own matching rules for the .dockerignore patterns CDK reads.
            ignore_mode=IgnoreMode.DOCKER,
        )
        self.image_uri = asset.image_uri
