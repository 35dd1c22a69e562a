#!/usr/bin/env bash
# Kernel times of decode steps on the GPU machine (issue 16): Nsight Compute captures
# PROFILE_STEPS decode steps of `tandem bench` (bracketed by cuProfilerStart/Stop through
# TANDEM_PROFILE_DECODE) and writes one CSV row per kernel launch; a summary per kernel name
# (count, total microseconds, share) goes to $OUT/profile-*.md.
#   CASES="9b:q8_0 9b:bf16 0.8b:q8_0" bash scripts/gpu-profile.sh
# DEPTH=N profiles decode steps after N tokens of context (`tandem bench -d N`). MODE=prefill
# captures one timed prefill of PROMPT (default 512) tokens instead (TANDEM_PROFILE_PREFILL);
# MODE=verify one verify step of VERIFY (default 4) positions (TANDEM_PROFILE_VERIFY).
# MODE=batch one batched decode step of BATCH (default 64) sequences (TANDEM_PROFILE_BATCH),
# each at DEPTH tokens of context.
# KERNEL=REGEX (e.g. KERNEL=tmmk_bf16) profiles only the first COUNT (default 2) launches of
# the kernels it matches, with Nsight Compute's sections SECTIONS (default "SpeedOfLight
# WarpStateStats MemoryWorkloadAnalysis Occupancy"), the report in $OUT/ncu-<case>-<kernel>.txt:
# where a kernel's warps stall (shared memory, barriers, the tensor pipe). SOURCE=1 adds the
# first launch's stall samples per SASS instruction ($OUT/ncu-<case>-<kernel>-sass.csv).
# NCU_CACHE=none keeps the caches between kernels (Nsight Compute flushes them by default, which
# makes small kernels read high): the sum of a step's kernels then compares with its wall time,
# the difference being the gaps between launches.
# A case NAME=FILE.gguf profiles that file (`-m`) rather than a random preset; a case
# llama<preset>:<dtype> (llama8b:bf16) a random Llama-family preset.
set -uo pipefail
cd "$(dirname "$0")/.."
res=${OUT:-target/gpu-results}
mkdir -p "$res" /tmp/tg
. scripts/gpu-env.sh
gpu_unpack tandem
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
for c in ${CASES:-9b:q8_0}; do
  if [ "${c#*=}" != "$c" ]; then p=${c%%=*}; t=file; model=(-m "${c#*=}")
  else p=${c%%:*}; t=${c##*:}; model=(--random-hybrid "$p" --random-dtype "$t")
    # llama8b:bf16 and the like: a random Llama-family preset.
    [ "${p#llama}" != "$p" ] && model=(--random-llama "${p#llama}" --random-dtype "$t"); fi
  if [ "${MODE:-decode}" = prefill ]; then
    t=$t-pp${PROMPT:-512}; what=(env TANDEM_PROFILE_PREFILL=1); run=(-p "${PROMPT:-512}" -g 1)
  elif [ "${MODE:-decode}" = batch ]; then
    t=$t-x${BATCH:-64}; what=(env TANDEM_PROFILE_BATCH="${PROFILE_STEPS:-1}"); run=(-p 0 -g 4 --batch "${BATCH:-64}")
  elif [ "${MODE:-decode}" = verify ]; then
    t=$t-tv${VERIFY:-4}; what=(env TANDEM_PROFILE_VERIFY="${PROFILE_STEPS:-1}"); run=(-p 0 -g 6 --verify "${VERIFY:-4}")
  else
    what=(env TANDEM_PROFILE_DECODE="${PROFILE_STEPS:-1}"); run=(-p 1 -g 6)
  fi
  tag=$p-$t${DEPTH:+-d$DEPTH}${NCU_CACHE:+-c$NCU_CACHE}
  if [ -n "${KERNEL:-}" ]; then
    secs=(); for x in ${SECTIONS:-SpeedOfLight WarpStateStats MemoryWorkloadAnalysis Occupancy}; do secs+=(--section "$x"); done
    rep="$res/ncu-$tag-${KERNEL//[^A-Za-z0-9_]/_}.txt"
    "${what[@]}" timeout "${NCU_TIMEOUT:-200}" "$NCU" --profile-from-start off --clock-control none \
      -k "regex:$KERNEL" -c "${COUNT:-2}" "${secs[@]}" /tmp/tandem-gpu/tandem bench --device cuda "${model[@]}" \
      "${run[@]}" -r 1 ${DEPTH:+-d $DEPTH} > "$rep" 2>&1
    echo "ncu $tag $KERNEL rc=$? ($(wc -l < "$rep") lines in $rep)"
    grep -E "Duration|Throughput|Stall|Issued|Occupancy|Bank" "$rep" | head -40
    # SOURCE=1: also the first launch's warp-state samples per SASS instruction (where in the
    # kernel the warps wait), as CSV beside the report (not yet run: the flags are Nsight
    # Compute's documented `--section SourceCounters`, `-i`, `--page source --print-source sass`).
    if [ "${SOURCE:-0}" = 1 ]; then
      src="${rep%.txt}-sass"
      "${what[@]}" timeout "${NCU_TIMEOUT:-200}" "$NCU" --profile-from-start off --clock-control none \
        -k "regex:$KERNEL" -c 1 --section SourceCounters --section WarpStateStats -f -o "$src" \
        /tmp/tandem-gpu/tandem bench --device cuda "${model[@]}" "${run[@]}" -r 1 ${DEPTH:+-d $DEPTH} > "$src.log" 2>&1
      "$NCU" -i "$src.ncu-rep" --page source --csv --print-source sass > "$src.csv" 2>> "$src.log"
      echo "ncu source $tag $KERNEL: $(wc -l < "$src.csv") lines in $src.csv"; rm -f "$src.ncu-rep"
    fi
    continue
  fi
  csv=/tmp/tg/ncu-$tag.csv
  "${what[@]}" timeout "${NCU_TIMEOUT:-200}" "$NCU" --profile-from-start off --clock-control none --cache-control "${NCU_CACHE:-all}" \
    --metrics gpu__time_duration.sum --csv /tmp/tandem-gpu/tandem bench --device cuda "${model[@]}" \
    "${run[@]}" -r 1 ${DEPTH:+-d $DEPTH} > "$csv" 2> /tmp/tg/ncu.err
  echo "ncu $tag rc=$? ($(wc -l < "$csv") lines)"
  python3 - "$csv" "$p" "$t${DEPTH:+ at depth $DEPTH}" > "$res/profile-$tag.md" <<'PY'
import csv, sys, collections
rows = [r for r in csv.reader(open(sys.argv[1])) if len(r) > 5]
head = next((r for r in rows if "Kernel Name" in r), None)
if head is None:
    print("no kernels captured"); sys.exit()
ki, vi, ui = head.index("Kernel Name"), head.index("Metric Value"), head.index("Metric Unit")
by = collections.defaultdict(lambda: [0, 0.0])
for r in rows:
    if r is head or r[ki] == "Kernel Name": continue
    v = float(r[vi].replace(",", "")); unit = r[ui]
    us = v / 1000 if unit in ("ns", "nsecond") else v * 1000 if unit in ("ms", "msecond") else v
    name = r[ki].split("(")[0][:60]
    by[name][0] += 1; by[name][1] += us
tot = sum(v[1] for v in by.values())
print(f"# {sys.argv[2]} {sys.argv[3]}: {sum(v[0] for v in by.values())} launches, {tot:.0f} us of kernels")
print("| kernel | launches | us | share |\n|---|---|---|---|")
for n, (c, us) in sorted(by.items(), key=lambda x: -x[1][1]):
    print(f"| {n} | {c} | {us:.1f} | {100*us/tot:.1f}% |")
PY
  head -25 "$res/profile-$tag.md"; tail -3 /tmp/tg/ncu.err
done
