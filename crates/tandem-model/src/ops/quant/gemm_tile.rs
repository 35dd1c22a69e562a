//! The tile choice of the CUDA prefill GEMMs (`kqgemm.cu`, `q8gemm.cu`): 64 x 64 blocks two to
//! an SM, or 128 x 128 blocks one to an SM. A function of the call's shape and the card alone,
//! never of the values, so kept free of the CUDA build and tested everywhere; every tile
//! gives the same bits.

/// Whether an m x n GEMM finishes sooner on 128 x 128 tiles (one block an SM, `gain` times the
/// 64 tile's rate) than on 64 x 64 tiles (two blocks an SM) on a card of `sms` SMs: the
/// busiest SM's share of each grid, counted in 64 x 64 blocks, the grid spread evenly. Calls
/// of fewer than 128 rows keep the 64 tile.
pub fn tile128_wins(m: usize, n: usize, sms: usize, gain: f64) -> bool {
    let sms = sms.max(1);
    let blocks64 = m.div_ceil(64) * n.div_ceil(64);
    let blocks128 = m.div_ceil(128) * n.div_ceil(128);
    let t64 = blocks64.div_ceil(sms) as f64;
    let t128 = (blocks128.div_ceil(sms) * 4) as f64 / gain;
    m >= 128 && t128 < t64
}

/// The prefill GEMMs' tile for every call of 64+ rows, whatever their rule would choose (64 or
/// 128; 0: the rule's choice), for check-device, which runs both tiles and compares them.
static TILE_OVERRIDE: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// The tile [`with_tile`] forces, if any.
pub fn tile_override() -> Option<usize> {
    match TILE_OVERRIDE.load(std::sync::atomic::Ordering::Relaxed) {
        t @ (64 | 128) => Some(t),
        _ => None,
    }
}

/// Runs `f` with every prefill GEMM call (K-quant and Q8_0) on `tile` (64 or 128), then
/// restores the rule (check-device only: the override is process-wide).
pub fn with_tile<T>(tile: usize, f: impl FnOnce() -> T) -> T {
    use std::sync::atomic::Ordering::Relaxed;
    let before = TILE_OVERRIDE.swap(tile, Relaxed);
    let out = f();
    TILE_OVERRIDE.store(before, Relaxed);
    out
}

#[cfg(test)]
mod tests {
    use super::{tile128_wins, tile_override, with_tile};

    #[test]
    fn the_override_holds_inside_and_is_restored() {
        assert_eq!(tile_override(), None);
        assert_eq!(with_tile(128, || with_tile(64, tile_override)), Some(64));
        assert_eq!(with_tile(128, tile_override), Some(128));
        assert_eq!(with_tile(7, tile_override), None);
        assert_eq!(tile_override(), None);
    }

    #[test]
    fn wide_calls_take_the_big_tile_and_narrow_ones_keep_the_small() {
        // 132 SMs (H100 / H200 SXM), the K-quant gain 1.2.
        // 512 x 4,096: 128 blocks of 128 (one an SM, 4 / 1.2 = 3.3 units) against 512 of 64
        // (4 an SM): the big tile.
        assert!(tile128_wins(512, 4096, 132, 1.2));
        assert!(tile128_wins(512, 12_352, 132, 1.2));
        // 512 x 1,024: 32 big blocks leave 100 SMs idle (3.3 units) where the 128 small ones
        // take one unit an SM.
        assert!(!tile128_wins(512, 1024, 132, 1.2));
        // Fewer than 128 rows: always the small tile, however wide.
        assert!(!tile128_wins(100, 100_000, 132, 10.0));
        // No gain on a full card: the small tile.
        assert!(!tile128_wins(4096, 4096, 132, 1.0));
        // A card with few SMs: the grid fills it either way, the gain decides.
        assert!(tile128_wins(256, 256, 1, 1.2));
        assert!(!tile128_wins(256, 256, 1, 0.9));
        // 0 SMs is read as 1, not a division by zero.
        assert!(tile128_wins(256, 256, 0, 1.2));
    }
}
