"""Peak memory of `nvrx-eks export` on a checkpoint of the small preset (BENCHMARKS.md, "Export to
Hugging Face format"): `python benchmarks/hf-export/measure.py WORK_DIR` trains the small preset
for 4 steps on 2 CPU ranks (one committed checkpoint), then exports it in a fresh process and
writes benchmarks/hf-export/result.json.

The baseline is a process that imports what the export imports and does nothing; the export's
peak is its own high-water mark (VmHWM in /proc/self/status: ru_maxrss would carry what the
forking parent held)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
_PEAK = 'int(next(l for l in open("/proc/self/status") if l.startswith("VmHWM:")).split()[1]) * 1024'
BASELINE = f"import nvrx_eks.cli, nvrx_eks.ops.hf_export, tokenizers; print({_PEAK})"
EXPORT = f"""
import sys
from nvrx_eks.cli import main
sys.argv = ["nvrx-eks", "export", *sys.argv[1:]]
try:
    main()
except SystemExit as end:
    assert not end.code, end.code
print({_PEAK})
"""


def _python(code: str, *args: str) -> tuple[int, float]:
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, cwd=REPO, check=True)
    return int(done.stdout.strip().splitlines()[-1]), time.monotonic() - started


def main() -> None:
    work = Path(sys.argv[1])
    run, out = work / "run", work / "small-hf"
    if not (run / "checkpoints").is_dir():
        subprocess.run(
            [sys.executable, "-m", "nvrx_eks.cli", "local", "--preset", "small", "--nproc", "2", "--steps", "4",
             "--checkpoint-interval", "4", "--backend", "sync", "--run-dir", str(run),
             # A step of the small preset takes seconds on 2 shared cores; no fault is injected,
             # so the in-process watchdog has nothing to catch and only a timeout to misfire.
             "--set", "inprocess.enabled=false"],
            cwd=REPO, check=True, stdout=subprocess.DEVNULL,
        )  # fmt: skip
    baseline, _ = _python(BASELINE)
    peak, seconds = _python(EXPORT, str(run), "--out", str(out))
    weights = sum(p.stat().st_size for p in out.glob("*.safetensors"))
    largest = 8192 * 512 * 4  # the small preset's embedding and output projection, fp32
    result = {
        "command": f"nvrx-eks export {run} --out {out}",
        "weights_bytes": weights,
        "largest_tensor_bytes": largest,
        "baseline_peak_bytes": baseline,
        "export_peak_bytes": peak,
        "growth_bytes": peak - baseline,
        "growth_over_largest_tensor": round((peak - baseline) / largest, 2),
        "seconds": round(seconds, 1),
    }
    (HERE / "result.json").write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
