#!/usr/bin/env bash
# Install what building and testing rmem needs on Debian 12, if it is missing:
# a C compiler, a Rust toolchain (rustup's if present, else Debian's rustc-web 1.85+),
# fontconfig for the benchmark plots, ssh, sshd and ip for the multi-host test, and NBD
# clients for the block device tests.
set -euo pipefail
need=()
command -v cc >/dev/null || need+=(build-essential)
command -v runuser >/dev/null || need+=(util-linux)
command -v c++ >/dev/null || need+=(g++)
# Transparent-mode acceptance tests run Debian's Python with numpy on a threaded OpenBLAS.
[ -x /usr/bin/python3 ] || need+=(python3)
/usr/bin/python3 -c 'import numpy' 2>/dev/null || need+=(python3-numpy)
# The metrics test (crates/rmem-cli/tests/status.rs) checks `rmem server --metrics` with the
# Prometheus client library's own text parser.
/usr/bin/python3 -c 'import prometheus_client' 2>/dev/null || need+=(python3-prometheus-client)
# The Python bindings (scripts/python.sh): a venv for maturin (from PyPI) and the wheel,
# pytest with its timeout plugin, and jupyter nbconvert with a kernel for the notebook test.
/usr/bin/python3 -c 'import ensurepip' 2>/dev/null || need+=(python3-venv)
/usr/bin/python3 -c 'import pytest_timeout' 2>/dev/null || need+=(python3-pytest python3-pytest-timeout)
command -v jupyter-nbconvert >/dev/null || need+=(jupyter-nbconvert)
/usr/bin/python3 -c 'import ipykernel' 2>/dev/null || need+=(python3-ipykernel)
# The fork test (crates/rmem-cli/tests/fork.rs) runs parts of CPython's own regression tests
# (test_subprocess, test_multiprocessing_fork) under rmem; Debian ships them apart.
/usr/bin/python3 -c 'import test.test_subprocess' 2>/dev/null || need+=("libpython$(/usr/bin/python3 -c 'import sys; print("%d.%d" % sys.version_info[:2])')-testsuite")
[ -e /usr/lib/x86_64-linux-gnu/openblas-pthread ] || [ "$(uname -m)" != x86_64 ] || need+=(libopenblas0-pthread)
# Transparent-mode tests (crates/rmem-cli/tests/transparent.rs): C programs linked with
# jemalloc and with tcmalloc, Debian's redis-server (linked with jemalloc) driven by
# redis-cli, and stress-ng's malloc stressor. Installing redis-server also enables its
# service on a machine with systemd; the tests start their own on a free loopback port.
[ -e /usr/include/jemalloc/jemalloc.h ] || need+=(libjemalloc-dev)
[ -e /usr/include/gperftools/tcmalloc.h ] || need+=(libgoogle-perftools-dev)
command -v redis-server >/dev/null || need+=(redis-server)
command -v redis-cli >/dev/null || need+=(redis-tools)
command -v stress-ng >/dev/null || need+=(stress-ng)
# Managed runtimes under `--anon-mmap` (the same file): a Java program built with javac and run
# on the JVM, and a Node.js program (V8).
[ -x /usr/bin/javac ] || need+=(default-jdk-headless)
[ -x /usr/bin/node ] || need+=(nodejs)
# Go programs built with cgo (the same file): the Go toolchain, from Debian unless one is there.
command -v go >/dev/null || [ -x /usr/local/go/bin/go ] || need+=(golang-go)
# The block device tests (crates/rmem-cli/tests/nbd.rs) and `rmem bench nbd` drive `rmem nbd`
# with real NBD clients: nbdinfo, nbdcopy and nbdfuse (libnbd-bin), qemu-io (qemu-utils), fio
# (its nbd engine), mkfs.ext4 and e2fsck (e2fsprogs), and nbdkit's memory and file plugins.
command -v nbdinfo >/dev/null || need+=(libnbd-bin)
command -v nbdkit >/dev/null || need+=(nbdkit)
command -v qemu-io >/dev/null || need+=(qemu-utils)
command -v fio >/dev/null || need+=(fio)
command -v mkfs.ext4 >/dev/null || need+=(e2fsprogs)
# `rmem bench programs` (and its test, crates/rmem-cli/tests/bench_programs.rs) runs real
# programs: sqlite3, Octave (its command-line interpreter only: without recommends) and
# ImageMagick's convert.
command -v sqlite3 >/dev/null || need+=(sqlite3)
lean=()
command -v octave-cli >/dev/null || lean+=(octave)
[ -x /usr/bin/convert ] || lean+=(imagemagick)
# crates/rmem-client/tests/any_cpu.rs runs erasure coding under QEMU's user-mode emulator as CPUs
# without AVX2 and SSSE3 (qemu-x86_64 -cpu Nehalem / qemu64).
command -v qemu-x86_64 >/dev/null || lean+=(qemu-user)
# The multi-host test (crates/rmem-cli/tests/multihost.rs) runs sshd in network namespaces;
# it needs root, and says that it skips without it, so only root needs these.
if [ "$(id -u)" -eq 0 ]; then
  command -v /usr/sbin/sshd >/dev/null || need+=(openssh-server)
  command -v ssh >/dev/null || need+=(openssh-client)
  command -v ip >/dev/null || need+=(iproute2)
fi
# The benchmarks' plots (rmem-bench, which `rmem bench` runs: plotters' ttf feature) find and
# draw fonts via fontconfig. The `rmem` binary itself does not link it.
command -v pkg-config >/dev/null || need+=(pkg-config)
pkg-config --exists fontconfig 2>/dev/null || need+=(libfontconfig1-dev)
[ -e /usr/share/fonts/truetype/dejavu/DejaVuSans.ttf ] || need+=(fonts-dejavu-core)
if ! command -v cargo >/dev/null && [ -x "$HOME/.cargo/bin/cargo" ]; then
  export PATH="$HOME/.cargo/bin:$PATH"
fi
command -v cargo >/dev/null || need+=(rustc-web cargo-web)
if [ $((${#need[@]} + ${#lean[@]})) -gt 0 ]; then
  if [ "$(id -u)" -ne 0 ]; then
    echo "rmem: missing ${need[*]} ${lean[*]}; install them (apt-get install ${need[*]} ${lean[*]}) or run as root" >&2
    exit 1
  fi
  apt-get update -qq
  [ ${#need[@]} -eq 0 ] || DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
  [ ${#lean[@]} -eq 0 ] || DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${lean[@]}" >/dev/null
fi
