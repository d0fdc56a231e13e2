"""Tests of `rmem.Region` (direct byte-range regions, docs/regions.md) against real memory
servers started by the session (`rmem launch`). Run by scripts/python.sh like test_rmem.py;
every test and every subprocess is bounded in time.
"""

import errno
import os
import shutil
import subprocess
import sys
import threading

import numpy as np
import pytest

import rmem
from conftest import run_py

PAGE = 64 << 10
pytestmark = pytest.mark.timeout(180)


@pytest.fixture(scope="module", autouse=True)
def session():
    with rmem.connect(local="16M", page_size=PAGE):
        yield


def test_random_unaligned_writes_and_reads_match_a_reference():
    size = 3 * PAGE * 5 + 12345
    ref = bytearray(size)
    rng = np.random.default_rng(11)
    with rmem.Region(size) as r:
        assert r.size == size and len(r) == size and r.page_size == PAGE
        assert r.read(0, size) == bytes(size), "never written: zeros"
        for i in range(400):
            off = int(rng.integers(0, size))
            n = int(rng.integers(0, min(size - off, 3 * PAGE) + 1))
            if i % 2 == 0:
                data = rng.integers(0, 256, n, dtype=np.uint8).tobytes()
                assert r.write(off, data) == n
                ref[off:off + n] = data
            else:
                assert r.read(off, n) == bytes(ref[off:off + n]), (off, n)
        assert r.read(0, size) == bytes(ref)
        # Other buffer types to write from: bytearray, memoryview slice, a strided view.
        r.write(7, bytearray(b"abc"))
        r.write(PAGE - 2, memoryview(b"..xyz..")[2:5])
        arr = np.arange(20, dtype=np.uint8)
        r.write(3 * PAGE + 1, arr[::2])  # not contiguous: copied, in C order
        ref[7:10] = b"abc"
        ref[PAGE - 2:PAGE + 1] = b"xyz"
        ref[3 * PAGE + 1:3 * PAGE + 11] = arr[::2].tobytes()
        assert r.read(0, size) == bytes(ref)


def test_readinto_a_numpy_array_and_other_buffers():
    n = 100_000
    values = np.arange(n, dtype=np.float64) * 0.5
    with rmem.Region(values.nbytes + 3) as r:
        assert r.write(3, values) == values.nbytes  # from a numpy array, unaligned offset
        out = np.empty(n, dtype=np.float64)
        assert r.readinto(3, out) == values.nbytes
        assert np.array_equal(out, values)
        grid = np.zeros((10, 100), dtype=np.float64)  # 2-D, any dtype: its bytes
        r.readinto(3 + 8 * 500, grid)
        assert np.array_equal(grid.ravel(), values[500:1500])
        ba = bytearray(5)
        r.readinto(3 + 8, ba)
        assert bytes(ba) == values[1:2].tobytes()[:5]
        big = bytearray(16)
        r.readinto(3, memoryview(big)[4:12])  # into part of a buffer
        assert bytes(big[4:12]) == values[:1].tobytes() and big[:4] == bytes(4)
        assert r.readinto(0, bytearray()) == 0
        with pytest.raises(TypeError):
            r.readinto(0, b"read-only")
        with pytest.raises(BufferError):
            r.readinto(0, np.zeros((4, 4))[:, ::2])
        with pytest.raises(TypeError):
            r.write(0, 12345)


