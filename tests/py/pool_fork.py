"""multiprocessing.Pool over numpy arrays, fork or spawn start method.

    pool_fork.py MIB METHOD [WORKERS]

Builds two float64 arrays of MIB MiB together (remote under `rmem run`), then a pool of
WORKERS processes computes, per chunk, the sum, a dot product and a sum after a private
change of the chunk (each worker writes its own copy of the array's memory under fork). The
parent checks that its arrays are unchanged. Prints the results (the same whatever the start
method, with or without rmem) and, on stderr, the pool's wall time.
"""
import multiprocessing as mp
import sys
import time

import numpy as np

MIB = int(sys.argv[1]) if len(sys.argv) > 1 else 64
METHOD = sys.argv[2] if len(sys.argv) > 2 else "fork"
WORKERS = int(sys.argv[3]) if len(sys.argv) > 3 else 2
N = (MIB << 20) // 16
CHUNKS = 8


def arrays():
    a = np.arange(N, dtype=np.float64) % 1000.0
    b = np.sqrt(np.arange(N, dtype=np.float64)) % 7.0
    return a, b


# Module level: fork workers inherit them; spawn workers build them again on import.
A, B = arrays()


def work(i):
    k = N // CHUNKS
    sl = slice(i * k, (i + 1) * k)
    s = float(A[sl].sum())
    d = float(A[sl] @ B[sl])
    A[sl] += 1.0  # private to this worker (copy-on-write after fork)
    t = float(A[sl].sum())
    return i, s, d, t


def main():
    t0 = time.time()
    with mp.get_context(METHOD).Pool(WORKERS) as pool:
        results = pool.map(work, range(CHUNKS), chunksize=1)
    took = time.time() - t0
    a, b = arrays()
    unchanged = bool(np.array_equal(A, a) and np.array_equal(B, b))
    for r in results:
        print("chunk %d sum %r dot %r after %r" % r)
    print("parent arrays unchanged:", unchanged)
    print(f"pool {METHOD} {MIB} MiB: {took:.3f} s", file=sys.stderr)
    return 0 if unchanged else 1


if __name__ == "__main__":
    sys.exit(main())
