"""Writes and checks 200 MiB ROUNDS times over (default 6), one byte per 4 KiB, and prints the
longest time between two MiB of progress: how long a program was held, e.g. while a memory
server was stopped (docs/benchmarks.md, "A hung server"). With `read` after ROUNDS, only the
first round writes; the others read and check (no write-backs). Run under rmem run."""
import sys
import time

rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 6
read_only = len(sys.argv) > 2 and sys.argv[2] == "read"
n = 200 << 20
b = bytearray(n)
t0 = time.time()
last = t0
gap = 0.0


def progress(i):
    global last, gap
    if (i & 0xFFFFF) == 0:
        now = time.time()
        gap = max(gap, now - last)
        last = now


for r in range(rounds):
    v = 0 if read_only else r
    if r == 0 or not read_only:
        for i in range(0, n, 4096):
            b[i] = (i // 4096 + v) & 255
            progress(i)
    for i in range(0, n, 4096):
        assert b[i] == (i // 4096 + v) & 255
        progress(i)
print("ok, longest gap %.2f s, total %.1f s" % (gap, time.time() - t0))
