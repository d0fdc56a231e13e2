#!/bin/bash
# A long run in a pool that keeps changing under it: does anything grow or break over time?
# The verifying stress (tests/c/stress.c: THREADS threads, random reads checked against a
# shadow and writes, 64 MiB, 16 MiB local, 64 KiB pages) runs under
# `rmem run --manager --api --redundancy LAYOUT` for MINUTES. A manager and 4 memory servers
# make the pool; every EVERY seconds one event, at random:
#   kill   - a server SIGKILLed, and a new one (fresh port, empty) joins the pool;
#   drain  - `rmem pool drain` of a server (it exits empty), and a new one joins;
#   manager- the manager SIGKILLed and started again on its address a second later;
#   stop   - a server stopped (SIGSTOP) for 3 s.
# Every 10 s it samples the program's resident set, descriptors and threads, and the
# manager's. At the end the program is told to stop; it must say "stress: ok" (zero
# mismatches) and exit 0, and from the first sample after a minute to the last the program's
# descriptors must not grow and its resident set not by more than 25%.
#
# With TARGET=nbd the program is `rmem nbd --manager --redundancy LAYOUT` instead (512 MiB,
# a 32 MiB cache, a Unix socket) under fio's verifying random writes (two jobs of 4 KiB
# writes, each block read back checked within 4096 writes of it) for MINUTES; it is sampled
# the same way, fio must end with no verify error and `rmem nbd` must stop cleanly (SIGINT,
# exit 0).
#
# usage: tools/soak.sh [MINUTES [LAYOUT [EVERY]]]   (default 10 replicas:2 30)
# EVENTS="kill drain manager stop" (the default) names the events drawn from; e.g.
# EVENTS=drain isolates one kind. THREADS (default 4) sets the stress's threads.
# TARGET=run (the default) or nbd.
# Run from the repository root after `cargo build --release --workspace`. Prints the samples'
# summary and the event log; files in the directory it names. Exit status 1 on any failure.
set -u
MIN=${1:-10}; L=${2:-replicas:2}; EVERY=${3:-30}; THREADS=${THREADS:-4}; TARGET=${TARGET:-run}
case $TARGET in run|nbd) ;; *) echo "TARGET: run or nbd, not '$TARGET'" >&2; exit 2 ;; esac
read -r -a KINDS <<< "${EVENTS:-kill drain manager stop}"
for k in "${KINDS[@]}"; do
  case $k in kill|drain|manager|stop) ;; *) echo "EVENTS: unknown event '$k'" >&2; exit 2 ;; esac
done
OUT=$(mktemp -d /tmp/rmem-soak.XXXXXX)
export RMEM_TOKEN=soak-token-0123456789abcdef
B=$(pwd)/target/release/rmem
[ -x "$B" ] || { echo "no $B: cargo build --release --workspace first" >&2; exit 2; }
port() { python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])'; }
M=127.0.0.1:$(port)
start_manager() {
  $B manager --listen "$M" --heartbeat-ms 200 >> "$OUT/manager.log" 2>&1 &
  echo $! > "$OUT/manager.pid"
}
SERVERS=()   # "pid addr" of the servers running now
n_started=0
start_server() {
  local a=127.0.0.1:$(port)
  n_started=$((n_started + 1))
  $B server --listen "$a" --capacity 256M --lease 10 --manager "$M" \
    > "$OUT/server$n_started.log" 2>&1 &
  SERVERS+=("$! $a")
}
cleanup() {
  for s in "${SERVERS[@]}"; do kill -CONT "${s%% *}" 2>/dev/null; kill "${s%% *}" 2>/dev/null; done
  kill "$(cat "$OUT/manager.pid")" 2>/dev/null
  [ "$TARGET" = nbd ] && kill "${PROG:-}" 2>/dev/null
}
trap cleanup EXIT
start_manager
sleep 0.5
for _ in 1 2 3 4; do start_server; done
sleep 1
if [ "$TARGET" = run ]; then
gcc -O2 -pthread -I include tests/c/stress.c -o "$OUT/stress" -L target/release -lrmem || exit 2
( LD_LIBRARY_PATH=target/release STRESS_UNTIL="$OUT/stop" \
    timeout $((MIN * 60 + 300)) $B run --manager "$M" --api --redundancy "$L" \
    --page-size 64K --local 16M --stats-json "$OUT/stats.json" \
    -- "$OUT/stress" "$THREADS" 64 1000 > "$OUT/out" 2> "$OUT/err"; echo "rc=$?" >> "$OUT/out" ) &
RUN=$!
sleep 3
PROG=$(pgrep -f "^$OUT/stress" | head -1)
[ -n "$PROG" ] || { echo "the program did not start:"; cat "$OUT/err"; exit 1; }
else
command -v fio > /dev/null || { echo "no fio: scripts/deps.sh installs it" >&2; exit 2; }
$B nbd --manager "$M" --redundancy "$L" --size 512M --cache 32M --socket "$OUT/s.sock" \
  > "$OUT/nbd.out" 2> "$OUT/err" &
