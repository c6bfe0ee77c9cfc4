#!/usr/bin/env bash
# A full node-local disk on one node against none, side by side: three rounds, interleaved so that
# the machine's load drifts over both alike. Prints one line per run; each run's summary
# (goodput, restarts, state_sha256) is OUT/<case>-<round>/summary.json.
# Usage: scripts/bench_local_disk_full.sh OUT
set -euo pipefail
out=${1:?usage: $0 OUT}
cd "$(dirname "$0")/.."
mkdir -p "$out"
for round in 1 2 3; do
  for case in clean full; do
    run=$out/$case-$round
    faults="exception@61:1"
    [ "$case" = full ] && faults="local-disk-full@13:1,exception@61:1"
    start=$(date +%s.%N)
    rc=0
    .venv/bin/nvrx-eks local --nodes 2 --nproc 1 --steps 120 --local-interval 2 \
      --checkpoint-interval 40 --faults "$faults" --run-dir "$run" >"$run.log" 2>&1 || rc=$?
    end=$(date +%s.%N)
    .venv/bin/python - "$case" "$round" "$rc" "$start" "$end" "$run/summary.json" <<'PY'
import json, sys
case, rnd, rc, start, end, path = sys.argv[1:]
s = json.load(open(path))
r = s["restarts"]
print(f"{case} {rnd} rc={rc} wall={float(end) - float(start):.1f}s goodput={s['goodput']:.3f} "
      f"restarts={r['inprocess']}/{r['launcher']} state_sha256={s['state_sha256'][:16]}")
PY
  done
done
