#!/usr/bin/env python3
# A pure-Python program that needs memory (about 380 MiB): a dict of 2M random keys, the keys
# sorted, rows sorted, a SHA-256 of a sample printed (the same every run). For
# tools/program-chaos.sh: LOCAL=48M tools/program-chaos.sh 3 2 python3 tools/dict-sort.py
import hashlib, random
r = random.Random(3)
d = {}
for i in range(2_000_000):
    d[r.getrandbits(48)] = str(i) * 3
keys = sorted(d)
h = hashlib.sha256()
for k in keys[::7]:
    h.update(d[k].encode())
rows = [(d[k], k) for k in keys[::3]]
rows.sort()
for v, k in rows[::1000]:
    h.update(b"%d" % k)
print(len(d), h.hexdigest())
