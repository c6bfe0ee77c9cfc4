#!/usr/bin/env bash
# Usage: scripts/gpu-smoke-device.sh OUT_DIR [gpu-smoke arguments, e.g. --preset 1b, --dry-run]
#
# The GPU smoke (nvrx_eks/ops/gpu_smoke.py) on a bare GPU machine: one with its own torch (any
# CPython 3.10-3.13), none of the project's other packages and no network, to which this checkout
# was copied with the wheels of `make gpu-wheels`. Run from anywhere; it works in the checkout's
# root:
#   1. records the machine in OUT_DIR/env.txt (date, kernel, glibc, GPUs and driver, /dev/shm and
#      disk);
#   2. installs from the carried wheels (GPU_WHEELS_DIR, default .gpu-wheels) only what the running
#      python3 lacks or has at a version NVRx's own requirements refuse, by name, so pip picks the
#      wheel for this CPython (scripts/gpu_wheels.py install-plan; the plan goes to install.log and
#      env.txt). Into the interpreter's environment (ft_launcher lands beside it), or, when that is
#      not writable or GPU_SMOKE_INSTALL=target, into a folder of the runs put on PYTHONPATH;
#   3. probes, within GPU_SMOKE_PROBE_TIMEOUT_S (15 s), that every module the smoke's processes
#      start from imports, and records the interpreter, the install plan, torch, CUDA and NCCL in
#      env.txt (python -m nvrx_eks.ops.gpu_env probe);
#   4. runs the smoke (--preset small unless told otherwise: one GPU runs all of it in the budget)
#      within --budget-s (default GPU_SMOKE_BUDGET_S, 420 s) and a timeout
#      GPU_SMOKE_GRACE_S (60 s) past it, whose SIGTERM lets the launch in progress stop its ranks
#      (a SIGKILL follows 45 s later): all of it fits a 10-minute slot. Its runs and checkpoints go
#      to a new folder under GPU_SMOKE_RUNS_PARENT (default: whichever of TMPDIR and the checkout
#      has more free space), never into OUT_DIR;
#   5. copies, even when the smoke fails, times out or is stopped, what is small into OUT_DIR:
#      gpu_smoke.json, smoke.log (its last lines), run_tails.txt (each run's launcher log and event
#      tails, local_run.json, summary.json), env.txt and install.log. Five files: a machine that
#      returns few files returns them all. A process of the runs still alive then (the launchers
#      run in their own sessions, so a SIGKILL to the smoke leaves them) is killed: the GPU is
#      free for the next run.
# Exit code: the smoke's (0 passed, 1 a check failed, 2 a bad request, 124 the hard timeout), or 3
# when this interpreter cannot be made ready (install.log and env.txt say why, stderr in one line).
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
probe_timeout=${GPU_SMOKE_PROBE_TIMEOUT_S:-15}
install_mode=${GPU_SMOKE_INSTALL:-env}
case $install_mode in
  env | target) ;;
  *)
    echo "error: GPU_SMOKE_INSTALL: '$install_mode' is neither env nor target" >&2
    exit 2
    ;;
esac

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
case " ${args[*]} " in *" --preset"* | *" --dry-run "*) ;; *) args+=(--preset small) ;; esac

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

# Exit 3: this interpreter cannot be made ready; the reason on stderr, in the logs beside it.
not_ready() {
  echo "gpu-smoke-device: not ready: $1" | tee -a "$out/env.txt" >&2
  exit 3
}

# 1. The machine, as the smoke will meet it.
{
  echo "date: $(date -u +%FT%TZ)"
  echo "uname: $(uname -srm)"
  echo "cpus: $(nproc)"
  echo "ldd: $(ldd --version 2>&1 | head -n 1)"
  if command -v nvidia-smi >/dev/null; then
    nvidia-smi -L
    nvidia-smi --query-gpu=name,driver_version,memory.total,compute_mode --format=csv
  else
    echo "nvidia-smi: not found"
  fi
  echo "--- df -h /dev/shm . $runs_parent"
  df -h /dev/shm . "$runs_parent"
} >"$out/env.txt" 2>&1

