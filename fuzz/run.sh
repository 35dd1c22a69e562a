#!/usr/bin/env bash
# `make test-fuzz`: the cargo-fuzz targets `request_and_template` (request parsing, chat-template
# rendering, output parsing; FUZZ_RUNS inputs) and `model_files` (GGUF files, config.json +
# safetensors, tokenizer.json and chat templates through the loader; FUZZ_MODEL_RUNS inputs),
# starting from the seeds in corpus/. Any crash (panic, abort, per-input timeout, out of memory)
# makes it exit non-zero; a planted crash at the end checks that it does.
#
# It needs nothing beyond the stable toolchain, a C++ compiler (libfuzzer-sys builds libFuzzer)
# and crates.io on first use:
#   - cargo-fuzz is installed, pinned and --locked, into $CARGO_HOME (once per machine) unless
#     that version is already there;
#   - the target is built with `--sanitizer none`: cargo-fuzz then passes no `-Z` flag, so stable
#     rustc builds it (AddressSanitizer would need a nightly compiler and its runtime; the code
#     under test is safe Rust, where a panic is the bug to find);
#   - `--dev` (unoptimised; see fuzz/Cargo.toml) keeps the build to a few minutes on 2 cores
#     while still running well over a thousand inputs per second.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
CARGO="${CARGO:-cargo}"
runs="${FUZZ_RUNS:-50000}"
model_runs="${FUZZ_MODEL_RUNS:-4000}"
target="${CARGO_TARGET_DIR:-$root/target}"
version="0.13.2"
# Installed once per machine beside cargo itself (a fresh clone's target/ would otherwise pay
# the minute-long install on every CI run); any other copy of the pinned version is used as is.
tools="${CARGO_HOME:-$HOME/.cargo}"
fuzz="$tools/bin/cargo-fuzz"

t0=$SECONDS
if [ "$("$fuzz" --version 2>/dev/null)" != "cargo-fuzz $version" ] && [ -x "$target/tools/bin/cargo-fuzz" ]; then
    fuzz="$target/tools/bin/cargo-fuzz"
fi
if [ "$("$fuzz" --version 2>/dev/null)" != "cargo-fuzz $version" ]; then
    fuzz="$tools/bin/cargo-fuzz"
    echo "test-fuzz: installing cargo-fuzz $version into $tools"
    "$CARGO" install cargo-fuzz --version "$version" --locked --root "$tools"
fi
t1=$SECONDS
flags=(--dev --sanitizer none --target-dir "$target/fuzz")
cd fuzz
"$fuzz" build "${flags[@]}" request_and_template
"$fuzz" build "${flags[@]}" model_files
t2=$SECONDS
# New inputs go to a scratch directory; the checked-in seeds stay as they are.
scratch="$(mktemp -d)"
trap 'rm -rf "$scratch"' EXIT
"$fuzz" run "${flags[@]}" request_and_template "$scratch" corpus/request_and_template -- \
    -runs="$runs" -timeout=60 -rss_limit_mb=2048 -print_final_stats=1
t3=$SECONDS
mkdir -p "$scratch/model_files"
"$fuzz" run "${flags[@]}" model_files "$scratch/model_files" corpus/model_files -- \
    -runs="$model_runs" -timeout=60 -rss_limit_mb=2048 -print_final_stats=1
t4=$SECONDS
# The harness must fail on a crash: a planted one (TANDEM_FUZZ_PLANT, an input starting with
# PLANTED) has to make the run exit non-zero.
printf 'PLANTED' > "$scratch/planted"
if TANDEM_FUZZ_PLANT=1 "$fuzz" run "${flags[@]}" model_files "$scratch/planted" -- -runs=1 >"$scratch/planted.log" 2>&1; then
    echo "test-fuzz: a planted crash did not fail the run" >&2
    exit 1
fi
echo "test-fuzz: request_and_template $runs inputs, model_files $model_runs inputs, no crash; planted crash caught" \
    "(install $((t1 - t0))s, build $((t2 - t1))s, run $((t3 - t2))s + $((t4 - t3))s)"
