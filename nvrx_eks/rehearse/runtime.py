"""The container runtime of a rehearsal: podman with runc, configured by the project's own
containers.conf, and containerd's RuntimeDefault seccomp profile for pods that ask for
`RuntimeDefault` (podman's own default allows what containerd refuses: seccomp/README.md)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from importlib import resources
from pathlib import Path
from typing import Any

from nvrx_eks.facts.errors import ConfigError

#: Every container and image a rehearsal makes carries this label, so a crashed rehearsal's
#: leftovers can be found and removed.
REHEARSAL_LABEL = "nvrx-eks.io/rehearsal"


def _package_file(name: str) -> Path:
    return Path(str(resources.files("nvrx_eks.rehearse") / name))


CONTAINERS_CONF = _package_file("containers.conf")
#: containerd's RuntimeDefault profile (generated from containerd's source; see its README).
CONTAINERD_SECCOMP = _package_file("seccomp/containerd-runtime-default.json")


class Podman:
    """podman, run with the project's containers.conf."""

    def __init__(self, binary: str | None = None):
        self.binary = binary or shutil.which("podman") or "podman"
        self.env = {**os.environ, "CONTAINERS_CONF": str(CONTAINERS_CONF)}

    def unusable(self) -> str | None:
        """Why podman cannot run rehearsals here, in one line; None when it can."""
        if shutil.which(self.binary) is None:
            return "podman is not installed (Debian: apt-get install podman runc catatonit mmdebstrap)"
        result = self.run(["info", "--format", "{{.Host.OCIRuntime.Name}}"], check=False)
        if result.returncode != 0:
            last = result.stderr.strip().splitlines()[-1:] or ["no output"]
            return f"podman info failed: {last[0]}"
        return None

    def run(self, argv: list[str], *, check: bool = True, **kwargs: Any) -> subprocess.CompletedProcess[str]:
        result = subprocess.run(
            [self.binary, *argv], env=self.env, capture_output=True, text=True, check=False, **kwargs
        )
        if check and result.returncode != 0:
            raise ConfigError(f"podman {argv[0]} failed ({result.returncode}): {result.stderr.strip()[-2000:]}")
        return result

    def popen(self, argv: list[str], **kwargs: Any) -> subprocess.Popen[bytes]:
        return subprocess.Popen([self.binary, *argv], env=self.env, **kwargs)

    def image_exists(self, tag: str) -> bool:
        return self.run(["image", "exists", tag], check=False).returncode == 0

    def inspect(self, name: str) -> dict[str, Any]:
        return json.loads(self.run(["container", "inspect", name]).stdout)[0]

    def exit_code(self, name: str) -> int | None:
        """The container's exit code once it has exited, else None."""
        state = self.inspect(name)["State"]
        return None if state["Status"] in ("created", "running", "stopping", "paused") else int(state["ExitCode"])

    def remove_labelled(self, label: str) -> list[str]:
        """Force-remove every container carrying `label` (name=value); returns their names."""
        listed = self.run(["ps", "-a", "--filter", f"label={label}", "--format", "{{.Names}}"]).stdout.split()
        if listed:
            self.run(["rm", "-f", "-t", "0", *listed], check=False)
        return listed
