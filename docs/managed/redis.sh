#!/bin/bash
# Usage: RARGS="--anon-mmap --min-alloc 0" LOCAL=100M docs/managed/redis.sh (from the repository root)
# redis under rmem: populate, read back, check
R=${RMEM:-target/release/rmem}
port=$((7000 + RANDOM % 1000))
$R run --local ${LOCAL:-64M} ${RARGS} -- redis-server --port $port --save '' --appendonly no --enable-debug-command yes > redis.out 2>&1 &
pid=$!
for i in $(seq 50); do redis-cli -p $port ping >/dev/null 2>&1 && break; sleep 0.2; done
redis-cli -p $port DEBUG POPULATE ${KEYS:-300000} key 512 >/dev/null
redis-cli -p $port info memory | grep used_memory_human
redis-cli -p $port DEBUG DIGEST
python3 - $port <<'PY'
import subprocess,sys,random
port=sys.argv[1]
bad=0
for i in random.sample(range(300000),200):
    v=subprocess.run(["redis-cli","-p",port,"get",f"key:{i}"],capture_output=True,text=True).stdout.strip()
    if not v.startswith(f"value:{i}"): bad+=1
print("bad",bad)
PY
redis-cli -p $port shutdown nosave
wait $pid; echo rc=$?
tail -5 redis.out
