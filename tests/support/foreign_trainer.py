"""A trainer that is not this project's, kept to the contract of workloads/README.md ("Bring your
own trainer"): no NVRx Wrapper, no torch, only the standard library and PyYAML. The test
tests/runs/jobs/test_foreign_trainer.py runs it in the rendered trainer pod.

    python foreign_trainer.py --config PATH --preflight --world-size N   (once per pod, first)
    foreign_trainer.py --config PATH [launcher args]                       (each rank, under ft_launcher)

It "trains" `steps` steps, recording after each one the step in the checkpoint directory's
progress file, and writes result-rank<R>.json in its run directory. Two errors no restart can fix
end it with exit 93: in the preflight, shards it is told to read (data.path) that do not exist;
in a rank, a state file left in its run directory by another model.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import yaml

DO_NOT_REQUEUE = 93
STATE_FILE = "foreign-state.json"


def fail_attempt(run_dir: Path, rank: int, reason: str) -> int:
    """Record for this job attempt that no restart can fix it, then exit 93: ft_launcher would
    restart the rank whatever its code, so the record is what makes every pod exit 93."""
    records = run_dir / "do-not-requeue"
    records.mkdir(parents=True, exist_ok=True)
    attempt = os.environ["NVRX_EKS_ATTEMPT_ID"]
    (records / f"{attempt}.json").write_text(json.dumps({"reason": reason, "rank": rank, "time": time.time()}))
    print(f"error: {reason}", file=sys.stderr, flush=True)
    return DO_NOT_REQUEUE


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--config", required=True)
    parser.add_argument("--preflight", action="store_true")
    parser.add_argument("--world-size", type=int)
    args, launcher_args = parser.parse_known_args()  # launcher_args: for NVRx's in-process Wrapper only
    config = yaml.safe_load(Path(args.config).read_text())
    run_dir = Path(config["run_dir"])
    data = config["data"]
    if args.preflight:
        if data.get("path") and not Path(data["path"]).exists():
            print(f"error: data.path {data['path']} does not exist", file=sys.stderr, flush=True)
            return DO_NOT_REQUEUE
        print(f"preflight ok for world size {args.world_size}", flush=True)
        return 0

    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    state = run_dir / STATE_FILE
    model = config["model"]["preset"]
    if state.exists() and json.loads(state.read_text())["model"] != model:
        return fail_attempt(run_dir, rank, f"{state} was written for another model than {model}")
    checkpoints = Path(config["checkpoint"]["dir"] or run_dir / "checkpoints")
    checkpoints.mkdir(parents=True, exist_ok=True)
    for step in range(1, config["steps"] + 1):
        (checkpoints / "latest_step").write_text(str(step))  # ft_launcher's progress signal
    result = {
        "rank": rank,
        "world_size": world_size,
        "steps": config["steps"],
        "model": model,
        "launcher_args": launcher_args,
        "attempt": os.environ["NVRX_EKS_ATTEMPT_ID"],
    }
    (run_dir / f"result-rank{rank}.json").write_text(json.dumps(result))
    state.write_text(json.dumps({"model": model}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
