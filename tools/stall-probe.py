"""Writes and checks 200 MiB six times over, one byte per 4 KiB, and prints the longest time
between two MiB of progress: how long a program was held, e.g. while a memory server was
stopped (docs/benchmarks.md, "A hung server"). Run under rmem run."""
import time, sys, hashlib
n = 200 << 20
b = bytearray(n)
t0 = time.time(); last = t0; gap = 0
for r in range(6):
    for i in range(0, n, 4096):
        b[i] = (i // 4096 + r) & 255
        if (i & 0xfffff) == 0:
            now = time.time(); gap = max(gap, now - last); last = now
    for i in range(0, n, 4096):
        assert b[i] == (i // 4096 + r) & 255
print("ok, longest gap %.2f s, total %.1f s" % (gap, time.time() - t0))
