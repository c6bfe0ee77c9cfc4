"""The trainer's Python requirements, read from pyproject.toml (the `trainer` extra), the one
place their versions are pinned.

Used by the container image build (`python3 scripts/trainer_requirements.py > requirements.txt`,
before anything else is installed), by scripts/setup_env.sh (`--pin nvidia-resiliency-ext`) and
by the image gates in the tests. Standard library only, and run as a file, not as a module of the
`scripts` package: in the image build nothing of the project is importable yet.
"""

from __future__ import annotations

import argparse
import re
import sys
import tomllib
from pathlib import Path

PYPROJECT = Path(__file__).resolve().parent.parent / "pyproject.toml"
EXTRA = "trainer"

_NAME = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)")


def _normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def trainer_requirements(pyproject: Path = PYPROJECT) -> list[str]:
    """The requirement strings of the `trainer` extra, as written in pyproject.toml."""
    with pyproject.open("rb") as f:
        extras = tomllib.load(f)["project"]["optional-dependencies"]
    return list(extras[EXTRA])


def pinned_version(package: str, pyproject: Path = PYPROJECT) -> str:
    """The exact version `package==X` pins in the trainer extra; KeyError if it is not pinned."""
    for requirement in trainer_requirements(pyproject):
        name = _NAME.match(requirement)
        if name and _normalize(name.group(1)) == _normalize(package):
            spec = requirement[name.end() :].strip()
            if spec.startswith("==") and "," not in spec and ";" not in spec:
                return spec[2:].strip()
    raise KeyError(f"{package} is not pinned with == in the [{EXTRA}] extra of {pyproject}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pin", metavar="PACKAGE", help="print only the pinned version of PACKAGE")
    args = parser.parse_args(argv)
    try:
        if args.pin:
            print(pinned_version(args.pin))
        else:
            print("\n".join(trainer_requirements()))
    except KeyError as err:
        print(f"trainer_requirements: {err.args[0]}", file=sys.stderr)
        return 2
    except (OSError, tomllib.TOMLDecodeError) as err:
        print(f"trainer_requirements: cannot read {PYPROJECT}: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
