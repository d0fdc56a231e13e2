#!/bin/bash
# A program's speed through a hung memory server: tools/hang-rate.c (random read-modify-writes
# over 64 MiB) under `rmem run --servers 3 --local 16M` (`ec:2+1`, the default layout: no spare
# server), one server stopped (SIGSTOP) from 4 s in for STOP seconds. With FLAP_MS=S,R it is
# instead stopped S ms and continued R ms in turn for STOP seconds: a server slow but never
# silent for the hedge's 100 ms. Prints the program's operations per second before, during and
# after, and during / before, as one JSON line. docs/benchmarks.md ("rmem nbd through a hung
# server").
#
# usage: [FLAP_MS=80,20] tools/pager-hang.sh [STOP_SECONDS]   (default 6; under 10)
# Run from the repository root after `cargo build --release --workspace`.
set -u
STOP=${1:-6}
OUT=$(mktemp -d /tmp/rmem-pager-hang.XXXXXX)
trap 'rm -rf "$OUT"' EXIT
gcc -O2 tools/hang-rate.c -o "$OUT/rate" || exit 1
target/release/rmem run --servers 3 --local 16M -- "$OUT/rate" $((STOP + 8)) > "$OUT/out" 2> "$OUT/err" &
RUN=$!
until grep -q start "$OUT/out" 2>/dev/null; do sleep 0.1; kill -0 $RUN || exit 1; done
# This run's servers: the children of its `rmem run`.
SERVERS=($(pgrep -f "rmem server --listen" -P $RUN))
[ ${#SERVERS[@]} = 3 ] || SERVERS=($(pgrep -f "rmem server --listen" | sort -n | tail -3))
V=${SERVERS[1]}
sleep 4
if [ -n "${FLAP_MS:-}" ]; then
  S=$(echo "${FLAP_MS%,*} / 1000" | bc -l); R=$(echo "${FLAP_MS#*,} / 1000" | bc -l)
  end=$(( $(date +%s) + STOP ))
  while [ "$(date +%s)" -lt $end ]; do kill -STOP $V; sleep "$S"; kill -CONT $V; sleep "$R"; done
else
  kill -STOP $V; sleep "$STOP"; kill -CONT $V
fi
wait $RUN || { cat "$OUT/err"; exit 1; }
python3 - "$OUT/out" "$STOP" <<'PY'
import json, sys
stop = float(sys.argv[2])
w = [tuple(map(float, l.split())) for l in open(sys.argv[1]) if l[0].isdigit()]
def rate(a, b):
    v = [ops for t, ops in w if a < t <= b]
    return sum(v) / (0.5 * max(len(v), 1))
# The program starts a moment before the stop's clock: each span keeps clear of the edges.
before, during, after = rate(1, 4), rate(4.5, 4 + stop), rate(5 + stop, 7 + stop)
# Every word checked: word i starts at i and each operation adds 1 to one word.
words = (64 << 20) // 8
_, total_sum, _, ops = next(l for l in open(sys.argv[1]) if l.startswith("sum")).split()
right = int(total_sum) == int(ops) + words * (words - 1) // 2
print(json.dumps({"stop_s": stop, "ops_before": round(before), "ops_during": round(during),
                  "ops_after": round(after), "during_vs_before": round(during / before, 3),
                  "data_right": right}))
sys.exit(0 if right else 1)
PY
rc=$?
grep -h "answers again\|lost" "$OUT/err"
exit $rc
