//! How many CPU threads the kernels use, chosen from the cores actually free, at start and
//! while tandem runs.
//!
//! CPU kernels split every op across worker threads and wait for the slowest. When another
//! process keeps one of our cores busy, the worker sharing it runs only in the scheduler's
//! time slices and every op waits for it: on the 2-core machine decode fell from 42-47 tok/s
//! (one thread) to 5 tok/s with both. [`threads_for_free_cores`] reads how busy the cores this
//! process may run on are with *other* processes over a short window (`/proc/stat` for the
//! cores of our affinity mask, minus our own time from `/proc/self/stat`) and returns a thread
//! count for the cores that are free ([`threads_for`]); the CLI calls it at start when `-t` is
//! not given. The worker pools get every core (candle's is sized once, at its first use) and
//! the count becomes a cap on the kernels' threads (`tandem_model::ops::cpu_threads`), which
//! [`watch`] keeps measuring twice a second: a neighbour that starts later lowers it, one
//! that stops lifts it. Results do not depend on
//! it: every kernel gives the same bits for any thread split. Elsewhere than Linux there is
//! no measurement and every core is used.

use std::time::Duration;

/// CPU time counters of one sample, in clock ticks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CpuSample {
    /// Ticks of the sampled cores, busy and idle.
    pub total: u64,
    /// Ticks those cores were busy (anyone's).
    pub busy: u64,
    /// Ticks this process used.
    pub own: u64,
}

/// Cores free of other processes between two samples of `cores` cores: their busy time minus
/// ours, as cores, taken off `cores`. `None` when no time passed.
pub fn free_cores(a: CpuSample, b: CpuSample, cores: usize) -> Option<f64> {
    let total = b.total.checked_sub(a.total)?;
    if total == 0 || cores == 0 {
        return None;
    }
    let busy = b.busy.saturating_sub(a.busy);
    let own = b.own.saturating_sub(a.own);
    let others = busy.saturating_sub(own) as f64 / (total as f64 / cores as f64);
    Some((cores as f64 - others).clamp(0.0, cores as f64))
}

/// The thread count for `free` free cores out of `cores`: a core counts as taken once other
/// processes used a quarter of one, because a worker that shares a core with a busy process
/// gets only part of it, and its share of that core is all the others' time shows (a busy loop
/// beside two workers looks like half a core); at least one thread.
pub fn threads_for(free: f64, cores: usize) -> usize {
    let taken = ((cores as f64 - free).max(0.0) + 0.75).floor() as usize;
    cores.saturating_sub(taken).clamp(1, cores.max(1))
}

/// Parses `/proc/stat`, summing the `cpuN` lines whose N is in `cpus`: `(total, busy)` ticks
/// (busy = all but idle and iowait; guest time is already inside user time).
pub fn parse_proc_stat(text: &str, cpus: &[usize]) -> Option<(u64, u64)> {
    let (mut total, mut busy, mut seen) = (0u64, 0u64, 0usize);
    for line in text.lines() {
        let Some(rest) = line.strip_prefix("cpu") else { continue };
        let mut f = rest.split_whitespace();
        let Some(Ok(n)) = f.next().map(str::parse::<usize>) else { continue };
        if !cpus.contains(&n) {
            continue;
        }
        let v: Vec<u64> = f.take(8).filter_map(|x| x.parse().ok()).collect();
        if v.len() < 5 {
            return None;
        }
        let t: u64 = v.iter().sum();
        total += t;
        busy += t - v[3] - v[4];
        seen += 1;
    }
    (seen == cpus.len() && seen > 0).then_some((total, busy))
}

/// `utime + stime` of `/proc/self/stat` (fields 14 and 15; the command name may hold spaces).
pub fn parse_self_stat(text: &str) -> Option<u64> {
    let after = &text[text.rfind(')')? + 1..];
    let f: Vec<&str> = after.split_whitespace().collect();
    // after ")" the fields start at 3 (state), so utime (14) and stime (15) are 11 and 12
    Some(f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?)
}

#[cfg(target_os = "linux")]
fn affinity() -> Vec<usize> {
    // SAFETY: sched_getaffinity writes into the set we own; CPU_ISSET reads it.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        if libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) != 0 {
            return Vec::new();
        }
        (0..libc::CPU_SETSIZE as usize).filter(|&c| libc::CPU_ISSET(c, &set)).collect()
    }
}