# 2. From the carried wheels, what this interpreter lacks.
plan=$work/install-plan.txt
echo "wheels from $wheels for $("$python" -c 'import sys; print(sys.executable, sys.version.split()[0])')" \
  >"$out/install.log" 2>&1
if ! compgen -G "$wheels/*.whl" >/dev/null; then
  echo "no wheels in $wheels: on a bare GPU machine, run make gpu-wheels first and carry .gpu-wheels" \
    >>"$out/install.log"
fi
if ! "$python" scripts/gpu_wheels.py install-plan "$wheels" >"$plan" 2>>"$out/install.log"; then
  cat "$plan" >>"$out/install.log"
  not_ready "$(grep -m 1 '^gpu_wheels: ' "$out/install.log" || tail -n 1 "$out/install.log")"
fi
cat "$plan" >>"$out/install.log"
mapfile -t to_install < <(awk -F '\t' '$1 == "install" { print $2 "==" $3 }' "$plan")
pip_install() {
  "$python" -m pip install --no-index --find-links "$wheels" --no-deps --disable-pip-version-check -q "$@" \
    >>"$out/install.log" 2>&1
}
if ((${#to_install[@]})); then
  if [ "$install_mode" = env ] && ! "$python" -c 'import os, sys, sysconfig
paths = sysconfig.get_paths()
sys.exit(0 if all(os.access(paths[k], os.W_OK) for k in ("purelib", "platlib", "scripts")) else 1)'; then
    echo "$("$python" -c 'import sys; print(sys.prefix)') is not writable: installing into $work/site" \
      >>"$out/install.log"
    install_mode=target
  fi
  if [ "$install_mode" = env ] && ! pip_install "${to_install[@]}"; then
    grep -qE 'Permission denied|Read-only file system|Errno 13|Errno 30' "$out/install.log" ||
      not_ready "pip could not install ${to_install[*]}; see install.log"
    echo "the environment refused the install: installing into $work/site" >>"$out/install.log"
    install_mode=target
  fi
  if [ "$install_mode" = target ]; then
    pip_install --target "$work/site" "${to_install[@]}" ||
      not_ready "pip could not install ${to_install[*]} into $work/site; see install.log"
    export PYTHONPATH="$work/site${PYTHONPATH:+:$PYTHONPATH}"
  fi
  echo "installed ($install_mode): ${to_install[*]}" >>"$out/install.log"
else
  echo "nothing to install" >>"$out/install.log"
fi

# 3. Everything the smoke's processes import, imported once, within the probe's time.
export PYTHONPATH="$repo${PYTHONPATH:+:$PYTHONPATH}"
echo "--- probe (python -m nvrx_eks.ops.gpu_env probe, install: $install_mode)" >>"$out/env.txt"
timeout --kill-after=5 "$probe_timeout" "$python" -m nvrx_eks.ops.gpu_env probe "$plan" >>"$out/env.txt" 2>&1
case $? in
  0) ;;
  124 | 137) not_ready "the import probe took over ${probe_timeout} s (GPU_SMOKE_PROBE_TIMEOUT_S); see env.txt" ;;
  *)
    reason=$(grep -m 1 '^probe failed: ' "$out/env.txt") || reason="the import probe failed; see env.txt"
    not_ready "${reason#probe failed: }"
    ;;
esac

# 4. The smoke, from the checkout's root (the ranks run `python -m workloads.train` there).
PYTHONUNBUFFERED=1 \
  timeout --kill-after=45 "$(awk -v b="$budget" -v g="$grace" 'BEGIN { print int(b + g) }')" \
  "$python" -m nvrx_eks.ops.gpu_smoke --out "$smoke_out" "${args[@]}" 2>&1 | tee "$work/smoke.log"
exit "${PIPESTATUS[0]}"
