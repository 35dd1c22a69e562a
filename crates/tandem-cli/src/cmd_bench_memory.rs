//! `tandem bench memory`: the CPU's read bandwidth with 1..N threads, the bound a CPU decode
//! step is held to. A batch-1 step reads every weight once, so the number printed for the
//! bench's thread count (in TB/s) is what `tandem bench --device cpu --bandwidth` should get
//! (issue 17: "% of the bound" lines). Each thread sums its own contiguous share of a buffer
//! far larger than any cache; the sum is checked against the closed form, so a share that was
//! skipped or read twice fails the run instead of reading fast.

use std::time::Instant;

use clap::Args;

#[derive(Args, Debug)]
pub struct MemoryArgs {
    /// Thread counts to measure, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "1,2")]
    pub threads: Vec<usize>,
    /// Size of the buffer read, in MiB (well past the last-level cache).
    #[arg(long, default_value_t = 1024)]
    pub mib: usize,
    /// Timed reads of the whole buffer per thread count (the best and the median are printed).
    #[arg(long, default_value_t = 7)]
    pub repeats: usize,
}

pub fn run(a: MemoryArgs) -> anyhow::Result<()> {
    if a.threads.is_empty() || a.threads.iter().any(|&t| t == 0 || t > 1024) {
        anyhow::bail!("--threads {:?}: give thread counts from 1 to 1024", a.threads);
    }
    if a.mib == 0 || a.mib > 1 << 20 {
        anyhow::bail!("--mib {}: give a buffer size from 1 MiB to 1 TiB", a.mib);
    }
    if a.repeats == 0 {
        anyhow::bail!("--repeats 0: measure at least once");
    }
    let (buf, want) = filled(a.mib)?;
    println!("| threads | read GB/s (best) | read GB/s (median) | --bandwidth (TB/s) |");
    println!("|---|---|---|---|");
    for &t in &a.threads {
        let rates = timed_rates(&buf, want, t, a.repeats)?;
        let (best, median) = (rates[0], rates[rates.len() / 2]);
        println!("| {t} | {best:.1} | {median:.1} | {:.4} |", median / 1e3);
    }
    Ok(())
}

/// The median read bandwidth in GB/s of `repeats` reads of a `mib` MiB buffer by `threads`
/// threads (`--bandwidth auto` on the CPU).
pub fn read_bandwidth(threads: usize, mib: usize, repeats: usize) -> anyhow::Result<f64> {
    let (buf, want) = filled(mib)?;
    let rates = timed_rates(&buf, want, threads, repeats)?;
    Ok(rates[rates.len() / 2])
}

/// A buffer of `mib` MiB holding `0..n` and the sum [`checksum`] must give for it.
fn filled(mib: usize) -> anyhow::Result<(Vec<u64>, u64)> {
    let words = (mib << 20) / 8;
    let mut buf = Vec::new();
    buf.try_reserve_exact(words)
        .map_err(|_| anyhow::anyhow!("cannot allocate {mib} MiB for the read test; try a smaller --mib"))?;
    buf.extend(0..words as u64);
    Ok((buf, expected(words as u64)))
}

/// GB/s of `repeats` (at least one) timed reads of `buf` by `threads` threads after one untimed
/// (first touch of the shares), fastest first; an error if a read's sum is not `want`.
fn timed_rates(buf: &[u64], want: u64, threads: usize, repeats: usize) -> anyhow::Result<Vec<f64>> {
    checksum(buf, threads);
    let mut rates = Vec::with_capacity(repeats.max(1));
    for _ in 0..repeats.max(1) {
        let start = Instant::now();
        let got = checksum(buf, threads);
        let secs = start.elapsed().as_secs_f64();
        if got != want {
            anyhow::bail!("read test with {threads} threads summed {got}, expected {want}: a share was missed");
        }
        rates.push(std::mem::size_of_val(buf) as f64 / secs.max(1e-9) / 1e9);
    }
    rates.sort_by(|x, y| y.total_cmp(x));
    Ok(rates)
}

/// The wrapping sum of `0..n`, what [`checksum`] of a buffer holding `0..n` must give.
fn expected(n: u64) -> u64 {
    let (a, b) = if n.is_multiple_of(2) { (n / 2, n.wrapping_sub(1)) } else { (n, (n - 1) / 2) };
    a.wrapping_mul(b)
}

/// The wrapping sum of `buf`, read by `threads` threads, each its own contiguous share.
pub fn checksum(buf: &[u64], threads: usize) -> u64 {
    let share = buf.len().div_ceil(threads.max(1)).max(1);
    std::thread::scope(|s| {
        let handles: Vec<_> = buf.chunks(share).map(|c| s.spawn(move || sum(c))).collect();
        handles.into_iter().map(|h| h.join().unwrap_or(0)).fold(0, u64::wrapping_add)
    })
}

/// Eight independent lanes, so the loop is bound by loads rather than one add chain; each
/// 64-byte line is prefetched 4 KB ahead (on x86-64), as the weight kernels do.
fn sum(c: &[u64]) -> u64 {
    let mut acc = [0u64; 8];
    let mut it = c.chunks_exact(8);
    for w in &mut it {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: a prefetch never faults, whatever the address.
        unsafe {
            use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
            _mm_prefetch::<_MM_HINT_T0>(w.as_ptr().wrapping_add(512) as *const i8);
        }
        for (a, v) in acc.iter_mut().zip(w) {
            *a = a.wrapping_add(*v);
        }
    }
    let tail = it.remainder().iter().fold(0u64, |a, v| a.wrapping_add(*v));
    acc.iter().fold(tail, |a, v| a.wrapping_add(*v))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_share_is_read_once_for_any_thread_count() {
        for n in [0usize, 1, 7, 8, 9, 1000, 4099] {
            let buf: Vec<u64> = (0..n as u64).collect();
            for t in [1, 2, 3, 7, 64] {
                assert_eq!(checksum(&buf, t), expected(n as u64), "n {n} threads {t}");
            }
        }
        // A timed read checks its sums and gives a finite positive rate.
        let gbs = read_bandwidth(2, 8, 2).unwrap();
        assert!(gbs.is_finite() && gbs > 0.0, "{gbs}");
        // The closed form where the sum wraps, against 128-bit arithmetic.
        for big in [u64::MAX / 3, (1 << 33) + 1, 1 << 40] {
            let exact = (big as u128) * (big as u128 - 1) / 2;
            assert_eq!(expected(big), exact as u64, "n {big}");
        }
    }
}
