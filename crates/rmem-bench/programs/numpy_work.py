# numpy as an analysis script uses it, for `rmem bench programs`: a square matrix of half the
# data (power iteration: matrix-vector products on threaded BLAS; a Gram matrix of a column
# block; column norms), then a sort of a vector of the other half. Arg: MiB of data.
# Standard output: results rounded far above BLAS's summation-order noise.
import sys
import numpy as np

mib = int(sys.argv[1])
rng = np.random.default_rng(2026)
n = int(((mib << 20) // 2 // 8) ** 0.5)
m = rng.standard_normal((n, n))
v = np.ones(n) / np.sqrt(n)
for _ in range(6):
    w = m @ v
    v = w / np.linalg.norm(w)
k = min(n, 256)
g = m[:, :k].T @ m[:, :k]
norms = np.linalg.norm(m, axis=0)
print("matrix", n, "x", n)
print("power iteration %.6e %.6e" % (np.abs(v).sum(), v @ (m @ v)))
print("gram trace %.8e" % np.trace(g))
print("column norms %.8e %.8e" % (norms.min(), norms.max()))
del m, g
x = rng.standard_normal((mib << 20) // 2 // 8)
x.sort()
assert np.all(x[1:] >= x[:-1]), "not sorted"
print("sorted", x.size, "%.10e %.10e %.10e" % (x[0], x[x.size // 2], x[-1]))
