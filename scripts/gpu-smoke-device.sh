#!/usr/bin/env bash
# Usage: scripts/gpu-smoke-device.sh OUT_DIR [gpu-smoke arguments, e.g. --preset small, --dry-run]
#
# The GPU smoke (nvrx_eks/ops/gpu_smoke.py) on a bare GPU machine: one with its own torch, none of
# the project's other packages and no network, to which this checkout was copied with the wheels
# of `make gpu-wheels`. Run from anywhere; it works in the checkout's root:
#   1. installs the carried wheels (GPU_WHEELS_DIR, default .gpu-wheels) into the running python3's
#      environment, not into a --target folder, so ft_launcher lands beside the interpreter; a
#      wheel whose distribution is already there at a compatible version is skipped
#      (scripts/gpu_wheels.py install-plan);
#   2. records the machine in OUT_DIR/env.txt (GPUs, driver, /dev/shm and disk, glibc, python,
#      torch, NCCL, NVRx, pydantic);
#   3. runs the smoke within --budget-s (default GPU_SMOKE_BUDGET_S, 420 s) and a timeout
#      GPU_SMOKE_GRACE_S (60 s) past it, whose SIGTERM lets the launch in progress stop its ranks
#      (a SIGKILL follows 45 s later): all of it fits a 10-minute slot. Its runs and checkpoints go
#      to a new folder under GPU_SMOKE_RUNS_PARENT (default: whichever of TMPDIR and the checkout
#      has more free space), never into OUT_DIR;
#   4. copies, even when the smoke fails, times out or is stopped, what is small into OUT_DIR:
#      gpu_smoke.json, smoke.log (its last lines), run_tails.txt (each run's launcher log and event
#      tails, local_run.json, summary.json), env.txt and install.log. Five files: a machine that
#      returns few files returns them all. A process of the runs still alive then (the launchers
#      run in their own sessions, so a SIGKILL to the smoke leaves them) is killed: the GPU is
#      free for the next run.
# Exit code: the smoke's (0 passed, 1 a check failed, 2 a bad request, 124 the hard timeout), or 3
# when the wheels could not be installed.
set -uo pipefail

if [ $# -lt 1 ]; then
  echo "usage: $0 OUT_DIR [gpu-smoke arguments]" >&2
  exit 2
fi
repo=$(cd "$(dirname "$0")/.." && pwd)
cd "$repo" || exit 2
mkdir -p "$1" && out=$(cd "$1" && pwd)
shift
python=${PYTHON:-python3}
wheels=${GPU_WHEELS_DIR:-.gpu-wheels}
budget=${GPU_SMOKE_BUDGET_S:-420}
grace=${GPU_SMOKE_GRACE_S:-60}

# --budget-s given by the caller wins; the hard timeout follows whichever applies.
args=("$@")
for ((i = 0; i < ${#args[@]}; i++)); do
  case ${args[i]} in
    --budget-s) budget=${args[i + 1]:-$budget} ;;
    --budget-s=*) budget=${args[i]#--budget-s=} ;;
    --out | --out=*)
      echo "error: --out: the script chooses the runs' folder (GPU_SMOKE_RUNS_PARENT); give OUT_DIR instead" >&2
      exit 2
      ;;
  esac
done
case " ${args[*]} " in *" --budget-s"*) ;; *) args+=(--budget-s "$budget") ;; esac

