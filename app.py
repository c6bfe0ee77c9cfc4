#!/usr/bin/env python3
"""CDK entry point: `cdk synth|deploy|destroy -c profile=NAME` (or `-c config=PATH`)."""

import sys

from nvrx_eks.deploy.cdk_cli import quiet_end_of_life_banner


def main() -> None:
    note = quiet_end_of_life_banner()
    if note:
        print(note, file=sys.stderr)
    # The CDK's jsii process starts on this import, with the environment set above.
    from aws_cdk import App

    from infra.config import documentation_placeholders, resolve_config
    from infra.stacks.environment import build_environment
    from infra.stacks.nag import acknowledge_findings, enable_nag
    from nvrx_eks.facts.errors import ConfigError
    from nvrx_eks.facts.exit_codes import EXIT_CONFIG_ERROR

    app = App()
    try:
        config = resolve_config(app.node.try_get_context("profile"), app.node.try_get_context("config"))
        environment = build_environment(app, config)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(EXIT_CONFIG_ERROR)
    # Warn, not fail: the offline rehearsal synthesizes the shipped profiles unchanged;
    # `nvrx-eks preflight` fails on the same fields before a real deploy.
    for placeholder in documentation_placeholders(config):
        print(f"warning: {placeholder}", file=sys.stderr)
    acknowledge_findings(environment)
    enable_nag(app)
    app.synth()


if __name__ == "__main__":
    main()
