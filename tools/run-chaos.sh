#!/bin/bash
# An unmodified program's memory (tools/hang-rate.c: random read-modify-writes over 64 MiB of
# malloc'd words, every word checked at the end) under `rmem run --servers SERVERS --local 16M`
# at the defaults (transparent mode, 64 KiB pages; `EXTRA` adds options, e.g. "--redundancy
# replicas:2 --encrypt"), one memory server at a time stopped (SIGSTOP) 0.2-3 s at random for
# SECONDS, and up to KILLS of them killed (stopped 0.5 s, then SIGKILL; `rmem run` starts a
# killed local server again) at least 8 s apart. Prints whether every word was right, rmem
# run's exit status and what it said about servers; exits 1 if a word was wrong.
# docs/benchmarks.md ("The same chaos at the default page size").
#
# usage: [EXTRA=...] tools/run-chaos.sh SERVERS SECONDS [KILLS]   e.g. tools/run-chaos.sh 3 30 1
# Run from the repository root after `cargo build --release --workspace`.
set -u
N=$1; SECS=$2; K=${3:-0}; EXTRA=${EXTRA:-}
OUT=$(mktemp -d /tmp/rmem-run-chaos.XXXXXX)
gcc -O2 tools/hang-rate.c -o "$OUT/rate" || exit 1
( target/release/rmem run --servers "$N" --local 16M $EXTRA -- "$OUT/rate" "$SECS" \
    > "$OUT/out" 2> "$OUT/err"; echo "rc=$?" >> "$OUT/out" ) &
RUN=$!
sleep 2
running() { kill -0 $RUN 2>/dev/null && pgrep -f "$OUT/rate" > /dev/null; }
servers() { servers_under $RUN; }
source tools/stop-at-random.sh
stop_at_random "$K"
wait $RUN
python3 - "$OUT/out" <<'PY'
import sys
words = (64 << 20) // 8
lines = open(sys.argv[1]).read().splitlines()
print(lines[-1])
sums = [l.split() for l in lines if l.startswith("sum")]
right = bool(sums) and int(sums[0][1]) == int(sums[0][3]) + words * (words - 1) // 2
print("every word right:", right)
sys.exit(0 if right else 1)
PY
rc=$?
grep -E "lost|is back|answers again|fatal" "$OUT/err" | cut -c1-160 | head -8
echo "(files in $OUT)"
exit $rc
