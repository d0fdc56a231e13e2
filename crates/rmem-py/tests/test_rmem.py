"""Tests of `import rmem` against real memory servers (started by rmem itself, `rmem launch`).

Run by scripts/python.sh (from scripts/test.sh) with Debian's /usr/bin/python3 in a venv that
has the wheel installed. The `rmem` binary is RMEM_BIN (target/release/rmem). Every test is
bounded in time (pytest-timeout, and a timeout on every subprocess).

The session uses a local budget of BUDGET bytes, so arrays of 4 * BUDGET page in and out.
"""

import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

import rmem
from conftest import run_py

BUDGET = 16 << 20
BIG = 4 * BUDGET
pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module", autouse=True)
def session():
    with rmem.connect(local=BUDGET, page_size="64K"):
        yield
    assert not rmem.connected()


def test_arrays_are_ndarrays_in_remote_memory():
    a = rmem.zeros((3, 4), np.int32)
    assert type(a) is np.ndarray and a.shape == (3, 4) and a.dtype == np.int32
    assert rmem.is_remote(a) and rmem.is_remote(a[1:, ::2])
    assert not rmem.is_remote(np.zeros(3))
    assert (a == 0).all()
    f = rmem.full((5,), 2.5)
    assert f.dtype == np.float64 and (f == 2.5).all()
    c = rmem.array([[1, 2], [3, 4]], dtype=np.int16)
    assert c.dtype == np.int16 and c.tolist() == [[1, 2], [3, 4]]
    fo = rmem.empty((4, 3), np.float32, order="F")
    assert fo.flags.f_contiguous
    assert rmem.zeros(0).size == 0
    with pytest.raises(TypeError):
        rmem.empty(3, object)


