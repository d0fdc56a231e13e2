# 300k random reads of a 48 MB array: docs/benchmarks.md, "Sub-page fetches" (unprivileged).
import numpy as np
rng = np.random.default_rng(3)
a = rng.random(6_000_000)
idx = rng.integers(0, a.size, 300_000)
print(round(float(a[idx].sum()), 6))
