//! How many CPU threads a step runs on, chosen from the cores actually free.
//!
//! CPU kernels split every op across rayon's workers and wait for the slowest. When another
//! process keeps one of our cores busy, the worker sharing it runs only in the scheduler's
//! time slices and every op waits for it: on the 2-core machine decode fell from 42-47 tok/s
//! (one thread) to 5 tok/s with both. With the thread count left to us (`-t 0`, no
//! `RAYON_NUM_THREADS`), the [`ThreadGovernor`] reads at most once a second how busy the cores
//! this process may run on were with *other* processes (`/proc/stat` for the cores of our
//! affinity mask, minus our own time from `/proc/self/stat`) and runs each step on a pool of
//! about as many threads as cores were free, never fewer than one. Results do not depend on it:
//! every kernel gives the same bits for any thread split. Elsewhere than Linux, and when
//! `RAYON_NUM_THREADS` fixes the count, every step runs on rayon's global pool;
//! `EngineConfig::threads` = N runs every step on a pool of N.

use std::sync::Arc;
use std::time::{Duration, Instant};

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

/// The thread count for `free` free cores out of `cores`: rounded, at least one.
pub fn threads_for(free: f64, cores: usize) -> usize {
    (free.round() as usize).clamp(1, cores.max(1))
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

/// Picks the pool each step runs on; see the module docs.
pub struct ThreadGovernor {
    /// The cores of our affinity mask; empty when the governor is off.
    cpus: Vec<usize>,
    last: Option<(Instant, CpuSample)>,
    threads: usize,
    /// Pools of 1 .. cores - 1 threads, made when first needed (the full count is rayon's
    /// global pool).
    pools: Vec<Option<Arc<rayon::ThreadPool>>>,
    /// Every step on a pool of `threads` threads (`EngineConfig::threads`).
    fixed: bool,
}

const PERIOD: Duration = Duration::from_secs(1);

impl ThreadGovernor {
    /// For a CPU model with `fixed` threads (`EngineConfig::threads`): 0 follows the free
    /// cores when nobody fixed the count (`RAYON_NUM_THREADS`) and the global pool has a
    /// worker per core of our mask (rayon's pool otherwise); N runs every step on N threads.
    pub fn new(cpu_model: bool, fixed: usize) -> Self {
        let n = rayon::current_num_threads();
        if cpu_model && fixed > 0 {
            // A constant choice: a pool of `fixed` threads (rayon's own when it is that size).
            return Self { cpus: Vec::new(), last: None, threads: fixed, pools: vec![None; fixed + 1], fixed: fixed != n };
        }
        let env_fixed = std::env::var_os("RAYON_NUM_THREADS").is_some();
        #[cfg(target_os = "linux")]
        let cpus = if cpu_model && !env_fixed { affinity() } else { Vec::new() };
        #[cfg(not(target_os = "linux"))]
        let cpus: Vec<usize> = {
            let _ = (cpu_model, env_fixed);
            Vec::new()
        };
        let cpus = if cpus.len() > 1 && n == cpus.len() { cpus } else { Vec::new() };
        Self { pools: vec![None; cpus.len()], cpus, last: None, threads: n, fixed: false }
    }

    /// A governor that leaves every step on rayon's global pool.
    pub fn off() -> Self {
        Self { cpus: Vec::new(), last: None, threads: rayon::current_num_threads(), pools: Vec::new(), fixed: false }
    }

    /// Threads the next step runs on.
    pub fn threads(&self) -> usize {
        self.threads
    }

    /// Runs `f` (a step) on a pool sized from the cores free over the last second.
    pub fn install<R: Send>(&mut self, f: impl FnOnce() -> R + Send) -> R {
        if !self.fixed {
            if self.cpus.is_empty() {
                return f();
            }
            self.update();
            if self.threads >= self.cpus.len() {
                return f();
            }
        }
        let n = self.threads;
        let pool = match &self.pools[n] {
            Some(p) => p.clone(),
            None => match rayon::ThreadPoolBuilder::new()
                .num_threads(n)
                .thread_name(|i| format!("tandem-cpu-{i}"))
                .build()
            {
                Ok(p) => {
                    let p = Arc::new(p);
                    self.pools[n] = Some(p.clone());
                    p
                }
                Err(e) => {
                    tracing::warn!("cannot start a {n}-thread pool ({e}); staying on rayon's pool");
                    self.cpus.clear();
                    self.fixed = false;
                    return f();
                }
            },
        };
        pool.install(f)
    }

    fn update(&mut self) {
        #[cfg(target_os = "linux")]
        {
            let now = Instant::now();
            if self.last.is_some_and(|(t, _)| now.duration_since(t) < PERIOD) {
                return;
            }
            let Some(s) = sample(&self.cpus) else {
                self.cpus.clear();
                return;
            };
            if let Some((_, prev)) = self.last {
                if let Some(free) = free_cores(prev, s, self.cpus.len()) {
                    let n = threads_for(free, self.cpus.len());
                    if n != self.threads {
                        tracing::debug!(free, threads = n, "CPU threads follow the free cores");
                    }
                    self.threads = n;
                }
            }
            self.last = Some((now, s));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
