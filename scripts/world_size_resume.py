"""A run resumed on another world size, measured: `python scripts/world_size_resume.py OUT`.

Trains 4 ranks for 20 of 40 steps, then resumes the same checkpoint twice, on 2 ranks and on 4
(the reference: the same schedule, the same state), and writes OUT/loss.png with the three loss
curves plus the largest per-step difference between the two resumes (printed and in
OUT/result.json). The first leg stops at step 20 of a 20-step schedule, so both resumes continue
that schedule; compare them with each other, not with an uninterrupted 40-step run.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from workloads.events import load_run  # noqa: E402

CLI = [sys.executable, "-c", "from nvrx_eks.cli import main; main()"]


def _local(run_dir: Path, nproc: int, steps: int, *extra: str) -> None:
    argv = [*CLI, "local", "--nproc", str(nproc), "--steps", str(steps), "--run-dir", str(run_dir), *extra]
    subprocess.run(argv, check=True, stdout=subprocess.DEVNULL)


def _losses(run_dir: Path, after: int = 0) -> dict[int, float]:
    return {e["step"]: e["loss"] for e in load_run(run_dir).of("step_end", rank=0) if e["step"] > after}


def _summary(run_dir: Path) -> dict:
    return json.loads((run_dir / "summary.json").read_text())


def main(out: Path) -> None:
    first, fewer, same = out / "first", out / "fewer", out / "same"
    for run_dir in (first, fewer, same):
        shutil.rmtree(run_dir, ignore_errors=True)
    _local(first, 4, 20)
    shutil.copytree(first, fewer)
    shutil.copytree(first, same)
    _local(fewer, 2, 40, "--resume")
    _local(same, 4, 40, "--resume")
    base, ours, theirs = _losses(first), _losses(fewer, 20), _losses(same, 20)
    differences = [abs(ours[s] - theirs[s]) for s in sorted(theirs)]
    result = {
        "max_abs_loss_difference": max(differences),
        "mean_abs_loss_difference": sum(differences) / len(differences),
        "final_loss": {"4->2": ours[max(ours)], "4->4": theirs[max(theirs)]},
        "global_batch_tokens": [_summary(d)["global_batch_tokens"] for d in (fewer, same)],
    }
    (out / "result.json").write_text(json.dumps(result, indent=1))
    print(json.dumps(result, indent=1))
    figure, axis = plt.subplots(figsize=(7, 4))
    axis.plot(list(base), list(base.values()), color="black", label="4 ranks, steps 1-20")
    axis.plot(list(theirs), list(theirs.values()), color="tab:blue", label="resumed on 4 ranks")
    axis.plot(list(ours), list(ours.values()), color="tab:orange", linestyle="--", label="resumed on 2 ranks")
    axis.set(xlabel="step", ylabel="loss (mean over ranks)", title="Resume on another world size (tiny preset, CPU)")
    axis.legend()
    figure.tight_layout()
    figure.savefig(out / "loss.png", dpi=120)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
