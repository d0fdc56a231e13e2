#!/bin/bash
# The 8-thread verifying stress (tests/c/stress.c) under `rmem run --manager --api` (64 KiB
# pages, 8 MiB local, LAYOUT) in a pool of SERVERS servers, one server at a time stopped
# (SIGSTOP) 0.2-3 s at random for the whole run, and `rmem pool drain` of one of them from
# 5 s in; up to KILLS servers (the drained one among those chosen from) are killed outright
# instead (tools/stop-at-random.sh; nothing starts them again). Prints the stress's verdict,
# the drain's, what the runtime said about servers, and its counters. docs/benchmarks.md ("A
# pool under chaos").
#
# usage: tools/pool-chaos.sh SERVERS LAYOUT OPS [KILLS]   e.g. tools/pool-chaos.sh 5 ec:2+1 200000
# Run from the repository root after `cargo build --release --workspace`.
set -u
N=$1; L=$2; OPS=$3; K=${4:-0}
OUT=$(mktemp -d /tmp/rmem-pool-chaos.XXXXXX)
export RMEM_TOKEN=pool-chaos-token
B=target/release/rmem
port() { python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])'; }
M=127.0.0.1:$(port)
$B manager --listen "$M" --heartbeat-ms 200 > "$OUT/manager.log" 2>&1 &
PIDS=($!)
trap 'kill ${PIDS[*]} 2>/dev/null' EXIT
sleep 0.5
ADDRS=()
for i in $(seq "$N"); do
  a=127.0.0.1:$(port)
  $B server --listen "$a" --capacity 256M --lease 10 --manager "$M" > "$OUT/server$i.log" 2>&1 &
  PIDS+=($!); ADDRS+=("$a")
done
SERVER_PIDS=("${PIDS[@]:1}")
sleep 1
gcc -O2 -pthread -I include tests/c/stress.c -o "$OUT/stress" -L target/release -lrmem || exit 1
( LD_LIBRARY_PATH=target/release timeout 600 $B run --manager "$M" --api --redundancy "$L" \
    --page-size 64K --local 8M --stats-json "$OUT/stats.json" \
    -- "$OUT/stress" 8 32 "$OPS" > "$OUT/out" 2> "$OUT/err"; echo "rc=$?" >> "$OUT/out" ) &
RUN=$!
( sleep 5; timeout 120 $B pool drain --manager "$M" "${ADDRS[0]}" --wait 100 > "$OUT/drain.log" 2>&1
  echo "drain rc=$?" >> "$OUT/drain.log" ) &
DRAIN=$!
sleep 1.5
running() { kill -0 $RUN 2>/dev/null && pgrep -f "$OUT/stress" > /dev/null; }
# Only servers still running (the drained one exits once empty).
servers() { for p in "${SERVER_PIDS[@]}"; do kill -0 "$p" 2>/dev/null && echo "$p"; done; }
source tools/stop-at-random.sh
stop_at_random "$K"
for p in "${SERVER_PIDS[@]}"; do kill -CONT "$p" 2>/dev/null; done
wait $RUN; wait $DRAIN
tail -2 "$OUT/out"
tail -2 "$OUT/drain.log"
grep -E "lost|is back|answers again|drain|left|fatal" "$OUT/err" | cut -c1-160 | head -8
python3 -c "import json,sys;d=json.load(open(sys.argv[1]));print({k:d[k] for k in ('writes_redirected','writes_released','writes_degraded','reads_hedged','pages_repaired','pieces_moved','pieces_pulled','failovers','servers_lost','pieces_bad','layout')})" "$OUT/stats.json"
echo "(files in $OUT)"
