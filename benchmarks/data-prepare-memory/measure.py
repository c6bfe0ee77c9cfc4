"""Peak memory of `nvrx-eks data prepare --tokenizer byte` by the length of a line (BENCHMARKS.md,
"Data preparation memory"): `python benchmarks/data-prepare-memory/measure.py WORK_DIR` writes
three gzip inputs into WORK_DIR and prepares each in a fresh process:

* lines100m:   100 MB of text in 100-byte lines;
* oneline100m: the same text with its line breaks turned into spaces: one 100 MB line;
* bomb1g:      1 GiB of `a` and no line break, 1 MiB compressed.

It prints each run's peak (VmHWM in /proc/self/status at the end of the command, the high-water
mark of that process alone) and writes benchmarks/data-prepare-memory/result.json. `--tree DIR`
measures another checkout of the project instead (PYTHONPATH=DIR), to compare with an earlier
version; `--cases` picks the inputs (an earlier version needs ~17 bytes of
memory per byte of its longest line: leave bomb1g out there). Only a run of every case on this
checkout writes result.json."""

from __future__ import annotations

import argparse
import gzip
import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
MB = 1_000_000
_PEAK = 'int(next(l for l in open("/proc/self/status") if l.startswith("VmHWM:")).split()[1]) * 1024'
PREPARE = f"""
import sys
from nvrx_eks.cli import main
sys.argv = ["nvrx-eks", "data", "prepare", *sys.argv[1:]]
try:
    main()
except SystemExit as end:
    assert not end.code, end.code
print({_PEAK})
"""
CASES = ("lines100m", "oneline100m", "bomb1g")


def _write_inputs(work: Path, cases: list[str]) -> dict[str, Path]:
    """The gzip inputs, written once into `work` (seeded: the same bytes every time)."""
    paths = {case: work / f"{case}.txt.gz" for case in cases}
    if any(case.endswith("100m") and not paths[case].exists() for case in cases):
        rng = random.Random(20261202)
        words = ["".join(rng.choice("etaoinshrdlu") for _ in range(rng.randint(2, 9))) for _ in range(5000)]
        lines = [(" ".join(rng.choice(words) for _ in range(20)) + " " * 99)[:99] for _ in range(MB)]
        text = {"lines100m": "\n".join(lines) + "\n", "oneline100m": " ".join(lines) + " "}
        for case in ("lines100m", "oneline100m"):
            with gzip.open(work / f"{case}.txt.gz", "wt", compresslevel=1) as f:
                f.write(text[case])
    if "bomb1g" in paths and not paths["bomb1g"].exists():
        with gzip.open(paths["bomb1g"], "wb", compresslevel=9) as f:
            for _ in range(1024):
                f.write(b"a" * (1 << 20))
    return paths


def _prepare(tree: Path, source: Path, out: Path) -> tuple[int, float]:
    """(peak bytes, seconds) of one `data prepare` in a fresh process of `tree`."""
    env = {**os.environ, "PYTHONPATH": str(tree)}
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-c", PREPARE, str(source), "--out", str(out), "--tokenizer", "byte"],
        capture_output=True, text=True, cwd=tree, env=env, check=True,
    )  # fmt: skip
    return int(done.stdout.strip().splitlines()[-1]), time.monotonic() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("work", type=Path)
    parser.add_argument("--tree", type=Path, default=REPO, help="the checkout to measure (default: this one)")
    parser.add_argument("--cases", default=",".join(CASES), help=f"comma-separated, of {', '.join(CASES)}")
    args = parser.parse_args()
    cases = [case for case in args.cases.split(",") if case]
    if unknown := set(cases) - set(CASES):
        parser.error(f"--cases: unknown {sorted(unknown)}; choose from {', '.join(CASES)}")
    args.work.mkdir(parents=True, exist_ok=True)
    inputs = _write_inputs(args.work, cases)
    runs = {}
    for case, source in inputs.items():
        out = args.work / f"out-{case}"
        subprocess.run(["rm", "-rf", str(out)], check=True)
        peak, seconds = _prepare(args.tree.resolve(), source, out)
        manifest = json.loads((out / "manifest.json").read_text())
        runs[case] = {
            "command": f"nvrx-eks data prepare {source.name} --out {out.name} --tokenizer byte",
            "input_bytes_compressed": source.stat().st_size,
            "tokens": manifest["total_tokens"],
            "peak_bytes": peak,
            "seconds": round(seconds, 1),
        }
        print(json.dumps({case: runs[case]}), flush=True)
        subprocess.run(["rm", "-rf", str(out)], check=True)
    if args.tree.resolve() == REPO and cases == list(CASES):
        (HERE / "result.json").write_text(json.dumps(runs, indent=1) + "\n")


if __name__ == "__main__":
    main()
