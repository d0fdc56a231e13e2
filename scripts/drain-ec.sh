#!/bin/bash
# One erasure-coded drain under load, timed (docs/benchmarks.md, "Erasure-coded drains").
# Usage: scripts/drain-ec.sh DIR [BASE_PORT]: DIR holds the rmem and librmem.so to measure
# (target/release for this build); the stress program comes from the test suite
# (target/release/c-tests/stress, built by `cargo test --release -p rmem-cli --test pool`).
# Loopback only: a manager on BASE_PORT (default 7400) and four servers on the next ports.
B=$1; P=${2:-7400}
export RMEM_TOKEN=abtoken
D=$(mktemp -d)
$B/rmem manager --listen 127.0.0.1:$P --heartbeat-ms 200 >$D/m.log 2>&1 &
MP=$!
sleep 0.5
SP=()
for i in 1 2 3 4; do $B/rmem server --listen 127.0.0.1:$((P+i)) --manager 127.0.0.1:$P --capacity 2G >$D/s$i.log 2>&1 & SP+=($!); done
sleep 1.5
STRESS_UNTIL=$D/stop $B/rmem run --manager 127.0.0.1:$P --api --page-size 64K --local 32M --redundancy ec:2+1 --stats-json $D/stats.json -- $(dirname "$0")/../target/release/c-tests/stress 2 512 100000 > $D/run.log 2>&1 &
RUN=$!
u=0
for t in $(seq 300); do
  u=$($B/rmem pool status --manager 127.0.0.1:$P --json 2>/dev/null | python3 -c "import json,sys; st=json.load(sys.stdin); print([s['used_bytes'] for s in st['servers'] if s['addr'].endswith(':$((P+1))')][0])" 2>/dev/null || echo 0)
  [ "$u" -gt 150000000 ] && break; sleep 0.2
done
s=$(date +%s.%N); $B/rmem pool drain 127.0.0.1:$((P+1)) --manager 127.0.0.1:$P > $D/drain.log 2>&1; rc=$?; e=$(date +%s.%N)
echo "drain rc $rc wall: $(python3 -c "print(round($e - $s, 2))") s, victim held $u bytes"
touch $D/stop; wait $RUN; echo "run rc $?"; grep -E "stress:|mismatch" $D/run.log | tail -2
python3 -c "import json; v=json.load(open('$D/stats.json')); print({k: v.get(k) for k in ['pages_repaired','repair_s','pieces_moved','pieces_bad','servers_lost']})"
kill $MP ${SP[@]} 2>/dev/null; sleep 0.3; kill -9 $MP ${SP[@]} 2>/dev/null
wait 2>/dev/null
rm -rf $D
