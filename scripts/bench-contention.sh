#!/usr/bin/env bash
# Decode speed of `tandem run` with a busy loop pinned on core 1 (issue 17 target 6), and idle.
B=${B:-target/release/tandem}
P="Write a long story about a lighthouse keeper and the sea, with many details"
run() { $B run -m smollm2-135m -n 128 --ignore-eos "$@" "$P" 2>&1 >/dev/null | grep -o "decode: [0-9.]* tok/s"; }
for phase in busy idle; do
  if [ $phase = busy ]; then taskset -c 1 sh -c 'while :; do :; done' & BUSY=$!; sleep 1; fi
  for r in 1 2 3; do
    for t in 0 1 2; do echo "$phase round $r -t $t: $(run -t $t)"; done
  done
  [ $phase = busy ] && kill $BUSY
done
