#!/usr/bin/env bash
# Install what building and testing rmem needs on Debian 12, if it is missing:
# a C compiler, fontconfig for the benchmark plots, and a Rust toolchain (rustup's if present, else Debian's rustc-web 1.85+).
set -euo pipefail
need=()
command -v cc >/dev/null || need+=(build-essential)
command -v runuser >/dev/null || need+=(util-linux)
# The plots of `rmem bench suite` (plotters' ttf feature) find and draw fonts via fontconfig.
command -v pkg-config >/dev/null || need+=(pkg-config)
pkg-config --exists fontconfig 2>/dev/null || need+=(libfontconfig1-dev)
[ -e /usr/share/fonts/truetype/dejavu/DejaVuSans.ttf ] || need+=(fonts-dejavu-core)
if ! command -v cargo >/dev/null && [ -x "$HOME/.cargo/bin/cargo" ]; then
  export PATH="$HOME/.cargo/bin:$PATH"
fi
command -v cargo >/dev/null || need+=(rustc-web cargo-web)
if [ ${#need[@]} -gt 0 ]; then
  if [ "$(id -u)" -ne 0 ]; then
    echo "rmem: missing ${need[*]}; install them (apt-get install ${need[*]}) or run as root" >&2
    exit 1
  fi
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
fi
