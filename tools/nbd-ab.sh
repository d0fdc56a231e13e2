#!/usr/bin/env bash
# A/B of `rmem nbd` builds, alternated in one sitting: tools/nbd-ab.sh DIR... (each DIR holds
# an `rmem` binary; name them in the order to run, e.g. old new old new).
#
# For each DIR: a standalone `rmem nbd --size 256M --cache 64M --servers 1` on a Unix socket,
# filled once, then fio's nbd engine (one connection, 8 in flight): 2 GiB of 1 MiB sequential
# reads and of writes (MB/s, and CPU seconds per GB of `rmem nbd` and of its memory server,
# from /proc: less noisy than the rates on a shared machine), and 5 s of 4 KiB random reads
# at queue depth 1 (p50 us). Needs fio (scripts/deps.sh installs it).
set -euo pipefail
work=$(mktemp -d)
sock=$work/nbd.sock
uri="nbd+unix:///?socket=$sock"
nbd=""
cleanup() { [ -n "$nbd" ] && kill "$nbd" 2>/dev/null; wait 2>/dev/null; rm -rf "$work"; }
trap cleanup EXIT
cpu() { awk '{print $14+$15}' "/proc/$1/stat"; }
json() { python3 -c 'import json,sys; t=sys.stdin.read(); print(json.loads(t[t.index("{"):])["jobs"][0]'"$1"')'; }
for d in "$@"; do
    rm -f "$sock"
    "$d/rmem" nbd --size 256M --cache 64M --servers 1 --socket "$sock" >"$work/nbd.log" 2>&1 &
    nbd=$!
    for _ in $(seq 100); do [ -S "$sock" ] && break; sleep 0.1; done
    server=$(pgrep -P "$nbd" -f "rmem server")
    fio --name=fill --ioengine=nbd --uri="$uri" --size=256M --rw=write --bs=1M --iodepth=8 >/dev/null
    line="$d"
    for rw in read write; do
        a=$(cpu "$nbd"); b=$(cpu "$server"); t0=$(date +%s.%N)
        fio --name=s --ioengine=nbd --uri="$uri" --size=256M --io_size=2G --rw=$rw --bs=1M \
            --iodepth=8 >/dev/null
        t1=$(date +%s.%N); a2=$(cpu "$nbd"); b2=$(cpu "$server")
        line+=$(printf ' %s %.0f MB/s (nbd %.2f s/GB, server %.2f s/GB);' "$rw" \
            "$(echo "2147.48/($t1-$t0)" | bc -l)" "$(echo "($a2-$a)/100/2.147" | bc -l)" \
            "$(echo "($b2-$b)/100/2.147" | bc -l)")
    done
    p50=$(fio --name=s --ioengine=nbd --uri="$uri" --size=256M --rw=randread --bs=4k --iodepth=1 \
        --time_based --runtime=5 --ramp_time=1 --output-format=json \
        | json '["read"]["clat_ns"]["percentile"]["50.000000"]/1e3')
    echo "$line randread 4K QD1 p50 $p50 us"
    kill "$nbd"; wait "$nbd" 2>/dev/null || true; nbd=""
done
