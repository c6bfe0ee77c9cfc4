"""The trainer image: built at deploy time as a CDK image asset (pushed to the account's CDK
asset ECR repository), or an existing image URI from the profile.

The build context is the repository root, narrowed to what the image holds
(nvrx_eks/facts/image_contents.py): the asset stages it from that list, and the checkout's
.dockerignore (which CDK reads first and a `docker build` of the checkout reads alone) states the
same patterns, so both see the same files.

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
from nvrx_eks.facts.image_contents import BUILD_INPUTS, CODE, DOCKERFILE, context_patterns


class TrainerImage(Construct):
    def __init__(self, scope: Construct, construct_id: str, *, config: DeploymentConfig) -> None:
        super().__init__(scope, construct_id)
        if not config.image.build:
            assert config.image.uri is not None  # guaranteed by ImageConfig
            self.image_uri = config.image.uri
            return
        build_context = checkout_root()
        for needed in (DOCKERFILE, *BUILD_INPUTS, *CODE):
            if not (build_context / needed).exists():
                raise ConfigError(
                    f"image.build is true but {build_context / needed} is missing; restore it or set image.uri"
                )
        asset = ecr_assets.DockerImageAsset(
            self,
            "Asset",
            directory=str(build_context),
            file=DOCKERFILE,
            platform=ecr_assets.Platform.LINUX_AMD64,
            exclude=list(context_patterns()),
            # Docker's own matching rules, for these patterns and the .dockerignore CDK reads first.
            ignore_mode=IgnoreMode.DOCKER,
        )
        self.image_uri = asset.image_uri