#[cfg(target_os = "linux")]
fn sample(cpus: &[usize]) -> Option<CpuSample> {
    let (total, busy) = parse_proc_stat(&std::fs::read_to_string("/proc/stat").ok()?, cpus)?;
    let own = parse_self_stat(&std::fs::read_to_string("/proc/self/stat").ok()?)?;
    Some(CpuSample { total, busy, own })
}

/// The kernels' thread count as measurements come in: it drops to a lower measured count at
/// once (a neighbour on our cores makes every extra thread wait on it: SmolLM2 on two threads
/// beside a busy loop runs at 0.25-0.4x of one thread), and rises only after [`RISE_WINDOWS`]
/// windows in a row all measured above it, to the lowest of them, so a short burst of another
/// process costs a few windows on fewer threads and a bursty neighbour cannot make the count
/// flap (a 16-core GPU host's background load of 0.0-0.4 cores moved it between 15 and 16
/// twice a second, each change logged, with two agreeing windows as the rule).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Follow {
    pub current: usize,
    /// Windows in a row measured above `current`, and the lowest count among them.
    above: usize,
    lowest: usize,
}

/// Consecutive windows above the current count that let it rise (one second at the server's
/// 200 ms period).
pub const RISE_WINDOWS: usize = 5;

impl Follow {
    pub fn new(current: usize) -> Self {
        Self { current, above: 0, lowest: usize::MAX }
    }

    /// Takes one measured count; returns the new count when it changes.
    pub fn observe(&mut self, measured: usize) -> Option<usize> {
        if measured <= self.current {
            self.above = 0;
            self.lowest = usize::MAX;
            if measured == self.current {
                return None;
            }
            self.current = measured;
            return Some(measured);
        }
        self.above += 1;
        self.lowest = self.lowest.min(measured);
        if self.above < RISE_WINDOWS {
            return None;
        }
        self.current = self.lowest;
        self.above = 0;
        self.lowest = usize::MAX;
        Some(self.current)
    }
}

/// Keeps the kernels' thread limit ([`tandem_model::ops::cpu_threads::set_limit`]) on the
/// cores other processes leave free, measured every `period` on a background thread (what
/// [`threads_for_free_cores`] measures once at start): a neighbour that starts after tandem
/// lowers it, one that stops raises it again, never above the `threads` the pools were made
/// with, starting from `current`. Returns whether the watch started (Linux, two or more
/// cores, `threads` > 1).
pub fn watch(threads: usize, current: usize, period: Duration) -> bool {
    #[cfg(target_os = "linux")]
    {
        let cpus = affinity();
        if cpus.len() < 2 || threads < 2 {
            return false;
        }
        let spawned = std::thread::Builder::new().name("tandem-cores".into()).spawn(move || {
            let Some(mut a) = sample(&cpus) else { return };
            let mut follow = Follow::new(current.clamp(1, threads));
            loop {
                std::thread::sleep(period);
                let Some(b) = sample(&cpus) else { return };
                if let Some(free) = free_cores(a, b, cpus.len()) {
                    if let Some(n) = follow.observe(threads_for(free, cpus.len()).min(threads)) {
                        tracing::info!(
                            "{free:.1} of {} cores free of other processes: kernels on {n} thread(s)",
                            cpus.len()
                        );
                        tandem_model::ops::cpu_threads::set_limit(n);
                    }
                }
                a = b;
            }
        });
        spawned.is_ok()
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = (threads, current, period);
        false
    }
}

