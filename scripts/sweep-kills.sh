#!/bin/bash
# A robustness sweep with programs nobody here wrote: RUNS runs, each a third-party program
# (GNU sort, CPython, xz, sqlite3, and ImageMagick's blur where /usr/bin/convert is) paged by `rmem run` over a redundant layout (ec:2+1 or
# replicas:2, encrypted or not, 4 KiB or 64 KiB pages) while one of its memory servers is
# SIGKILLed, stopped for 3 s (SIGSTOP, SIGCONT), or killed and started again empty on its
# port, at a random moment. Each output is compared with the plain run's; a run that goes on
# past LIMIT seconds has the stacks of its processes saved (gdb) and counts as a failure.
#
#   scripts/sweep-kills.sh [RUNS [SEED]]     (RMEM=path/to/rmem, LIMIT=seconds, DIR=scratch)
#
# POOL=1: a pool instead (a manager and four servers, the program through --manager, layouts
# none, ec:2+1, replicas:2), and at the random moment one of: `rmem pool drain` of a server; a
# drain and, meanwhile, another server SIGKILLed (redundant layouts); the manager SIGKILLed and
# started again a second later; a fifth server joining, then a drain.
#
# Takes minutes (a run is 1 to 40 s on 2 cores); not part of the test suite, whose
# `redundancy::real_programs_give_the_plain_output_when_a_server_is_killed_or_restarted_empty`
# is the bounded version. Exit status 1 if any run failed.
set -u
RUNS=${1:-20}
RANDOM=${2:-$$}
RMEM=${RMEM:-$(cd "$(dirname "$0")/.." && pwd)/target/release/rmem}
LIMIT=${LIMIT:-200}
D=${DIR:-$(mktemp -d /tmp/rmem-sweep.XXXXXX)}
export RMEM_TOKEN=sweep-kills-token-0123456789
mkdir -p "$D"
[ -x "$RMEM" ] || { echo "no rmem at $RMEM (build it: cargo build --release)" >&2; exit 2; }
for tool in sort python3 xz sqlite3 gdb; do
  command -v $tool >/dev/null || { echo "needs $tool" >&2; exit 2; }
done
echo "sweep: $RUNS runs, scratch $D, rmem $RMEM"

# Inputs, made once: 1.5M random text lines (57 MB) and a 30 MB head of them.
if [ ! -f "$D/in.txt" ]; then
  python3 -c "
import random
r = random.Random(7)
with open('$D/in.txt', 'w') as f:
    for i in range(1_500_000):
        f.write('%016x %s\n' % (r.getrandbits(64), 'x' * r.randint(0, 40)))"
  head -c 30000000 "$D/in.txt" > "$D/xzin"
  cat > "$D/heap.py" <<'PY'
import hashlib, random
r = random.Random(11)
a = [r.getrandbits(48) for _ in range(3_000_000)]
d = {x: i for i, x in enumerate(a[:1_000_000])}
a.sort()
h = hashlib.sha256()
for x in a[::97]:
    h.update(x.to_bytes(8, 'little'))
print(h.hexdigest(), len(d), sum(a) % 1000003)
PY
fi
progs=(sort py xz sqlite)
# The blur reads its image by columns: faults by the piece along a stream (ARCHITECTURE.md,
# "Sub-page fetches").
[ -x /usr/bin/convert ] && progs+=(im)
command_of() {
  case $1 in
    sort) echo "sort -S 300M $D/in.txt | sha256sum" ;;
    py) echo "python3 $D/heap.py" ;;
    xz) echo "xz -T1 -3 -c $D/xzin | sha256sum" ;;
    im) echo "/usr/bin/convert -size 2000x2000 gradient:red-blue -blur 0x4 -resize 70% ppm:- | sha256sum" ;;
    sqlite) echo "sqlite3 :memory: \"pragma cache_size=-200000; create table t(a,b); with recursive c(x) as (select 1 union all select x+1 from c where x<400000) insert into t select x*7919%400009, hex(x) from c; create index i on t(a); select sum(a), count(*), max(b) from t where a%3=1;\"" ;;
  esac
}
for p in "${progs[@]}"; do
  [ -f "$D/ref.$p" ] || bash -c "$(command_of $p)" > "$D/ref.$p"
done

