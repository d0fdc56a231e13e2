# numpy with its arrays in remote memory: np.fromfile into a fresh array (read/fread into
# remote buffers), a matrix-vector product on threaded BLAS. Args: MiB, scratch file.
import os, sys, numpy as np
mib, path = int(sys.argv[1]), sys.argv[2]
n = (mib << 20) // 8
rng = np.random.default_rng(7)
a = rng.random(n)                       # mib MiB
a.tofile(path)
b = np.fromfile(path, dtype=np.float64) # a fresh array, read by fread
assert np.array_equal(a, b), "fromfile differs"
cols = 1024
m = b.reshape(-1, cols)                 # matrix over the same data
v = rng.random(cols)
y = m @ v                               # matrix-vector product (BLAS, threaded)
print("numpy ok", n, "%.10e" % a.sum(), "%.10e" % y.sum(), "%.10e" % y[len(y) // 2])
