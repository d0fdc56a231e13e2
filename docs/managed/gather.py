# A numpy session that ends in random access: fill a 3000x3000 array (72 MB), multiply it by
# a slice of itself, sort a copy, then gather 2M elements at random indices. Each phase's
# seconds are printed. docs/benchmarks.md, "Sub-page fetches".
import time
import numpy as np

rng = np.random.default_rng(7)
t = time.time()
a = rng.random((3000, 3000))
print("gen", round(time.time() - t, 2), flush=True)
t = time.time()
b = a @ a[:, :500]
print("matmul", round(time.time() - t, 2), flush=True)
t = time.time()
s = np.sort(a.ravel())
print("sort", round(time.time() - t, 2), flush=True)
t = time.time()
idx = rng.integers(0, a.size, 2_000_000)
g = a.ravel()[idx].sum()
print("gather", round(time.time() - t, 2), round(float(g), 6), flush=True)
