#!/usr/bin/env bash
# Install what rmem needs, build it, and run the main demo: a STREAM-like triad over 3 x 256 MiB
# of dlm_alloc'ed arrays on two local memory servers with only 64 MiB resident locally.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/deps.sh
export PATH="$HOME/.cargo/bin:$PATH"
cargo build --release --workspace
mkdir -p target/examples
cc -O2 -Iinclude examples/dlm_stream.c -Ltarget/release -lrmem \
   -Wl,-rpath,"$PWD/target/release" -o target/examples/dlm_stream
echo "+ target/release/rmem run --api --local 64M -- target/examples/dlm_stream 256" >&2
exec target/release/rmem run --api --local 64M -- target/examples/dlm_stream 256
