#!/usr/bin/env bash
# `make test-neon`: the aarch64 build (NEON kernels, candle's aarch64 paths) tested for exactness
# under emulation. Cross-compiles the tests for aarch64-unknown-linux-gnu and runs them with
# Debian's qemu-user on three CPU models:
#
#   max          dotprod + i8mm (like Apple M2 and later): the whole tandem-model suite (every op
#                against its reference, the conformance checks incl. verify rows = decode rows
#                on every fixture, row invariance of every GGUF type) and the engine's lossless
#                speculation / prefix-cache / KV-format suites;
#   neoverse-n1  dotprod without i8mm (like Apple M1, Graviton 2): the kernel and row-invariance
#                tests (candle's repacked kernels differ between the two kinds);
#   cortex-a53   ARMv8.0 without dotprod: our kernels' baseline NEON flavour (candle 0.11.1's
#                own Q8_0 matmul stops there with SIGILL, an instruction past ARMv8.0, so only
#                our kernels' tests run on it).
#
# Needs: rustup target aarch64-unknown-linux-gnu (added here), and the Debian packages
# qemu-user gcc-aarch64-linux-gnu libc6-dev-arm64-cross (installed here when running as root
# with apt; otherwise the script says what to install and stops).
set -euo pipefail
cd "$(dirname "$0")/.."
CARGO=${CARGO:-cargo}
TARGET=aarch64-unknown-linux-gnu
SYSROOT=/usr/aarch64-linux-gnu

need=()
command -v qemu-aarch64 >/dev/null || need+=(qemu-user)
command -v aarch64-linux-gnu-gcc >/dev/null || need+=(gcc-aarch64-linux-gnu)
[ -e "$SYSROOT/lib/ld-linux-aarch64.so.1" ] || need+=(libc6-dev-arm64-cross)
if [ ${#need[@]} -gt 0 ]; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
        echo "test-neon: installing ${need[*]}"
        apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
    else
        echo "test-neon: needs the Debian packages: ${need[*]} (apt-get install ${need[*]})" >&2
        exit 1
    fi
fi
rustup target list --installed | grep -q "^$TARGET$" || rustup target add "$TARGET"

export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER=aarch64-linux-gnu-gcc
export CC_aarch64_unknown_linux_gnu=aarch64-linux-gnu-gcc
run_on() { # cpu, cargo test arguments...
    local cpu=$1
    shift
    echo "== test-neon: qemu -cpu $cpu: $*"
    CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_RUNNER="qemu-aarch64 -cpu $cpu -L $SYSROOT" \
        "$CARGO" test -q --target "$TARGET" "$@"
}

run_on max -p tandem-model
run_on max -p tandem-engine --test speculative --test prefix_cache --test kv_dtype
run_on neoverse-n1 -p tandem-model --lib ops::
run_on neoverse-n1 -p tandem-model --test row_invariance
run_on cortex-a53 -p tandem-model --lib ops::quant::tests::
echo "test-neon: all passed"
