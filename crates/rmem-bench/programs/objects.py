# Python with many objects, for `rmem bench programs`: records as dicts (strings, floats,
# lists), sorted by a key, grouped and joined as a data-cleaning script does.
# Arg: number of records.
import sys

n = int(sys.argv[1])
rows = [
    {
        "id": i,
        "name": "user%08d" % ((i * 7919) % n),
        "score": ((i * 2654435761) % 1000003) / 7.0,
        "tags": ["t%d" % (i % 13), "g%d" % (i % 101)],
    }
    for i in range(n)
]
rows.sort(key=lambda r: (r["score"], r["id"]))
groups = {}
for r in rows:
    groups.setdefault(r["tags"][1], []).append(r["id"])
by_name = {r["name"]: r for r in rows}
hits = sum(1 for i in range(0, n, 3) if ("user%08d" % i) in by_name)
print("records", len(rows), "groups", len(groups), "hits", hits)
print("first", rows[0]["id"], "last", rows[-1]["id"], "median %.3f" % rows[n // 2]["score"])
print("largest group", max(len(g) for g in groups.values()))
