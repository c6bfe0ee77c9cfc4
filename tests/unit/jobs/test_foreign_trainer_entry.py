"""`--trainer`: a trainer that is not ours replaces ours in the rendered pod's preflight and
launcher lines only, and an entry the pod cannot run is refused. That such a trainer runs under
the rendered pod (workloads/README.md, "Bring your own trainer"): tests/runs/jobs/test_foreign_trainer.py."""

from __future__ import annotations

import pytest

from nvrx_eks.facts.names import FSX_MOUNT_PATH
from tests.support.cli_harness import run_cli

#: Where the job finds it: on the claim, which every pod mounts at /fsx.
TRAINER_IN_POD = f"{FSX_MOUNT_PATH}/code/foreign_trainer.py"


def _script_lines(rendered_text: str) -> list[str]:
    return [line.strip() for line in rendered_text.splitlines()]


@pytest.mark.parametrize("trainer, entry", [(TRAINER_IN_POD, [TRAINER_IN_POD]), ("mypkg.train", ["-m", "mypkg.train"])])
def test_the_trainer_entry_replaces_ours_in_the_preflight_and_the_launcher_only(trainer, entry):
    ours = run_cli("render", "--nodes", "2")
    theirs = run_cli("render", "--nodes", "2", "--trainer", trainer)
    assert ours.code == theirs.code == 0, theirs.output
    changed = [(a, b) for a, b in zip(_script_lines(ours.stdout), _script_lines(theirs.stdout), strict=True) if a != b]
    assert len(changed) == 2, changed
    for before, after in changed:
        assert after == before.replace("-m workloads.train", " ".join(entry))
    preflight, launcher = (after for _, after in changed)
    assert preflight.startswith(f"python {' '.join(entry)} --config /etc/nvrx-eks/train.yaml --preflight")
    assert launcher.startswith("ft_launcher ") and f" {' '.join(entry)} --config /etc/nvrx-eks/train.yaml" in launcher
    # submit validates the job as it would run ours: the entry is the one difference.
    assert run_cli("submit", "--dry-run", "--nodes", "2", "--trainer", trainer).code == 0


@pytest.mark.parametrize(
    "args, message",
    [
        (["--trainer", "my trainer.py"], "--trainer: 'my trainer.py' is neither a Python module name"),
        (["--trainer", "train.py"], "--trainer: 'train.py' is neither"),  # relative: the pod's cwd is the image's
        (["--trainer", "/fsx/../etc/x.py"], "--trainer: '/fsx/../etc/x.py' is neither"),
        (["--fabric-test", "--trainer", "mypkg.train"], "drop --train-config, --set, --faults and --trainer"),
    ],
)
def test_a_trainer_entry_the_pod_cannot_run_is_refused(args, message):
    result = run_cli("render", *args)
    assert result.code == 2 and message in result.stderr, result.output
