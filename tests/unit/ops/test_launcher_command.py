"""How `nvrx-eks local` and `gpu-smoke` start ft_launcher (nvrx_eks.local.launcher_command): with
NVRx's wheels installed by `pip install --target` and found through PYTHONPATH there is no
ft_launcher script beside the interpreter, and the launcher still starts."""

from __future__ import annotations

import os
import site
import subprocess
import sys
from pathlib import Path

from nvrx_eks.local.launcher_command import FT_LAUNCHER_MODULE, ft_launcher_command


def test_in_a_virtual_environment_it_is_the_script_beside_the_interpreter():
    script = Path(sys.executable).parent / "ft_launcher"
    assert script.is_file(), "the project's venv installs NVRx's console script"
    assert ft_launcher_command() == [str(script)]


def test_without_the_script_this_interpreter_runs_the_module_and_the_launcher_starts(tmp_path, monkeypatch):
    # An interpreter outside the venv, with NVRx reachable only through PYTHONPATH.
    bare = tmp_path / "bin" / "python3"
    bare.parent.mkdir()
    bare.symlink_to(Path(sys.executable).resolve())
    monkeypatch.setattr(sys, "executable", str(bare))

    command = ft_launcher_command()

    assert command == [str(bare), "-m", FT_LAUNCHER_MODULE]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(site.getsitepackages())}
    started = subprocess.run([*command, "--help"], capture_output=True, text=True, env=env, timeout=120)
    assert started.returncode == 0, started.stderr[-2000:]
    assert "--ft-rank-section-timeouts" in started.stdout
