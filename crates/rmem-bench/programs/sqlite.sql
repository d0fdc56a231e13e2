-- sqlite3 with a large in-memory database, for `rmem bench programs`: a table of ROWS rows
-- (ROWS is replaced by the benchmark), two indexes, aggregates, an ordered scan, a join.
CREATE TABLE t(id INTEGER PRIMARY KEY, k INTEGER, grp INTEGER, s TEXT);
WITH RECURSIVE c(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM c WHERE i < ROWS)
INSERT INTO t
SELECT i, (i * 2654435761) % 4294967296, i % 997,
       printf('%08x-%08x-%08x-%08x-%08x-%08x', (i * 2654435761) % 4294967296,
              (i * 40503) % 4294967291, (i * 7) % 99991, (i * 31) % 100000007,
              (i * 131) % 4294967291, (i * 2246822519) % 4294967296)
FROM c;
CREATE INDEX t_k ON t(k);
CREATE INDEX t_s ON t(s);
SELECT count(*), sum(k % 1000), max(length(s)) FROM t;
SELECT grp, count(*), sum(k) % 1000003 FROM t GROUP BY grp ORDER BY sum(k) DESC, grp LIMIT 5;
SELECT id, k FROM t ORDER BY k LIMIT 3 OFFSET ROWS / 2;
SELECT id, s FROM t ORDER BY s DESC LIMIT 3;
SELECT count(*), sum(a.k % 7) FROM t AS a JOIN t AS b ON b.id = a.k % ROWS + 1 WHERE b.grp < 100;
