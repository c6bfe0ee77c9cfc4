#!/usr/bin/env python3
"""CDK entry point: `cdk synth|deploy|destroy -c profile=NAME` (or `-c config=PATH`)."""

import sys

from aws_cdk import App

from infra.config import resolve_config
from infra.environment import build_environment
from infra.nag import acknowledge_findings, enable_nag
from workloads.errors import ConfigError


def main() -> None:
    app = App()
    try:
        config = resolve_config(app.node.try_get_context("profile"), app.node.try_get_context("config"))
        environment = build_environment(app, config)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    acknowledge_findings(environment)
    enable_nag(app)
    app.synth()


if __name__ == "__main__":
    main()