fails=0
for i in $(seq 1 "$RUNS"); do
  p=${progs[$((RANDOM % ${#progs[@]}))]}
  if [ "${POOL:-0}" = 1 ]; then
    case $((RANDOM % 3)) in 0) lay=none ;; 1) lay=ec:2+1 ;; 2) lay=replicas:2 ;; esac
    [ $((RANDOM % 2)) = 0 ] && enc= || enc=--encrypt
    n=4
  else
    case $((RANDOM % 4)) in
      0) lay=ec:2+1; n=3; enc= ;;
      1) lay=ec:2+1; n=3; enc=--encrypt ;;
      2) lay=replicas:2; n=2; enc= ;;
      3) lay=replicas:2; n=3; enc=--encrypt ;;
    esac
  fi
  [ $((RANDOM % 2)) = 0 ] && pgs=4K || pgs=64K
  # Without a pool: 0, 1: SIGKILL; 2: stopped 3 s; 3: killed, started again empty.
  # In a pool: 0: drain; 1: drain and kill another; 2: manager killed, restarted; 3: join, drain.
  mode=$((RANDOM % 4))
  [ "${POOL:-0}" = 1 ] && [ $lay = none ] && [ $mode = 1 ] && mode=0
  base=$((42000 + (i % 50) * 10))
  pids=(); ports=(); hosts=$D/hosts.$i
  printf "me 48M\nredundancy $lay\n" > "$hosts"
  if [ "${POOL:-0}" = 1 ]; then
    "$RMEM" manager --listen 127.0.0.1:$base --heartbeat-ms 300 > "$D/manager.log" 2>&1 &
    manager=$!; disown $!
    sleep 0.3
    join=(--manager 127.0.0.1:$base)
    where=(--manager 127.0.0.1:$base --redundancy $lay --local 48M)
  else
    join=(); where=(--launcher none --hostfile "$hosts")
  fi
  for s in $(seq 1 $n); do
    port=$((base + s))
    "$RMEM" server --listen 127.0.0.1:$port --capacity 2G "${join[@]}" > "$D/srv.$s.log" 2>&1 &
    pids+=($!); ports+=($port); echo "127.0.0.1:$port 1G" >> "$hosts"
    disown $! # no "Killed" notice from bash when the sweep kills it
  done
  # Each server says where it listens once it does (a port still held by an earlier run's
  # server would otherwise fail the run at connect time: the harness's fault, not rmem's).
  for s in $(seq 1 $n); do
    for _ in $(seq 1 100); do grep -q "listening on" "$D/srv.$s.log" && break; sleep 0.1; done
  done
  [ "${POOL:-0}" = 1 ] && sleep 0.7 # the servers' first beats reach the manager
  delay=$(python3 -c "import random; print(round(random.uniform(0.2, 5.0), 2))")
  victim=$((RANDOM % n))
  other=$(( (victim + 1 + RANDOM % (n - 1)) % n ))
  drain() {
    "$RMEM" pool drain 127.0.0.1:${ports[$1]} --manager 127.0.0.1:$base --wait 120 \
      > "$D/drain.log" 2>&1
  }
  ( sleep "$delay"
    case "${POOL:-0}$mode" in
      02) kill -STOP ${pids[$victim]}; sleep 3; kill -CONT ${pids[$victim]} ;;
      03) kill -9 ${pids[$victim]}; sleep 1
          "$RMEM" server --listen 127.0.0.1:${ports[$victim]} --capacity 2G > "$D/srv.again.log" 2>&1 &
          echo $! > "$D/again.pid"; wait 2>/dev/null ;;
      0*) kill -9 ${pids[$victim]} ;;
      10) drain $victim ;;
      11) drain $victim & sleep 0.2; kill -9 ${pids[$other]}; wait 2>/dev/null ;;
      12) kill -9 $manager; sleep 1
          "$RMEM" manager --listen 127.0.0.1:$base --heartbeat-ms 300 > "$D/manager.again.log" 2>&1 &
          echo $! > "$D/again.pid"; wait 2>/dev/null ;;
      13) "$RMEM" server --listen 127.0.0.1:$((base + 9)) --capacity 2G "${join[@]}" > "$D/srv.9.log" 2>&1 &
          echo $! > "$D/again.pid"; sleep 0.7; drain $victim; wait 2>/dev/null ;;
    esac ) &
  killer=$!
  t0=$(date +%s.%N)
  "$RMEM" run "${where[@]}" --page-size $pgs $enc --children -- \
    bash -c "$(command_of $p)" > "$D/out.$i" 2> "$D/err.$i" &
  run=$!
  for _ in $(seq 1 "$LIMIT"); do kill -0 $run 2>/dev/null || break; sleep 1; done
  if kill -0 $run 2>/dev/null; then
    tree="$run $(pgrep -P $run) $(for c in $(pgrep -P $run); do pgrep -P $c; done)"
    for t in $tree; do
      echo "=== pid $t: $(tr '\0' ' ' < /proc/$t/cmdline)"
      timeout 60 gdb -batch -p $t -ex "thread apply all bt 12" 2>/dev/null | grep -E "^Thread|^#"
    done > "$D/hang.$i"
    kill -9 $tree 2>/dev/null
    echo "run $i went on past $LIMIT s: stacks in $D/hang.$i"
  fi
  wait $run 2>/dev/null; rc=$?
  t1=$(date +%s.%N)
  kill $killer 2>/dev/null; sleep 0.2
  [ -f "$D/again.pid" ] && kill -9 "$(cat "$D/again.pid")" 2>/dev/null; rm -f "$D/again.pid"
  wait $killer 2>/dev/null
  for pid in "${pids[@]}"; do kill -9 $pid 2>/dev/null; done
  [ "${POOL:-0}" = 1 ] && { kill -9 $manager 2>/dev/null; pkill -9 -f "pool drain 127.0.0.1:" ; }
  wait 2>/dev/null
  secs=$(python3 -c "print(round($t1 - $t0, 1))")
  what="$p $lay $enc pages $pgs mode ${POOL:-0}$mode (server $victim at ${delay} s), $secs s"
  if [ $rc != 0 ] || ! cmp -s "$D/out.$i" "$D/ref.$p"; then
    fails=$((fails + 1))
    echo "FAIL run $i: $what, exit $rc; its stderr: $D/err.$i"
    tail -3 "$D/err.$i"
  else
    echo "ok run $i: $what"
    rm -f "$D/out.$i" "$D/err.$i" "$hosts"
  fi
done
echo "sweep: $fails of $RUNS runs failed"
[ $fails = 0 ]
