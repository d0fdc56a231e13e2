"""numpy reductions over a remote array larger than the local budget, against `rmem bench scan`.

    python3 reduce.py [--size 1G] [--local-percent 25] [--page-size 64K] [--passes 3]
                      [--json out.json] [--no-scan]

Fills an rmem array of SIZE bytes (float64) at a local budget of LOCAL_PERCENT of it, then
times PASSES calls of `a.sum()`: each pass faults the whole array in from the servers
(clean pages, nothing written back). Prints MB/s per pass, plain numpy's rate on a local
array of the same size, and `rmem bench scan`'s sequential rate at the same size, budget and
page size measured in the same run, with the ratio the target is stated in (at least 0.5).
The test suite runs it at a tiny size so it never rots.
"""

import argparse
import json
import os
import subprocess
import tempfile
import time

import numpy as np

import rmem


def size(s):
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    return int(s[:-1]) * units[s[-1].upper()] if s[-1].upper() in units else int(s)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--size", default="1G")
    p.add_argument("--local-percent", type=int, default=25)
    p.add_argument("--page-size", default="64K")
    p.add_argument("--passes", type=int, default=3)
    p.add_argument("--json")
    p.add_argument("--no-scan", action="store_true", help="skip rmem bench scan")
    a = p.parse_args()
    nbytes = size(a.size)
    local = nbytes * a.local_percent // 100
    n = nbytes // 8
    out = {"size_bytes": nbytes, "local_bytes": local, "page_size": a.page_size}

    with rmem.connect(local=local, page_size=a.page_size):
        arr = rmem.empty(n)
        t = time.perf_counter()
        arr[:] = 1.0
        out["fill_mb_s"] = nbytes / (time.perf_counter() - t) / 1e6
        rates = []
        for _ in range(a.passes):
            s0 = rmem.stats()["swap_ins"]
            t = time.perf_counter()
            total = arr.sum()
            secs = time.perf_counter() - t
            assert total == n, total
            rates.append(nbytes / secs / 1e6)
            out.setdefault("swap_ins_per_pass", []).append(rmem.stats()["swap_ins"] - s0)
        out["sum_mb_s"] = rates
        del arr
    plain = np.ones(n)
    t = time.perf_counter()
    plain.sum()
    out["plain_sum_mb_s"] = nbytes / (time.perf_counter() - t) / 1e6
    del plain
    print(f"rmem: fill {out['fill_mb_s']:.0f} MB/s, sum " +
          " ".join(f"{r:.0f}" for r in rates) + " MB/s per pass "
          f"({nbytes >> 20} MiB at {local >> 20} MiB local, {a.page_size} pages); "
          f"plain numpy sum {out['plain_sum_mb_s']:.0f} MB/s")
    if not a.no_scan:
        rmem_bin = os.environ.get("RMEM_BIN", "rmem")
        with tempfile.TemporaryDirectory() as d:
            j = os.path.join(d, "scan.json")
            subprocess.run([rmem_bin, "bench", "scan", "--size", str(nbytes),
                            "--local-percent", str(a.local_percent), "--page-sizes",
                            a.page_size, "--json", j], check=True, timeout=600,
                           stdout=subprocess.DEVNULL)
            scan = json.load(open(j))
        out["scan"] = scan
        scan_mb_s = find_rate(scan)
        out["scan_mb_s"] = scan_mb_s
        out["ratio_sum_to_scan"] = max(rates) / scan_mb_s
        print(f"rmem bench scan (same size, budget, page size): {scan_mb_s:.0f} MB/s; "
              f"best sum / scan = {out['ratio_sum_to_scan']:.2f} (target >= 0.5)")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)


def find_rate(scan):
    """The MB/s of the one page size in `rmem bench scan --json`'s report."""
    (row,) = scan["results"]
    return float(row["mb_per_s"])


if __name__ == "__main__":
    main()
