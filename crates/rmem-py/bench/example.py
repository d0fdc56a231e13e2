"""The docs/python.md notebook as a script, timed: load a large binary file of readings,
compute statistics, downsample for a plot.

    python3 example.py make FILE --size 1G        # write FILE: float64 readings
    python3 example.py run FILE --mode rmem --local 256M [--plot out.png]
    python3 example.py run FILE --mode numpy      # plain numpy (under a cgroup limit: swap)

Prints one JSON line: seconds to load, to compute, in all, and the results (the same in
both modes).
"""

import argparse
import json
import time

import numpy as np

CHUNK = 1 << 24  # items written at a time by `make`


def make(path, nbytes):
    rng = np.random.default_rng(42)
    n = nbytes // 8
    with open(path, "wb") as f:
        for start in range(0, n, CHUNK):
            k = min(CHUNK, n - start)
            t = np.arange(start, start + k) / n
            (20.0 + 5.0 * np.sin(40 * np.pi * t) + rng.standard_normal(k)).tofile(f)


def run(path, mode, local, plot):
    t0 = time.perf_counter()
    if mode == "rmem":
        import rmem

        rmem.connect(local=local)
        readings = rmem.fromfile(path, np.float64)
    else:
        readings = np.fromfile(path, np.float64)
    t1 = time.perf_counter()
    # The notebook's cells: summary statistics, a histogram, a downsampled trend.
    mean = float(readings.mean())
    # readings.std() would make a local temporary as large as the data: sum squares by chunk.
    squares = sum(float(np.dot(c, c)) for c in np.array_split(readings, max(1, readings.size // CHUNK)))
    std = (squares / readings.size - mean * mean) ** 0.5
    lo, hi = float(readings.min()), float(readings.max())
    counts, _ = np.histogram(readings, bins=50, range=(0.0, 40.0))
    above = int(np.count_nonzero(readings > 27.0))
    trend = readings[: readings.size // 65536 * 65536].reshape(-1, 65536).mean(axis=1)
    t2 = time.perf_counter()
    if plot:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(9, 3))
        ax1.plot(trend)
        ax1.set_title("mean of every 65536 readings")
        ax2.bar(np.linspace(0, 40, 50, endpoint=False), counts, width=0.8)
        ax2.set_title("histogram")
        fig.tight_layout()
        fig.savefig(plot)
    out = {
        "mode": mode,
        "load_s": round(t1 - t0, 3),
        "compute_s": round(t2 - t1, 3),
        "total_s": round(t2 - t0, 3),
        "mean": mean,
        "std": std,
        "min": lo,
        "max": hi,
        "above_27": above,
        "hist_sum": int(counts.sum()),
        "trend_sum": float(trend.sum()),
    }
    if mode == "rmem":
        s = rmem.stats()
        out.update(swap_ins=s["swap_ins"], swap_outs=s["swap_outs"], local_bytes=s["local_bytes"])
    print(json.dumps(out))


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("make")
    m.add_argument("file")
    m.add_argument("--size", default="1G")
    r = sub.add_parser("run")
    r.add_argument("file")
    r.add_argument("--mode", choices=["rmem", "numpy"], default="rmem")
    r.add_argument("--local", default="256M")
    r.add_argument("--plot")
    a = p.parse_args()
    if a.cmd == "make":
        units = {"K": 10, "M": 20, "G": 30}
        s = a.size
        make(a.file, int(s[:-1]) << units[s[-1]] if s[-1] in units else int(s))
    else:
        run(a.file, a.mode, a.local, a.plot)


if __name__ == "__main__":
    main()
