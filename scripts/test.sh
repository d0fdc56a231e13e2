#!/usr/bin/env bash
# The whole test suite: unit, integration, real server processes, unprivileged runs, and the
# benchmarks at a tiny size. Every test bounds itself in time.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/deps.sh
export PATH="$HOME/.cargo/bin:$PATH"
cargo build --release --workspace --all-targets
timeout 1500 cargo test --release --workspace -- --test-threads=2
# The Python bindings: a wheel built by maturin, tested with pytest under /usr/bin/python3.
scripts/python.sh
