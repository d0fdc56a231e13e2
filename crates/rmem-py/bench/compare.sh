#!/usr/bin/env bash
# The docs/python.md example three ways, one after the other: plain numpy (all in memory),
# rmem (budget LOCAL, servers on this host), and plain numpy under kernel swap at a cgroup v1
# memory limit of LOCAL + 64 MiB (the interpreter and numpy, which rmem's budget does not
# count either) with a swap file on this disk. Needs root for the swap run (else it is
# skipped, and says so). Prints one JSON line per run.
#   compare.sh PYTHON DATAFILE LOCAL     e.g. compare.sh /usr/bin/python3 /tmp/r.f64 512M
set -euo pipefail
py=$1 data=$2 local=$3
here=$(cd "$(dirname "$0")" && pwd)
"$py" "$here/example.py" run "$data" --mode numpy
"$py" "$here/example.py" run "$data" --mode rmem --local "$local"
cg=/sys/fs/cgroup/memory/rmem-py-compare
swap=$(dirname "$data")/rmem-py-compare.swap
if [ "$(id -u)" -ne 0 ] || [ ! -e /sys/fs/cgroup/memory/memory.limit_in_bytes ]; then
  echo "kernel swap run skipped: needs root and a cgroup v1 memory controller" >&2
  exit 0
fi
cleanup() {
  [ -d "$cg" ] && { for p in $(cat "$cg/cgroup.procs"); do kill -9 "$p" 2>/dev/null || true; done; rmdir "$cg" 2>/dev/null || true; }
  swapoff "$swap" 2>/dev/null || true
  rm -f "$swap"
}
trap cleanup EXIT
size=$(stat -c %s "$data")
fallocate -l $((size + (1 << 30))) "$swap"
chmod 600 "$swap"
mkswap -q "$swap"
swapon -p 32767 "$swap"
mkdir -p "$cg"
bytes=$(numfmt --from=iec "$local")
echo $((bytes + (64 << 20))) > "$cg/memory.limit_in_bytes"
echo 60 > "$cg/memory.swappiness" 2>/dev/null || true
sh -c "echo \$\$ > $cg/cgroup.procs; exec \"$py\" \"$here/example.py\" run \"$data\" --mode numpy" |
  sed 's/"mode": "numpy"/"mode": "numpy+swap"/'
echo "{\"swap_limit_bytes\": $(cat "$cg/memory.limit_in_bytes"), \"max_usage_bytes\": $(cat "$cg/memory.max_usage_in_bytes")}"