# Checkpoints take many GB: the runs go where there is most room, outside OUT_DIR.
roomiest() {
  local best="" best_kib=-1 dir kib
  for dir in "$@"; do
    kib=$(df -Pk "$dir" 2>/dev/null | awk 'NR == 2 { print $4 }')
    if [ -n "$kib" ] && [ "$kib" -gt "$best_kib" ]; then best=$dir best_kib=$kib; fi
  done
  echo "$best"
}
runs_parent=${GPU_SMOKE_RUNS_PARENT:-$(roomiest "${TMPDIR:-/tmp}" "$repo")}
work=$(mktemp -d "$runs_parent/.gpu-smoke-runs.XXXXXX")
case "$work/" in
  "$out"/*)
    echo "error: GPU_SMOKE_RUNS_PARENT: $runs_parent is inside OUT_DIR $out; choose a folder outside it" >&2
    exit 2
    ;;
esac
smoke_out=$work/smoke

# shellcheck disable=SC2329 # run by the EXIT trap
collect() {
  [ -f "$smoke_out/gpu_smoke.json" ] && cp "$smoke_out/gpu_smoke.json" "$out/"
  [ -f "$work/smoke.log" ] && tail -n 300 "$work/smoke.log" >"$out/smoke.log"
  local run file
  for run in "$smoke_out"/*/; do
    [ -d "$run" ] || continue
    echo "=== $run"
    for file in "$run"launcher.log "$run"coordinator.log; do
      [ -f "$file" ] && { echo "--- $file, last 200 lines"; tail -n 200 "$file"; }
    done
    for file in "$run"local_run.json "$run"summary.json; do
      [ -f "$file" ] && { echo "--- $file"; cat "$file"; echo; }
    done
    for file in "$run"events/*.jsonl; do
      [ -f "$file" ] && { echo "--- $file, last 40 lines"; tail -n 40 "$file"; }
    done
  done >"$out/run_tails.txt"
  # Found by the runs' folder in their command lines: a unique mktemp name, no other process's.
  local proc leftovers=()
  for proc in /proc/[0-9]*; do
    [ "${proc#/proc/}" != $$ ] && grep -qF "$work/" "$proc/cmdline" 2>/dev/null && leftovers+=("${proc#/proc/}")
  done
  # ...and each launch's coordinator, whose command line names no run folder: by the pidfile the
  # runner writes in the run (workloads/launch.py COORDINATOR_PIDFILE), if it is still that process.
  local pidfile pid
  for pidfile in "$smoke_out"/*/pids/coordinator.pid; do
    [ -f "$pidfile" ] || continue
    pid=$(cat "$pidfile")
    grep -qF "workloads.coordinator" "/proc/$pid/cmdline" 2>/dev/null && leftovers+=("$pid")
  done
  if ((${#leftovers[@]})); then
    kill -KILL "${leftovers[@]}" 2>/dev/null
    echo "gpu-smoke-device: killed ${#leftovers[@]} leftover process(es) of the runs: ${leftovers[*]}"
  fi
  echo "gpu-smoke-device: report in $out; runs and checkpoints in $work"
}
trap collect EXIT
trap 'exit 143' TERM
trap 'exit 130' INT

# 1. The carried wheels, into this interpreter's environment.
echo "wheels from $wheels into $("$python" -c 'import sys; print(sys.prefix)')" >"$out/install.log"
if ! "$python" scripts/gpu_wheels.py install-plan "$wheels" >"$work/install-plan.txt" 2>>"$out/install.log"; then
  echo "error: scripts/gpu_wheels.py install-plan failed; see $out/install.log" >&2
  exit 3
fi
mapfile -t to_install <"$work/install-plan.txt"
if ((${#to_install[@]})); then
  if ! "$python" -m pip install --no-index --no-deps --disable-pip-version-check -q "${to_install[@]}" \
    >>"$out/install.log" 2>&1; then
    echo "error: installing the wheels of $wheels failed; see $out/install.log" >&2
    exit 3
  fi
  printf 'installed %s\n' "${to_install[@]}" >>"$out/install.log"
else
  echo "nothing to install" >>"$out/install.log"
fi
if ! compgen -G "$wheels/*.whl" >/dev/null; then
  echo "no wheels in $wheels: on a bare GPU machine, run make gpu-wheels first and carry .gpu-wheels" \
    >>"$out/install.log"
fi

# 2. The machine, as the smoke will meet it.
{
  echo "date: $(date -u +%FT%TZ)"
  echo "uname: $(uname -srm)"
  echo "cpus: $(nproc)"
  echo "glibc: $(ldd --version 2>&1 | head -n 1)"
  if command -v nvidia-smi >/dev/null; then
    nvidia-smi -L
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
  else
    echo "nvidia-smi: not found"
  fi
  echo "--- df -h /dev/shm . $runs_parent"
  df -h /dev/shm . "$runs_parent"
  echo "--- python"
  PYTHONPATH="$repo${PYTHONPATH:+:$PYTHONPATH}" "$python" - <<'PY'
import importlib.metadata
import platform
import sys

print("python:", sys.version.split()[0], sys.executable)
print("libc:", *platform.libc_ver())
for dist in ("nvidia-resiliency-ext", "pydantic", "pydantic-core", "numpy"):
    try:
        print(f"{dist}: {importlib.metadata.version(dist)}")
    except importlib.metadata.PackageNotFoundError:
        print(f"{dist}: not installed")
try:
    from nvrx_eks.local.launcher_command import ft_launcher_command

    print("ft_launcher as the runner starts it:", *ft_launcher_command())
except Exception as err:
    print("ft_launcher: cannot tell:", repr(err))
try:
    import torch

    print("torch:", torch.__version__, "cuda:", torch.version.cuda, "available:", torch.cuda.is_available())
    if torch.cuda.is_available():
        print("nccl:", ".".join(map(str, torch.cuda.nccl.version())))
        for index in range(torch.cuda.device_count()):
            print(f"gpu {index}:", torch.cuda.get_device_name(index))
except Exception as err:  # the record is what the machine is, failures included
    print("torch: failed to import:", repr(err))
PY
} >"$out/env.txt" 2>&1

# 3. The smoke, from the checkout's root (the ranks run `python -m workloads.train` there).
PYTHONPATH="$repo${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 \
  timeout --kill-after=45 "$(awk -v b="$budget" -v g="$grace" 'BEGIN { print int(b + g) }')" \
  "$python" -m nvrx_eks.ops.gpu_smoke --out "$smoke_out" "${args[@]}" 2>&1 | tee "$work/smoke.log"
exit "${PIPESTATUS[0]}"
