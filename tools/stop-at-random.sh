# Sourced by tools/chaos-stress.sh, tools/program-chaos.sh, tools/run-chaos.sh,
# tools/nbd-chaos.sh and tools/pool-chaos.sh, which define `running` (true while the chaos goes
# on) and `servers` (the pids of the memory servers to pick from: `servers_under` gives those a
# process started, and no one else's).
#
# servers_under ROOT: the pids of memory servers (`rmem server --listen`) among ROOT's
# descendants (such as the servers `rmem run --servers N` started, and started again).
servers_under() {
  local root=$1 p q
  for p in $(pgrep -f "rmem server --listen"); do
    q=$p
    while [ -n "$q" ] && [ "$q" -gt 1 ]; do
      if [ "$q" = "$root" ]; then echo "$p"; break; fi
      q=$(ps -o ppid= -p "$q" 2>/dev/null | tr -d ' ')
    done
  done
}
#
# stop_at_random KILLS: stop one of the servers, chosen at random, for 0.2-3 s (SIGSTOP, then
# SIGCONT 0.1-0.5 s before the next), and up to KILLS times instead stop one 0.5 s and kill it
# (SIGKILL), at least 8 s apart; each kill is said on stdout.
stop_at_random() {
  local k=$1 kills=0 last now v
  last=$(date +%s)
  while running; do
    v=$(servers | shuf -n1); [ -z "$v" ] && break
    now=$(date +%s)
    if [ "$kills" -lt "$k" ] && [ $((now - last)) -ge 8 ] && [ $((RANDOM % 3)) = 0 ]; then
      kill -STOP "$v"; sleep 0.5; kill -KILL "$v"; kills=$((kills + 1)); last=$now
      echo "killed server pid $v"; sleep 1; continue
    fi
    kill -STOP "$v"; sleep 0.$(shuf -i 2-9 -n1); [ $((RANDOM % 4)) = 0 ] && sleep 2
    kill -CONT "$v"; sleep 0.$(shuf -i 1-5 -n1)
  done
}
