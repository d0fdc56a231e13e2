#!/usr/bin/env bash
# The Python bindings (crates/rmem-py, `import rmem`): build the wheel with maturin for
# Debian's /usr/bin/python3, install it in a venv that also sees Debian's numpy, pytest and
# jupyter (--system-site-packages), and run the tests against target/release/rmem.
# Needs `cargo build --release` first, and PyPI once, for maturin. Arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
venv=$root/target/py/venv
[ -x "$venv/bin/python" ] || /usr/bin/python3 -m venv --system-site-packages "$venv"
[ -x "$venv/bin/maturin" ] || "$venv/bin/pip" install -q 'maturin>=1.9.4,<2'
# A target directory of its own: the crate is a workspace of its own (see its Cargo.toml).
export CARGO_TARGET_DIR=$root/target/py/cargo
(cd crates/rmem-py && "$venv/bin/maturin" build --release -i /usr/bin/python3 --out "$root/target/py/wheels")
"$venv/bin/pip" install -q --force-reinstall --no-deps "$root"/target/py/wheels/rmem-0.1.0-*.whl
# From elsewhere, so `import rmem` is the installed wheel, not the source tree.
cd /tmp
RMEM_BIN=$root/target/release/rmem timeout 900 "$venv/bin/python" -m pytest -q -rs -p no:cacheprovider \
  "$root/crates/rmem-py/tests" "$@"
