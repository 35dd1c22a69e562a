#!/usr/bin/env bash
# Decode speed of `tandem run` when a busy loop pinned on core 1 starts after tandem has
# chosen its threads (issue 17 target 6): the default (-t 0, whose watch caps the kernels'
# threads once the neighbour shows), against -t 1 and -t 2, interleaved, ROUNDS rounds.
B=${B:-target/release/tandem}
P="Write a long story about a lighthouse keeper and the sea, with many details"
N=${N:-384}
for r in $(seq "${ROUNDS:-3}"); do
  for t in 0 1 2; do
    $B run -m smollm2-135m -n "$N" --ignore-eos -t $t "$P" 2>/tmp/late-$t.log >/dev/null &
    RUN=$!
    sleep "${DELAY:-0.4}"
    taskset -c 1 sh -c 'while :; do :; done' & BUSY=$!
    wait $RUN
    kill $BUSY
    echo "round $r -t $t: $(grep -o 'decode: [0-9.]* tok/s' /tmp/late-$t.log) $(grep -o 'kernels on [0-9]* thread(s)' /tmp/late-$t.log | head -1)"
    sleep 1
  done
done
