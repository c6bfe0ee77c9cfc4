"""YAML a user wrote (a trainer config, a deployment profile, a `--set` value), loaded within bounds.

PyYAML's safe loader composes a document recursively: a few kilobytes of `[[[[` or of indented
keys end in RecursionError, and everything that walks the result afterwards (copying, pydantic,
dumping) recurses as deep again. And it lets a later key silently replace an earlier one in the
same mapping, so a config holding `steps: 10` and further down `steps: 999999` trains for the
second. This loader is the safe loader with three refusals, each a ConfigError naming the source,
the line and the fix: text longer than MAX_YAML_CHARS, collections nested deeper than
MAX_NESTING, and a key written twice in one mapping (a `<<` merge may still supply keys that the
mapping then overrides: that is what a merge is for). YAML syntax errors stay yaml.YAMLError, for
the caller to word. read_user_text reads such a file, refusing a pipe, a device or a file far
too large before reading it.

Kubernetes manifests read by `validate` have their own bounds (nvrx_eks.jobs.validate), sized for
documents a hundred times larger.
"""

from __future__ import annotations

import stat
from pathlib import Path
from typing import Any

import yaml

from nvrx_eks.facts.errors import ConfigError

#: The longest text loaded. A trainer config travels in a ConfigMap, which Kubernetes caps at
#: 1 MiB; ours are a few kilobytes, and the pure-Python parser takes about a second per megabyte.
MAX_YAML_CHARS = 1 << 20
#: The deepest nesting of mappings and sequences. Our configs nest 4 deep; this stays far below
#: what Python's recursion limit (1000 frames) allows the loader and what walks its result.
MAX_NESTING = 50


class _BoundedLoader(yaml.SafeLoader):
    def __init__(self, text: str, source: str):
        super().__init__(text)
        self.source = source
        self.one_line = "\n" not in text.rstrip("\n")
        self.depth = 0

    def _refuse(self, mark: yaml.Mark, problem: str) -> ConfigError:
        return ConfigError(f"{self.source}{'' if self.one_line else f':{mark.line + 1}'}: {problem}")

    def compose_node(self, parent: yaml.Node | None, index: Any) -> yaml.Node | None:
        if not self.check_event(yaml.MappingStartEvent, yaml.SequenceStartEvent):
            return super().compose_node(parent, index)
        if self.depth >= MAX_NESTING:
            raise self._refuse(
                self.peek_event().start_mark,
                f"nests mappings and sequences more than {MAX_NESTING} deep; no setting does, check the "
                "indentation or brackets",
            )
        self.depth += 1
        try:
            return super().compose_node(parent, index)
        finally:
            self.depth -= 1

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[Any, yaml.Node] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node, deep=True)
            try:
                first = seen.setdefault(key, key_node)
            except TypeError:
                continue  # unhashable: the safe loader's own error names it
            if first is not key_node:
                raise self._refuse(
                    key_node.start_mark,
                    f"the key {repr(key)[:80]} is given a second time in the same mapping (first at line "
                    f"{first.start_mark.line + 1}); keep one of them",
                )
        return super().construct_mapping(node, deep=deep)


def read_user_text(path: Path) -> str:
    """The text of a user's YAML file, refusing (ConfigError) what is no file to read once: a
    pipe or a device (/dev/stdin waits for a writer, /dev/zero never ends) and a file far past
    MAX_YAML_CHARS. OSError and UnicodeDecodeError, as Path.read_text raises them, are the
    caller's to word."""
    info = path.stat()
    if stat.S_ISDIR(info.st_mode):
        return path.read_text()  # IsADirectoryError, which each caller words
    if not stat.S_ISREG(info.st_mode):
        raise ConfigError(f"{path} is a pipe or a device, not a file; give the path of the YAML file itself")
    if info.st_size > 4 * MAX_YAML_CHARS:  # UTF-8 takes at most 4 bytes a character
        raise ConfigError(f"{path}: {info.st_size:,} bytes, more than a config may have; give the config file itself")
    return path.read_text()


def load_user_yaml(text: str, source: str) -> Any:
    """The one document of `text` (named `source` in messages), within the bounds above."""
    if len(text) > MAX_YAML_CHARS:
        raise ConfigError(
            f"{source}: {len(text):,} characters, more than the {MAX_YAML_CHARS:,} a config may have; "
            "give the config file itself (ours are a few kilobytes)"
        )
    loader = _BoundedLoader(text, source)
    try:
        return loader.get_single_data()
    finally:
        loader.dispose()
