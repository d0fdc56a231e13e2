#!/bin/bash
# Usage: LOCAL=64M RARGS="" docs/managed/postgres.sh (from the repository root; PostgreSQL 15
# from Debian, run as the invoking user, or as nobody when root). A cluster in a scratch
# directory, one session of sorts, aggregates and DISTINCTs over 1.5M rows (work_mem 512MB,
# so each sort is in the backend's memory), its output compared with a run without rmem.
# Every backend is a fork() child of the postmaster: its paging is in the summary's line for
# child processes and in STATS.PID.
set -e
R=$(realpath ${RMEM:-target/release/rmem})
BIN=${PGBIN:-/usr/lib/postgresql/15/bin}
D=$(mktemp -d /tmp/rmem-pg.XXXXXX)
as=()
[ "$(id -u)" = 0 ] && { chown nobody "$D"; as=(runuser -u nobody --); }
cat > "$D/q.sql" <<'SQL'
SET work_mem = '512MB';
SET max_parallel_workers_per_gather = 0;
CREATE TEMP TABLE t AS SELECT i, md5(i::text) AS h, (i::bigint * 7919) % 1000003 AS k FROM generate_series(1, 1500000) i;
SELECT count(*), sum(k) FROM t;
SELECT md5(string_agg(h, ',' ORDER BY h)) FROM t;
SELECT k % 1000 AS g, count(*), md5(string_agg(h, '' ORDER BY h)) FROM t GROUP BY 1 ORDER BY 3 LIMIT 5;
SELECT count(DISTINCT h), count(DISTINCT k) FROM t;
SQL
"${as[@]}" $BIN/initdb -D "$D/data" -A trust -U pg > "$D/initdb.log"
once() { # once NAME [rmem run options]: start the server, run the queries, stop it
    local name=$1; shift
    local pg=($BIN/postgres -D "$D/data" -k "$D" -c listen_addresses='')
    if [ "$name" = plain ]; then
        "${as[@]}" "${pg[@]}" > "$D/$name.log" 2>&1 &
    else
        "${as[@]}" "$R" run "$@" --stats-json "$D/$name.json" -- "${pg[@]}" > "$D/$name.log" 2>&1 &
    fi
    for i in $(seq 100); do [ -S "$D/.s.PGSQL.5432" ] && break; sleep 0.2; done
    local t0=$(date +%s.%N)
    "${as[@]}" $BIN/psql -h "$D" -U pg -d postgres -At -f "$D/q.sql" > "$D/$name.out" 2>&1
    echo "$name: $(echo "$(date +%s.%N) - $t0" | bc) s"
    "${as[@]}" $BIN/pg_ctl -D "$D/data" stop -m fast > /dev/null
    wait
}
once plain
once rmem --local ${LOCAL:-64M} ${RARGS}
grep '^rmem' "$D/rmem.log"
cmp "$D/plain.out" "$D/rmem.out" && echo "output identical"
rm -rf "$D"
