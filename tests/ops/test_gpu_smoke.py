"""The GPU smoke script's dry mode: the same code path as on a GPU machine (ft_launcher, the real
trainer, NVRx checkpoints, faults, resume, stall and memory checks), on CPU with gloo."""

from __future__ import annotations

import json

import pytest

from nvrx_eks.facts.errors import ConfigError
from nvrx_eks.ops.gpu_smoke import plan_for, smoke

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("trainer_runs")]


def test_dry_run_passes_every_check_and_writes_the_json(tmp_path, tmp_path_factory):
    from rich.console import Console

    from tests.support.trainer_fixtures import exclusive_trainer_runs

    with exclusive_trainer_runs(tmp_path_factory), open(tmp_path / "console.txt", "w") as sink:
        result = smoke(out_dir=tmp_path / "smoke", dry_run=True, console=Console(file=sink))
    written = json.loads((tmp_path / "smoke" / "gpu_smoke.json").read_text())
    assert written == result
    checks = result["checks"]
    assert result["ok"], checks
    assert checks["faults"]["inprocess_restarts"] == 2 and checks["faults"]["same_pids"]
    assert checks["faults"]["backend"] == "gloo"
    assert checks["resume"]["resumed_from_step"] == plan_for(True, None, None).steps
    assert checks["stall"]["async_median_s"] is not None and checks["stall"]["sync_median_s"] is not None
    # No GPU here: nothing may stand in for the measurement.
    assert checks["memory"]["peak_reserved_gib"] is None and checks["memory"]["estimate_gib"] > 0
    assert result["mode"].startswith("dry-run") and result["bf16"] is False


def test_without_a_gpu_the_real_mode_refuses_with_the_fix(tmp_path):
    with pytest.raises(ConfigError, match="--dry-run"):
        smoke(out_dir=tmp_path / "x")
