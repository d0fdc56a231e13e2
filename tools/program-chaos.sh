#!/bin/bash
# Any program, unmodified, under `rmem run --servers SERVERS --local LOCAL` (transparent mode,
# the defaults; `EXTRA` adds options, e.g. "--redundancy replicas:2 --encrypt") while one
# memory server at a time is stopped (SIGSTOP) 0.2-3 s at random and up to KILLS of them are
# killed (tools/stop-at-random.sh); its standard output is compared with a plain run's, byte
# for byte (by SHA-256). Prints rmem run's exit status, whether the output was the same, the
# times, and what rmem said about servers; exits 1 if the output differed or rmem run failed.
# The program must print the same thing on every run (a sort, a compressor to stdout, a
# script that prints checksums). Only its own run's servers are stopped and killed (other rmem
# servers on the machine are left alone), but run no timing meanwhile. docs/benchmarks.md ("Real
# programs under chaos").
#
# usage: [EXTRA=...] [LOCAL=32M] tools/program-chaos.sh SERVERS KILLS PROGRAM [ARGS...]
#   e.g. EXTRA="--redundancy ec:2+1" tools/program-chaos.sh 3 2 sort -S 400M /tmp/big.txt
# Run from the repository root after `cargo build --release --workspace`.
set -u -o pipefail
N=$1; K=$2; shift 2
EXTRA=${EXTRA:-}; LOCAL=${LOCAL:-32M}
OUT=$(mktemp -d /tmp/rmem-program-chaos.XXXXXX)
t0=$(date +%s.%N)
"$@" | sha256sum > "$OUT/plain.sha" || { echo "the plain run failed"; exit 1; }
t1=$(date +%s.%N)
( target/release/rmem run --servers "$N" --local "$LOCAL" $EXTRA -- "$@" 2> "$OUT/err" \
    | sha256sum > "$OUT/rmem.sha"; echo "${PIPESTATUS[0]}" > "$OUT/rc" ) &
RUN=$!
sleep 1
running() { kill -0 $RUN 2>/dev/null; }
servers() { servers_under $RUN; }
source tools/stop-at-random.sh
stop_at_random "$K"
wait $RUN
t2=$(date +%s.%N)
rc=$(cat "$OUT/rc")
echo "rmem run exit status $rc; plain $(echo "$t1 - $t0" | bc) s, under chaos $(echo "$t2 - $t1" | bc) s"
grep -E "lost|is back|answers again|fatal" "$OUT/err" | cut -c1-160 | head -8
echo "(files in $OUT)"
if cmp -s "$OUT/plain.sha" "$OUT/rmem.sha"; then
  echo "output the same as the plain run's"
  [ "$rc" = 0 ]
else
  echo "OUTPUT DIFFERS from the plain run's"
  exit 1
fi