PROG=$!
for _ in $(seq 100); do [ -S "$OUT/s.sock" ] && break; sleep 0.1; done
[ -S "$OUT/s.sock" ] || { echo "rmem nbd did not start:"; cat "$OUT/err"; exit 1; }
( cd "$OUT" && timeout $((MIN * 60 + 300)) fio --name=soak --ioengine=nbd \
    --uri="nbd+unix:///?socket=$OUT/s.sock" --rw=randwrite --bs=4k --iodepth=16 \
    --numjobs=2 --size=256M --offset_increment=256M --loops=1000000 --runtime=$((MIN * 60)) \
    --verify=crc32c --verify_fatal=1 --verify_backlog=4096 --output=fio.txt
  echo "rc=$?" > "$OUT/out" ) &
RUN=$!
fi
sample() {
  local t=$1 p=$2 who=$3
  [ -r "/proc/$p/status" ] || return
  echo "$t $who $(awk '/VmRSS/{print $2}' "/proc/$p/status") $(ls "/proc/$p/fd" | wc -l) $(awk '/Threads/{print $2}' "/proc/$p/status")" >> "$OUT/samples"
}
event() {
  local i s pid addr
  i=$((RANDOM % ${#SERVERS[@]})); s=${SERVERS[$i]}; pid=${s%% *}; addr=${s#* }
  case ${KINDS[$((RANDOM % ${#KINDS[@]}))]} in
    kill) { kill -KILL "$pid"; wait "$pid"; } 2>/dev/null
       SERVERS=("${SERVERS[@]:0:$i}" "${SERVERS[@]:$((i + 1))}"); start_server
       echo "$(date +%T) kill $addr; joined ${SERVERS[-1]#* }" ;;
    drain) timeout 120 $B pool drain --manager "$M" "$addr" --wait 100 >> "$OUT/drain.log" 2>&1
       local rc=$? k
       for k in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
       if kill -0 "$pid" 2>/dev/null; then
         echo "$(date +%T) drain $addr: rc=$rc, still serving"
       else
         SERVERS=("${SERVERS[@]:0:$i}" "${SERVERS[@]:$((i + 1))}"); start_server
         echo "$(date +%T) drain $addr: rc=$rc, exited; joined ${SERVERS[-1]#* }"
       fi ;;
    manager) { kill -KILL "$(cat "$OUT/manager.pid")"; wait "$(cat "$OUT/manager.pid")"; } 2>/dev/null
       sleep 1; start_manager
       echo "$(date +%T) manager killed and started again" ;;
    stop) kill -STOP "$pid"; sleep 3; kill -CONT "$pid"; echo "$(date +%T) stop $addr 3 s" ;;
  esac
}
start=$(date +%s); next_event=$((start + EVERY)); next_sample=$start
while [ $(($(date +%s) - start)) -lt $((MIN * 60)) ] && kill -0 $RUN 2>/dev/null; do
  now=$(date +%s)
  if [ "$now" -ge "$next_sample" ]; then
    sample $((now - start)) "$PROG" program; sample $((now - start)) "$(cat "$OUT/manager.pid")" manager
    next_sample=$((now + 10))
  fi
  if [ "$now" -ge "$next_event" ]; then event >> "$OUT/events"; next_event=$(($(date +%s) + EVERY)); fi
  sleep 1
done
sample $(($(date +%s) - start)) "$PROG" program
touch "$OUT/stop"
wait $RUN
fail=0
if [ "$TARGET" = run ]; then
  tail -1 "$OUT/out"; grep -q '^stress: ok' "$OUT/out" && grep -q '^rc=0' "$OUT/out" || fail=1
else
  echo "fio $(cat "$OUT/out")"; grep -E "verify|err=|WRITE:|READ:" "$OUT/fio.txt" | head -4
  grep -q '^rc=0' "$OUT/out" && ! grep -q "verify: bad" "$OUT/fio.txt" || fail=1
  kill -INT "$PROG"; wait "$PROG"; rc=$?
  echo "rmem nbd rc=$rc"; [ $rc = 0 ] || fail=1
fi
cat "$OUT/events" 2>/dev/null
python3 - "$OUT/samples" <<'PY' || fail=1
import sys
rows = [l.split() for l in open(sys.argv[1])]
prog = [(int(t), int(r), int(f), int(th)) for t, who, r, f, th in rows if who == "program"]
man = [(int(t), int(r), int(f)) for t, who, r, f, th in rows if who == "manager"]
base = next((s for s in prog if s[0] >= 60), prog[0])
last = prog[-1]
print(f"program at {base[0]} s: rss {base[1]} kB, {base[2]} fds, {base[3]} threads; "
      f"at {last[0]} s: rss {last[1]} kB, {last[2]} fds, {last[3]} threads; "
      f"rss max {max(s[1] for s in prog)} kB")
if man:
    print(f"manager rss {man[0][1]}..{max(m[1] for m in man)} kB, fds {man[0][2]}..{max(m[2] for m in man)}")
bad = []
if last[2] > base[2]:
    bad.append(f"descriptors grew {base[2]} -> {last[2]}")
if last[1] > base[1] * 1.25:
    bad.append(f"resident set grew {base[1]} -> {last[1]} kB")
for b in bad:
    print("FAIL:", b)
sys.exit(1 if bad else 0)
PY
grep -E "lost|is back|joined|repaired|fatal" "$OUT/err" | cut -c1-160 | tail -6
python3 -c "import json,sys;d=json.load(open(sys.argv[1]));print({k:d.get(k) for k in ('faults','pages_repaired','failovers','servers_lost','pieces_moved','layout')})" "$OUT/stats.json" 2>/dev/null
echo "(files in $OUT)"
[ $fail = 0 ] && echo "soak: ok" || echo "soak: FAILED"
exit $fail
