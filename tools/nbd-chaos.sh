#!/bin/bash
# fio's verifying random writes (two jobs, each writing its part of the export at random and
# reading it back checked, LOOPS times) through `rmem nbd --servers N --redundancy LAYOUT`
# with a cache of 64 MiB, while one memory server at a time is stopped (SIGSTOP) for 0.2-3 s
# at random for the whole run, and up to KILLS of them are killed (stopped 0.5 s, then
# SIGKILL; `rmem nbd` starts a killed local server again) at least 8 s apart. Prints fio's
# verdict (verify errors, exit status), what `rmem nbd` said about its servers, and how it
# ended. docs/benchmarks.md ("rmem nbd under chaos").
#
# usage: [EXTRA="--encrypt"] [BLOCK=64K] tools/nbd-chaos.sh SERVERS LAYOUT [LOOPS] [KILLS]
#        e.g. tools/nbd-chaos.sh 3 ec:2+1 3 1
# Run from the repository root after `cargo build --release --workspace`.
set -u
N=$1; L=$2; LOOPS=${3:-3}; K=${4:-0}; EXTRA=${EXTRA:-}; BLOCK=${BLOCK:-}
OUT=$(mktemp -d /tmp/rmem-nbd-chaos.XXXXXX)
target/release/rmem nbd --servers "$N" --redundancy "$L" $EXTRA ${BLOCK:+--block-size "$BLOCK"} \
  --size 1G --cache 64M --socket "$OUT/s.sock" > "$OUT/nbd.log" 2>&1 &
NBD=$!
trap 'kill $NBD 2>/dev/null' EXIT
for _ in $(seq 100); do [ -S "$OUT/s.sock" ] && break; sleep 0.1; done
[ -S "$OUT/s.sock" ] || { cat "$OUT/nbd.log"; exit 1; }
( cd "$OUT" && timeout 900 fio --name=chaos --ioengine=nbd \
  --uri="nbd+unix:///?socket=$OUT/s.sock" --rw=randwrite --bs=4k --iodepth=16 \
  --numjobs=2 --size=192M --offset_increment=192M --loops="$LOOPS" \
  --verify=crc32c --verify_fatal=1 --verify_backlog=4096 --output=fio.txt
  echo "fio rc=$?" > fio.rc ) &
FIO=$!
sleep 1.5
running() { kill -0 $FIO 2>/dev/null; }
servers() { pgrep -P $NBD -f "rmem server --listen"; }
source tools/stop-at-random.sh
stop_at_random "$K"
wait $FIO
cat "$OUT/fio.rc"
grep -E "verify|err=|WRITE:|READ:" "$OUT/fio.txt" | head -6
kill -INT $NBD; wait $NBD; echo "rmem nbd rc=$?"
grep -E "lost|is back|answers again|fatal|error" "$OUT/nbd.log" | cut -c1-160 | head -8
echo "(files in $OUT)"
