#!/bin/bash
# The 8-thread verifying stress (tests/c/stress.c) under `rmem run --api`, with one memory
# server at a time stopped (SIGSTOP) for 0.2-3 s at random for the whole run, and up to KILLS
# of them killed (stopped 0.5 s, then SIGKILL; `rmem run` starts a killed local server again)
# at least 8 s apart. Prints the stress's verdict (mismatches), what the runtime said about
# servers, and its counters. docs/benchmarks.md ("Write-backs stored a piece short").
#
# usage: [PAGE=64K] [EXTRA="--encrypt"] tools/chaos-stress.sh SERVERS LAYOUT OPS [KILLS]
#        e.g. tools/chaos-stress.sh 6 ec:4+1 250000 2 (PAGE: --page-size, 4K unless given)
# Run from the repository root after `cargo build --release --workspace`.
set -u
N=$1; L=$2; OPS=$3; K=${4:-0}; PAGE=${PAGE:-4K}; EXTRA=${EXTRA:-}
OUT=$(mktemp -d /tmp/rmem-chaos.XXXXXX)
gcc -O2 -pthread -I include tests/c/stress.c -o "$OUT/stress" -L target/release -lrmem || exit 1
( LD_LIBRARY_PATH=target/release timeout 600 target/release/rmem run --api --servers "$N" \
    --redundancy "$L" --page-size "$PAGE" $EXTRA --local 8M --stats-json "$OUT/stats.json" \
    -- "$OUT/stress" 8 32 "$OPS" > "$OUT/out" 2> "$OUT/err"; echo "rc=$?" >> "$OUT/out" ) &
RUN=$!
sleep 1.5
running() { kill -0 $RUN 2>/dev/null && pgrep -f "$OUT/stress" > /dev/null; }
# This run's servers: children of its `rmem run` helper, listening.
servers() { servers_under $RUN; }
source tools/stop-at-random.sh
stop_at_random "$K"
wait $RUN
tail -2 "$OUT/out"
grep -E "lost|is back|answers again" "$OUT/err" | cut -c1-160 | head -8
python3 -c "import json,sys;d=json.load(open(sys.argv[1]));print({k:d[k] for k in ('writes_redirected','writes_released','writes_degraded','reads_hedged','pages_repaired','failovers','servers_lost','pieces_bad','layout')})" "$OUT/stats.json"
echo "(files in $OUT)"