def test_a_100_byte_read_moves_about_100_bytes():
    with rmem.Region(4 * PAGE) as r:
        r.write(0, bytes(range(256)) * (4 * PAGE // 256))
        before = r.stats()
        assert r.read(1000, 100) == (bytes(range(256)) * 5)[1000 % 256:1000 % 256 + 100]
        after = r.stats()
        assert after["bytes_fetched"] - before["bytes_fetched"] == 100
        assert after["requests"] - before["requests"] == 1
        assert after["reads"] - before["reads"] == 1
        assert after["bytes_read"] - before["bytes_read"] == 100
        r.read(PAGE - 50, 100)  # across a page boundary: two requests, still 100 bytes
        crossed = r.stats()
        assert crossed["bytes_fetched"] - after["bytes_fetched"] == 100
        assert crossed["requests"] - after["requests"] == 2
        assert crossed["size"] == 4 * PAGE and crossed["page_size"] == PAGE
        assert crossed["bytes_sent"] == 4 * PAGE and crossed["writes"] == 1


def test_bad_ranges_and_names_raise():
    with rmem.Region(1000) as r:
        for call in (
            lambda: r.read(999, 2),
            lambda: r.read(1001, 0),
            lambda: r.read(-1, 1),
            lambda: r.read(0, -1),
            lambda: r.read(1 << 64, 1),
            lambda: r.write(990, b"x" * 11),
            lambda: r.write(-5, b"x"),
            lambda: r.readinto(995, bytearray(6)),
        ):
            with pytest.raises(ValueError):
                call()
        assert r.stats()["requests"] == 0, "nothing moved for a refused range"
        assert r.read(1000, 0) == b"" and r.write(1000, b"") == 0
    assert r.closed
    with pytest.raises(ValueError, match="closed"):
        r.read(0, 1)
    r.close()  # again: nothing
    with pytest.raises(ValueError):
        rmem.Region(0)
    for bad in ("", ".hidden", "a/b", "x" * 65):
        with pytest.raises(ValueError):
            rmem.Region(10, name=bad)
    with pytest.raises(FileNotFoundError) as e:
        rmem.Region.open(f"no-such-region-{os.getpid()}")
    assert e.value.errno == errno.ENOENT


def test_threads_share_a_region():
    size = 8 * PAGE
    with rmem.Region(size) as r:
        errors = []

        def worker(k):
            try:
                # Each thread owns every 4th stripe of 1000 bytes.
                for off in range(k * 1000, size - 1000, 4000):
                    data = bytes([k + 1]) * 1000
                    r.write(off, data)
                    assert r.read(off, 1000) == data
            except Exception as e:  # reported in the main thread
                errors.append(e)

        ts = [threading.Thread(target=worker, args=(k,)) for k in range(4)]
        for t in ts:
            t.start()
        for t in ts:
            t.join(timeout=120)
        assert not errors and not any(t.is_alive() for t in ts)
        whole = r.read(0, size)
        for off in range(0, size - 1000, 1000):
            assert whole[off:off + 1000] == bytes([off // 1000 % 4 + 1]) * 1000


OPENER = """
import sys, rmem
r = rmem.Region.open(sys.argv[1])
got = r.read(0, r.size)
r.write(5, b"from the opener")
print("opened", r.size, got == sys.stdin.buffer.read())
r.close()
"""

# The creator: writes, lets a second process (OPENER, argv[1]) open and check it, reads what
# that one wrote; then the name is gone once closed; under a sealed layout an unnamed region
# keeps its bytes and a named one is served by its creator to another process.
HANDOFF = """
    import os, subprocess, sys, numpy as np, rmem
    rmem.connect(local="8M")
    name = f"handoff-{os.getpid()}"
    data = np.random.default_rng(5).integers(0, 256, (3 << 20) + 12345, dtype=np.uint8).tobytes()
    opener = sys.argv[1]
    r = rmem.Region(len(data), name=name)
    r.write(0, data)
    try:
        rmem.Region(10, name=name)
    except FileExistsError:
        print("name taken")
    child = subprocess.run([sys.executable, "-c", opener, name], input=data,
                           capture_output=True, timeout=60)
    print(child.stdout.decode().strip(), child.stderr.decode().strip())
    print("written back", r.read(5, 15) == b"from the opener")
    r.close()
    try:
        rmem.Region.open(name)
    except FileNotFoundError:
        print("gone after close")
    rmem.close()
    rmem.connect(local="8M", encrypt=True)
    with rmem.Region(200000) as sealed:
        sealed.write(70000, data[:100000])
        print("sealed unnamed", sealed.read(70000, 100000) == data[:100000]
              and sealed.read(0, 70000) == bytes(70000))
    r = rmem.Region(len(data), name=name)
    r.write(0, data)
    child = subprocess.run([sys.executable, "-c", opener, name], input=data,
                           capture_output=True, timeout=60)
    print("sealed", child.stdout.decode().strip(), child.stderr.decode().strip())
    print("sealed written back", r.read(5, 15) == b"from the opener")
    r.close()
"""


@pytest.mark.parametrize("user", [None, "nobody"])
def test_a_second_process_opens_a_named_region(user, tmp_path):
    env = {}
    if user is None:
        runtime = tmp_path / "runtime"
        runtime.mkdir(mode=0o700)
        env["XDG_RUNTIME_DIR"] = str(runtime)
    else:
        if os.geteuid() != 0 or shutil.which("runuser") is None:
            pytest.skip("needs root and runuser to run as nobody")
        probe = subprocess.run(["runuser", "-u", "nobody", "--", sys.executable, "-c",
                                "import rmem"], capture_output=True, timeout=60, cwd="/tmp")
        if probe.returncode != 0:
            pytest.skip(f"nobody cannot run {sys.executable} with rmem")
        env["XDG_RUNTIME_DIR"] = ""  # nobody's registry: /tmp/rmem-regions-UID
    r = run_py(HANDOFF, OPENER, user=user, env=env)
    out = r.stdout
    assert r.returncode == 0, out + r.stderr
    for line in ("name taken", f"opened {(3 << 20) + 12345} True", "written back True",
                 "gone after close", "sealed unnamed True",
                 f"sealed opened {(3 << 20) + 12345} True", "sealed written back True"):
        assert line in out, out + r.stderr