/// Threads for the cores of our affinity mask that other processes left free over `window`,
/// or `None` where that cannot be measured (not Linux, one core, unreadable `/proc`).
pub fn threads_for_free_cores(window: Duration) -> Option<usize> {
    #[cfg(target_os = "linux")]
    {
        let cpus = affinity();
        if cpus.len() < 2 {
            return None;
        }
        let a = sample(&cpus)?;
        std::thread::sleep(window);
        let b = sample(&cpus)?;
        let free = free_cores(a, b, cpus.len())?;
        let n = threads_for(free, cpus.len());
        tracing::debug!(cores = cpus.len(), free, threads = n, "free cores at start");
        Some(n)
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = window;
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_count_drops_at_once_and_rises_after_enough_quiet_windows() {
        let quiet =
            |f: &mut Follow, n: usize, to: usize| -> Vec<Option<usize>> { (0..n).map(|_| f.observe(to)).collect() };
        let mut f = Follow::new(2);
        assert_eq!(f.observe(2), None);
        assert_eq!(f.observe(1), Some(1), "a neighbour: down at once");
        assert_eq!(quiet(&mut f, RISE_WINDOWS - 1, 2), vec![None; RISE_WINDOWS - 1], "not yet back up");
        assert_eq!(f.observe(1), None, "the neighbour again: stays down, the wait starts over");
        assert_eq!(quiet(&mut f, RISE_WINDOWS - 1, 2), vec![None; RISE_WINDOWS - 1]);
        assert_eq!(f.observe(2), Some(2), "enough quiet windows in a row: up");
        assert_eq!(f.current, 2);
        // Four cores: down in steps as neighbours come; up to the lowest count of the quiet run.
        let mut f = Follow::new(4);
        assert_eq!(f.observe(3), Some(3));
        assert_eq!(f.observe(2), Some(2));
        assert_eq!(f.observe(4), None);
        assert_eq!(quiet(&mut f, RISE_WINDOWS - 2, 4), vec![None; RISE_WINDOWS - 2]);
        assert_eq!(f.observe(3), Some(3), "a run of windows above 2 rises to the lowest of them");
        assert_eq!(f.current, 3);
        // A bursty neighbour (the GPU host's pattern: busy every other window) holds the count
        // down instead of moving it twice a second.
        let mut f = Follow::new(16);
        let changes = (0..40).filter_map(|i| f.observe(if i % 2 == 0 { 15 } else { 16 })).count();
        assert_eq!((changes, f.current), (1, 15));
    }

    const STAT: &str = "cpu  300 0 100 1000 20 0 5 0 0 0\n\
        cpu0 200 0 50 400 10 0 5 0 0 0\n\
        cpu1 100 0 50 600 10 0 0 0 0 0\n\
        intr 12345\n";

    #[test]
    fn proc_stat_sums_the_cores_of_the_mask() {
        assert_eq!(parse_proc_stat(STAT, &[0, 1]), Some((1425, 405)));
        assert_eq!(parse_proc_stat(STAT, &[1]), Some((760, 150)));
        assert_eq!(parse_proc_stat(STAT, &[0, 7]), None, "a core of the mask is missing");
        assert_eq!(parse_proc_stat("cpu0 1 2\n", &[0]), None);
    }

    #[test]
    fn self_stat_reads_user_and_system_time_past_odd_names() {
        let s = "4242 (tandem (x) y) R 1 2 3 4 5 6 7 8 9 10 111 222 0 0 20 0 3 0 99";
        assert_eq!(parse_self_stat(s), Some(333));
        assert_eq!(parse_self_stat("garbage"), None);
    }

    #[test]
    fn free_cores_leave_out_our_own_time() {
        let a = CpuSample { total: 0, busy: 0, own: 0 };
        // 2 cores for 100 ticks each: another process kept one busy, we used the other.
        let busy_beside = CpuSample { total: 200, busy: 200, own: 100 };
        assert_eq!(free_cores(a, busy_beside, 2), Some(1.0));
        assert_eq!(threads_for(1.0, 2), 1);
        // A busy loop sharing a core with one of two workers: it gets half of that core.
        let sharing = CpuSample { total: 200, busy: 200, own: 150 };
        assert_eq!(free_cores(a, sharing, 2), Some(1.5));
        assert_eq!(threads_for(1.5, 2), 1);
        // Background noise (a fifth of a core) keeps both threads.
        assert_eq!(threads_for(1.8, 2), 2);
        assert_eq!(threads_for(6.9, 8), 7);
        // Only we were busy: both cores are free.
        let alone = CpuSample { total: 200, busy: 180, own: 180 };
        assert_eq!(free_cores(a, alone, 2), Some(2.0));
        assert_eq!(threads_for(2.0, 2), 2);
        // Everything busy with others: still one thread.
        let full = CpuSample { total: 200, busy: 200, own: 0 };
        assert_eq!(threads_for(free_cores(a, full, 2).unwrap(), 2), 1);
        assert_eq!(free_cores(a, a, 2), None);
    }
}
