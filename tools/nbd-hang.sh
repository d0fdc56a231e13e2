#!/bin/bash
# `rmem nbd` through a hung memory server: fio's random 4 KiB reads and writes (iodepth 16)
# over an export of three servers (`ec:2+1`, the default layout: no spare to take a hung
# server's pieces) with a cache of 64 MiB, one server stopped (SIGSTOP) for STOP seconds from
# 4 s in. Prints fio's I/O per second before, during and after the stop, and the ratio of
# during to before, as one JSON line. docs/benchmarks.md ("rmem nbd through a hung server").
#
# usage: tools/nbd-hang.sh [STOP_SECONDS]   (default 6; under 10, or the server is given up)
# Run from the repository root after `cargo build --release --workspace`.
set -u
STOP=${1:-6}
OUT=$(mktemp -d /tmp/rmem-nbd-hang.XXXXXX)
trap 'kill $NBD 2>/dev/null; rm -rf "$OUT"' EXIT
target/release/rmem nbd --servers 3 --size 2G --cache 64M --socket "$OUT/s.sock" \
  > "$OUT/nbd.log" 2>&1 &
NBD=$!
for _ in $(seq 100); do [ -S "$OUT/s.sock" ] && break; sleep 0.1; done
sleep 0.5
SERVERS=($(pgrep -P $NBD))
[ ${#SERVERS[@]} = 3 ] || { echo "expected 3 servers: ${SERVERS[*]}" >&2; exit 1; }
RUN=$((STOP + 10))
( cd "$OUT" && fio --name=hang --ioengine=nbd --uri="nbd+unix:///?socket=$OUT/s.sock" \
  --rw=randrw --bs=4k --iodepth=16 --size=512M --time_based --runtime=$RUN \
  --write_iops_log=io --log_avg_msec=500 --output=fio.txt ) &
FIO=$!
sleep 4
kill -STOP "${SERVERS[1]}"
sleep "$STOP"
kill -CONT "${SERVERS[1]}"
wait $FIO
kill -INT $NBD
wait $NBD
# fio's log: msec, iops, direction (0 read, 1 write), ... per 500 ms window.
python3 - "$OUT/io_iops.1.log" "$STOP" <<'EOF'
import json, sys
stop = float(sys.argv[2])
w = {}
for line in open(sys.argv[1]):
    f = [x.strip() for x in line.split(",")]
    t = round(int(f[0]) / 500) * 0.5
    w[t] = w.get(t, 0) + int(f[1])
def mean(a, b):
    v = [x for t, x in w.items() if a < t <= b]
    return sum(v) / max(len(v), 1)
# fio's clock starts a moment after the stop's: each span keeps clear of the edges.
before, during, after = mean(1, 4), mean(4.5, 4 + stop), mean(5 + stop, 9 + stop)
print(json.dumps({"stop_s": stop, "iops_before": round(before), "iops_during": round(during),
                  "iops_after": round(after), "during_vs_before": round(during / before, 3)}))
EOF
grep -h "answers again\|lost\|served" "$OUT/nbd.log"
