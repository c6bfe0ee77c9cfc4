"""User-facing configuration errors, shared by the trainer, the infrastructure config and the CLI.

A ConfigError carries one readable paragraph: which field is wrong, why, and how to fix it. The
entry points turn it into exit code 2 without a traceback.
"""

from __future__ import annotations

from pydantic import ValidationError


class ConfigError(ValueError):
    """A mistake the user can fix in their configuration or command line."""


def describe_validation_error(err: ValidationError, source: str) -> ConfigError:
    """Turn a pydantic ValidationError into a ConfigError naming every offending field by path."""
    lines = []
    for e in err.errors():
        path = ".".join(str(p) for p in e["loc"]) or "(top level)"
        msg = e["msg"]
        # Pydantic prefixes messages from our own validators with "Value error, ".
        msg = msg.removeprefix("Value error, ").removeprefix("Assertion failed, ")
        if e["type"] == "extra_forbidden":
            msg = "unknown field; remove it or check its spelling"
        elif e["type"] == "missing":
            msg = "required field is missing; add it"
        lines.append(f"  {path}: {msg}")
    return ConfigError(f"invalid configuration in {source}:\n" + "\n".join(lines))
