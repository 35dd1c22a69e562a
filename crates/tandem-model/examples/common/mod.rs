//! What the kernel benchmarks under `examples/` share.

use std::time::Instant;

/// Best wall time of five runs of `f` (after one warm-up run), in seconds.
pub fn time<F: FnMut()>(mut f: F) -> f64 {
    f();
    let mut best = f64::MAX;
    for _ in 0..5 {
        let t = Instant::now();
        f();
        best = best.min(t.elapsed().as_secs_f64());
    }
    best
}
