"""User-facing configuration errors, shared by the trainer, the infrastructure config and the CLI.

A ConfigError stays data until it is printed: a list of issues, each the path of the offending
field (empty for the whole input) and what is wrong with it and how to fix it, plus the source
they are about. It formats itself once, in __str__; the validator turns the issues straight into
findings. The entry points turn it into exit code 2 without a traceback.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from pydantic import ValidationError

#: A field path: ("checkpoint", "local", "dir"); () for the input as a whole.
FieldPath = tuple[str, ...]
#: One thing wrong: where, and what.
Issue = tuple[FieldPath, str]


class ConfigError(ValueError):
    """A mistake the user can fix in their configuration or command line.

    `ConfigError("message")` is one issue about the whole input, printed as the message.
    `ConfigError(issues=[(path, message), ...], source=...)` prints a heading (`message`, or
    "invalid configuration in <source>:") and one indented `path: message` line per issue.
    """

    def __init__(self, message: str = "", *, issues: Iterable[Issue] | None = None, source: str | None = None):
        self.source = source
        if issues is None:
            self.heading: str | None = None
            self.issues: list[Issue] = [((), message)]
        else:
            self.heading = message or f"invalid configuration in {source}:"
            self.issues = [(tuple(path), text) for path, text in issues]
        super().__init__(str(self))

    def __str__(self) -> str:
        if self.heading is None:
            return self.issues[0][1]
        lines = [self.heading]
        for path, text in self.issues:
            first, *more = text.split("\n")
            lines.append(f"  {'.'.join(path) or '(top level)'}: {first}")
            # A multi-line message keeps its continuation lines under its own entry.
            lines.extend(line if line.startswith("  ") else f"  {line}" for line in more)
        return "\n".join(lines)


def validation_issues(err: ValidationError) -> list[Issue]:
    """(field path, message) for every error pydantic found, in words a user acts on."""
    issues: list[Issue] = []
    for e in err.errors():
        msg = e["msg"]
        # Pydantic prefixes messages from our own validators with "Value error, ".
        msg = msg.removeprefix("Value error, ").removeprefix("Assertion failed, ")
        if e["type"] == "extra_forbidden":
            msg = "unknown field; remove it or check its spelling"
        elif e["type"] == "missing":
            msg = "required field is missing; add it"
        issues.append((tuple(str(p) for p in e["loc"]), msg))
    return issues


def describe_validation_error(err: ValidationError, source: str) -> ConfigError:
    """Turn a pydantic ValidationError into a ConfigError naming every offending field by path."""
    return ConfigError(issues=validation_issues(err), source=source)


#: C0 and C1 control characters but tab and newline.
_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def terminal_safe(text: str) -> str:
    """`text` with its control characters written as escapes (ESC as \\x1b): messages and tables
    echo what a user or a file gave (a path, a kubeconfig context name), which must not recolour
    the terminal or move its cursor."""
    return _CONTROL.sub(lambda found: repr(found.group())[1:-1], text)
