"""How this interpreter starts NVRx's ft_launcher, for the runs started on this machine
(`nvrx-eks local`, `gpu-smoke`)."""

from __future__ import annotations

import sys
from pathlib import Path

#: ft_launcher's module; its console script runs this module's `main`, and the module runs it too
#: when started with `python -m` (NVRx 0.7.0).
FT_LAUNCHER_MODULE = "nvidia_resiliency_ext.fault_tolerance.launcher"


def ft_launcher_command() -> list[str]:
    """The console script beside this interpreter (a virtual environment's bin/), else the module
    run by this interpreter: wheels installed with `pip install --target` and found through
    PYTHONPATH leave no script anywhere. Never a script found on PATH: ft_launcher starts the
    ranks with its own interpreter, and one on PATH may belong to another environment, with
    another torch."""
    script = Path(sys.executable).parent / "ft_launcher"
    if script.is_file():
        return [str(script)]
    return [sys.executable, "-m", FT_LAUNCHER_MODULE]