def test_reductions_over_4x_the_budget_equal_numpy():
    n = BIG // 8
    local = (np.arange(n, dtype=np.float64) % 1000.0) * 0.25
    a = rmem.empty(n)
    a[:] = local
    before = rmem.stats()["swap_ins"]
    assert a.sum() == local.sum()
    assert a.max() == local.max() and a.min() == local.min()
    assert a.mean() == local.mean() and a.std() == local.std()
    assert np.array_equal(np.cumsum(a[: n // 4]), np.cumsum(local[: n // 4]))
    # It paged: the array is 4x the budget.
    assert rmem.stats()["swap_ins"] - before >= (BIG - BUDGET) // (64 << 10)


def test_matrix_vector_product_over_4x_the_budget():
    rows, cols = 2048, BIG // 8 // 2048
    rng = np.random.default_rng(1)
    local = rng.standard_normal((rows, cols))
    x = rng.standard_normal(cols)
    a = rmem.array(local)
    assert np.array_equal(a @ x, local @ x)
    y = rmem.empty(rows)
    np.dot(a, x, out=y)
    assert np.array_equal(y, local @ x)


def test_sort_over_4x_the_budget():
    n = BIG // 8
    local = np.random.default_rng(2).integers(0, 1 << 40, n)
    a = rmem.array(local)
    expected = np.sort(local)
    assert np.array_equal(np.sort(a), expected)
    a.sort()
    assert np.array_equal(a, expected)


def test_fromfile_reads_a_file_larger_than_the_budget(tmp_path):
    path = tmp_path / "data.f64"
    local = np.arange(BIG // 8, dtype=np.float64)
    local.tofile(path)
    a = rmem.fromfile(path, np.float64)
    assert rmem.is_remote(a) and np.array_equal(a, local)
    part = rmem.fromfile(path, np.float64, count=1000, offset=8 * 5)
    assert np.array_equal(part, local[5:1005])
    with pytest.raises(ValueError):
        rmem.fromfile(path, np.float64, count=local.size + 1)
    with pytest.raises(OSError):
        rmem.fromfile(tmp_path / "missing", np.float64)


def test_many_arrays_created_and_freed_leak_no_remote_memory():
    base = rmem.stats()
    rng = np.random.default_rng(3)
    for i in range(1500):
        a = rmem.empty(int(rng.integers(1, 1 << 20)), np.uint8)
        a[:: 4096] = i & 0xFF
        if i % 7 == 0:
            view = a[1:]  # a view outlives its array for a while
        del a
    del view
    after = rmem.stats()
    assert after["allocated_bytes"] == base["allocated_bytes"]
    assert after["live_arrays"] == base["live_arrays"]


def test_views_keep_their_memory_alive():
    a = rmem.full(BUDGET // 8, 7.0)
    v = a[10:20]
    del a
    held = rmem.stats()["allocated_bytes"]
    assert (v == 7.0).all()
    del v
    assert rmem.stats()["allocated_bytes"] < held


def test_two_threads():
    results, errors = {}, []

    def work(k):
        try:
            n = 2 * BUDGET // 8
            local = np.arange(n, dtype=np.float64) * (k + 1)
            a = rmem.array(local)
            for _ in range(2):
                results[k] = (a.sum() == local.sum(), np.array_equal(np.sort(a[::-1]), local))
        except Exception as e:  # reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(240)
    assert not errors and results == {0: (True, True), 1: (True, True)}


def test_connect_errors():
    with pytest.raises(rmem.RmemError, match="already connected"):
        rmem.connect()
    r = run_py("""
        import rmem
        try:
            rmem.connect(local="12Q")
        except rmem.RmemError as e:
            print("error:", e)
    """)
    assert "error: local=" in r.stdout, r.stderr


def test_redundancy_and_encryption_from_connect_and_from_the_hosts_file(tmp_path):
    with pytest.raises(ValueError, match="redundancy="):
        rmem.connect(redundancy="ec:0+1")
    r = run_py("""
        import numpy as np, rmem
        rmem.connect(local="4M", page_size="4K", redundancy="replicas:2", encrypt=True)
        local = np.arange(1 << 21, dtype=np.float64)   # 16 MiB, four times the budget
        a = rmem.array(local)
        print("layout", rmem.stats()["layout"], np.array_equal(a, local))
    """)
    assert r.returncode == 0 and "layout replicas:2, encrypted True" in r.stdout, r.stderr
    hosts = tmp_path / "hosts"
    hosts.write_text("me 4M\nredundancy ec:2+1\n" + "127.0.0.1 64M\n" * 3)
    hosts.chmod(0o644)
    r = run_py(f"""
        import numpy as np, rmem
        rmem.connect(hostfile={str(hosts)!r}, page_size="4K")
        local = np.arange(1 << 21, dtype=np.float64)
        a = rmem.array(local)
        print("layout", rmem.stats()["layout"], np.array_equal(a, local))
    """)
    assert r.returncode == 0 and "layout ec:2+1 True" in r.stdout, r.stderr


def test_close_with_live_arrays_keeps_them_working():
    r = run_py("""
        import numpy as np, rmem
        rmem.connect(local="8M")
        a = rmem.full(1 << 21, 3.0)       # 16 MiB, twice the budget
        rmem.close()
        assert not rmem.connected()
        assert a.sum() == 3.0 * (1 << 21)
        del a                             # the runtime and its servers stop here
        b = rmem.zeros(10)                # connects again, with the defaults
        print("ok", rmem.stats()["live_arrays"])
    """)
    assert r.returncode == 0 and "ok 1" in r.stdout, r.stderr


def test_as_nobody():
    if os.geteuid() != 0:
        pytest.skip("not root: this whole run is unprivileged already")
    if shutil.which("runuser") is None:
        pytest.skip("runuser is missing")
    if subprocess.run(["runuser", "-u", "nobody", "--", sys.executable, "-c", "import rmem"],
                      capture_output=True, timeout=60, cwd="/tmp").returncode != 0:
        pytest.skip(f"nobody cannot run {sys.executable} with rmem (a directory only root reads)")
    r = run_py(
        """
        import numpy as np, rmem
        rmem.connect(local="8M")
        n = (32 << 20) // 8
        local = np.arange(n, dtype=np.float64)
        a = rmem.array(local)
        assert a.sum() == local.sum() and np.array_equal(np.sort(a[::-1]), local)
        print("ok", rmem.stats()["userfaultfd"])
        """,
        user="nobody",
    )
    assert r.returncode == 0 and "ok" in r.stdout, r.stdout + r.stderr


FORK_CHILD = """
    import os, numpy as np, rmem
    rmem.connect(local="8M", page_size="64K")
    n = (32 << 20) // 8                   # 4x the local budget
    a = rmem.array(np.arange(n, dtype=np.float64))
    want = float(np.arange(n, dtype=np.float64).sum())
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        ok = a.sum() == want              # the parent's data as at the fork
        a[:] = -1.0                       # the child's own copy
        b = rmem.full(1 << 20, 3.0)       # the child's own arrays work, remote too
        ok = ok and a.sum() == -n and b.sum() == 3.0 * (1 << 20) and rmem.is_remote(b)
        os.write(w, b"child ok" if ok else b"child WRONG")
        os._exit(0)
    a[: n // 2] = 7.0                     # the parent writes meanwhile
    _, status = os.waitpid(pid, 0)
    print(os.read(r, 64).decode(), "status", os.waitstatus_to_exitcode(status))
    print("parent", a.sum() == 7.0 * (n // 2) + float(np.arange(n // 2, n, dtype=np.float64).sum()))
"""


@pytest.mark.parametrize("user", [None, "nobody"])
def test_a_fork_child_reads_remote_arrays_as_at_the_fork(user):
    r = run_py(FORK_CHILD, user=user)
    assert "child ok status 0" in r.stdout, r.stdout + r.stderr
    assert "parent True" in r.stdout, r.stdout + r.stderr


def test_multiprocessing_pool_fork_over_remote_arrays():
    r = run_py("""
        import multiprocessing as mp, numpy as np, rmem
        rmem.connect(local="8M", page_size="64K")
        n = (32 << 20) // 8
        data = rmem.array(np.random.default_rng(5).random(n))
        plain = np.array(data)                # a local copy, for the plain result
        def part(i):
            k = n // 8
            return float(data[i * k:(i + 1) * k].sum())
        with mp.get_context("fork").Pool(2) as pool:
            got = pool.map(part, range(8))
        want = [float(plain[i * (n // 8):(i + 1) * (n // 8)].sum()) for i in range(8)]
        print("pool", got == want)
    """)
    assert "pool True" in r.stdout, r.stdout + r.stderr


def pool_status(manager, env):
    r = subprocess.run(
        [os.environ["RMEM_BIN"], "pool", "status", "--json", "--manager", manager],
        capture_output=True, text=True, timeout=30, env=env,
    )
    return json.loads(r.stdout) if r.returncode == 0 else None


def test_connect_to_a_pool_manager(tmp_path):
    token = tmp_path / "token"
    token.write_text("py-pool-token\n")
    env = dict(os.environ, RMEM_TOKEN_FILE=str(token))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        manager = "127.0.0.1:%d" % s.getsockname()[1]
    bin_ = os.environ["RMEM_BIN"]
    procs = [subprocess.Popen(
        [bin_, "manager", "--listen", manager, "--token-file", str(token), "--heartbeat-ms", "200"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )]
    try:
        for _ in range(2):
            procs.append(subprocess.Popen(
                [bin_, "server", "--token-file", str(token), "--capacity", "256M", "--manager", manager],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            ))
        deadline = time.time() + 30
        while time.time() < deadline:
            st = pool_status(manager, env)
            if st and len(st["servers"]) == 2:
                break
            time.sleep(0.2)
        else:
            pytest.fail("the two servers never joined the pool")
        r = run_py(f"""
            import json, os, subprocess, time, numpy as np, rmem
            rmem.connect(manager="{manager}", local="8M", page_size="64K")
            n = (32 << 20) // 8
            a = rmem.array(np.arange(n, dtype=np.float64))
            print("sum", a.sum() == float(np.arange(n, dtype=np.float64).sum()))
            # The pool's picture follows the servers' beats (200 ms here).
            deadline, used = time.time() + 20, 0
            while time.time() < deadline and used <= 16 << 20:
                st = json.loads(subprocess.run(
                    [os.environ["RMEM_BIN"], "pool", "status", "--json", "--manager", "{manager}"],
                    capture_output=True, text=True, timeout=30).stdout)
                used = sum(s["used_bytes"] for s in st["servers"])
                time.sleep(0.1)
            print("used", used > 16 << 20, used)
            rmem.close()
        """, env={"RMEM_TOKEN_FILE": str(token)})
        assert "sum True" in r.stdout and "used True" in r.stdout, r.stdout + r.stderr
    finally:
        for p in procs:
            p.kill()
            p.wait()


def test_a_lost_server_raises_server_lost_and_a_touch_ends_the_process(tmp_path):
    token = tmp_path / "token"
    token.write_text("py-test-token\n")
    server = subprocess.Popen(
        [os.environ["RMEM_BIN"], "server", "--token-file", str(token), "--capacity", "1G"],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        addr = server.stdout.readline().split()[3]
        r = run_py(
            f"""
            import os, time, numpy as np, rmem
            rmem.connect(servers="{addr}", local="8M")
            a = rmem.full(1 << 22, 2.0)          # 32 MiB: most of it on the server
            assert a.sum() == 2.0 * (1 << 22)
            os.kill({server.pid}, 9)
            deadline = time.time() + 30
            while time.time() < deadline:
                try:
                    rmem.stats()
                except rmem.ServerLost as e:
                    print("raised ServerLost:", e, flush=True)
                    break
                time.sleep(0.05)
            a.sum()                              # inside numpy: ends the process
            print("not reached")
            """,
            env={"RMEM_TOKEN_FILE": str(token), "RMEM_SERVER_TIMEOUT_MS": "2000"},
            timeout=90,
        )
    finally:
        server.kill()
        server.wait()
    assert "raised ServerLost:" in r.stdout, r.stdout + r.stderr
    assert r.returncode == 69 and "not reached" not in r.stdout, r.stdout + r.stderr
    assert "touched after its memory server was lost" in r.stderr


def test_stats():
    s = rmem.stats()
    for key in ("swap_ins", "swap_outs", "faults", "bytes_fetched", "page_size", "local_bytes"):
        assert isinstance(s[key], int), key
    assert s["page_size"] == 64 << 10 and s["local_bytes"] <= BUDGET
    assert s["own_servers"] and s["servers"].count(",") == 1


def test_in_jupyter(tmp_path):
    jupyter = shutil.which("jupyter")
    if jupyter is None or subprocess.run([jupyter, "nbconvert", "--version"],
                                         capture_output=True).returncode != 0:
        pytest.skip("jupyter nbconvert is not installed (apt install jupyter-nbconvert python3-ipykernel)")
    kernels = tmp_path / "share" / "jupyter" / "kernels" / "rmem-test"
    kernels.mkdir(parents=True)
    (kernels / "kernel.json").write_text(json.dumps({
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "rmem test", "language": "python"}))
    cells = [
        "import numpy as np, rmem\nconn = rmem.connect(local='8M')",
        "a = rmem.fromfile(%r, np.float64)\nprint(a.sum() == np.arange(a.size).sum())" % str(tmp_path / "x.f64"),
        "print(rmem.stats()['swap_ins'] > 0)\nconn.close()",
    ]
    np.arange((32 << 20) // 8, dtype=np.float64).tofile(tmp_path / "x.f64")
    nb = {"nbformat": 4, "nbformat_minor": 5, "metadata": {}, "cells": [
        {"cell_type": "code", "id": f"c{i}", "metadata": {}, "execution_count": None,
         "outputs": [], "source": src} for i, src in enumerate(cells)]}
    (tmp_path / "t.ipynb").write_text(json.dumps(nb))
    env = dict(os.environ, JUPYTER_PATH=str(tmp_path / "share" / "jupyter"))
    r = subprocess.run([jupyter, "nbconvert", "--to", "notebook", "--execute",
                        "--ExecutePreprocessor.kernel_name=rmem-test",
                        "--ExecutePreprocessor.timeout=120", "--output", "out.ipynb",
                        str(tmp_path / "t.ipynb")],
                       capture_output=True, text=True, timeout=180, env=env)
    assert r.returncode == 0, r.stderr
    out = json.loads((tmp_path / "out.ipynb").read_text())
    texts = ["".join(o.get("text", "")) for c in out["cells"] for o in c["outputs"]]
    assert texts == ["True\n", "True\n"], texts


def test_benchmarks_run_at_a_tiny_size(tmp_path):
    bench = os.path.join(os.path.dirname(__file__), "..", "bench")
    out = tmp_path / "reduce.json"
    r = subprocess.run([sys.executable, os.path.join(bench, "reduce.py"), "--size", "16M",
                        "--passes", "1", "--json", str(out)],
                       capture_output=True, text=True, timeout=120, cwd="/tmp")
    assert r.returncode == 0, r.stderr
    j = json.loads(out.read_text())
    assert j["sum_mb_s"][0] > 0 and j["scan_mb_s"] > 0 and j["swap_ins_per_pass"][0] > 0
    data = tmp_path / "readings.f64"
    ex = os.path.join(bench, "example.py")
    subprocess.run([sys.executable, ex, "make", str(data), "--size", "16M"], check=True, timeout=60)
    runs = [json.loads(subprocess.run([sys.executable, ex, "run", str(data), "--mode", mode,
                                       "--local", "4M"], capture_output=True, text=True,
                                      timeout=120, check=True, cwd="/tmp").stdout)
            for mode in ("rmem", "numpy")]
    keys = ("mean", "std", "min", "max", "above_27", "hist_sum", "trend_sum")
    assert [runs[0][k] for k in keys] == [runs[1][k] for k in keys]
    assert runs[0]["swap_ins"] > 0


def test_under_rmem_run_it_uses_rmem_runs_servers_and_budget():
    r = subprocess.run(
        [os.environ["RMEM_BIN"], "run", "--api", "--local", "8M", "--", sys.executable, "-c",
         "import rmem; a = rmem.full(1 << 21, 1.0); t = a.sum(); s = rmem.stats();"
         "print(t, s['own_servers'], s['local_bytes'], s['swap_ins'] > 0)"],
        capture_output=True, text=True, timeout=120, cwd="/tmp")
    assert r.returncode == 0 and "2097152.0 False 8388608 True" in r.stdout, r.stdout + r.stderr


def test_a_hosts_file_starts_its_servers(tmp_path):
    hosts = tmp_path / "hosts"
    hosts.write_text("localhost 8M\nlocalhost 256M\nlocalhost 256M\n")
    r = run_py(f"""
        import rmem
        with rmem.connect(hostfile={str(hosts)!r}):
            a = rmem.full(1 << 21, 1.0)
            t = a.sum()
            s = rmem.stats()
            print(t, s["own_servers"], s["local_bytes"], s["servers"].count(","))
    """)
    assert r.returncode == 0 and "2097152.0 True 8388608 1" in r.stdout, r.stdout + r.stderr
