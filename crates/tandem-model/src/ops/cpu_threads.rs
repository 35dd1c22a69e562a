//! How many threads tandem's CPU kernels split an op over: the worker pool's size (candle's
//! barrier pool, sized once at its first use), capped by a limit the process may change while
//! it runs. `tandem_engine::threads::watch` lowers it when another process starts keeping a
//! core busy (every op would otherwise wait for the worker that shares that core) and raises
//! it again when the core is free. Results never depend on it: every kernel gives the same
//! bits for any split of its work.

use std::sync::atomic::{AtomicUsize, Ordering};

static LIMIT: AtomicUsize = AtomicUsize::new(usize::MAX);

/// Caps the threads of every later op at `n` (at least one).
pub fn set_limit(n: usize) {
    LIMIT.store(n.max(1), Ordering::Relaxed);
}

/// The current cap (`usize::MAX`: none).
pub fn limit() -> usize {
    LIMIT.load(Ordering::Relaxed)
}

/// Threads an op may use now: the pool's workers and the calling thread, within the limit.
pub fn threads() -> usize {
    (candle_core::utils::barrier_pool().n_workers() + 1).min(limit())
}

/// Runs `f` over `0..n_items` in chunks on the worker pool, or all on this thread when the
/// limit allows one thread (the pool's `execute_chunked` wakes and waits for every worker).
pub fn execute_chunked<F: Fn(std::ops::Range<usize>) + Sync>(n_items: usize, f: F) {
    let pool = candle_core::utils::barrier_pool();
    if pool.n_workers() == 0 || limit() <= 1 {
        if n_items > 0 {
            f(0..n_items);
        }
        return;
    }
    pool.execute_chunked(n_items, f);
}

/// Runs `f(i, item)` for every item on the worker pool, each item whole in one task (items
/// such as disjoint `&mut` pieces of one buffer: a loop that rayon would split, kept on the
/// pool every other op of a step uses, so that the two pools do not fight for the cores).
pub fn for_each_item<I: Send>(items: Vec<I>, f: impl Fn(usize, I) + Sync) {
    // Each slot is taken once by the one task its index falls to: the locks never wait.
    let slots: Vec<std::sync::Mutex<Option<I>>> = items.into_iter().map(|i| std::sync::Mutex::new(Some(i))).collect();
    execute_chunked(slots.len(), |range| {
        for i in range {
            let item = slots[i].lock().unwrap_or_else(|e| e.into_inner()).take();
            if let Some(item) = item {
                f(i, item);
            }
        }
    });
}

/// Runs `f` (a forward pass on `device`) with rayon's parallel loops on one thread when the
/// limit is one (a pool of one thread, made once), else as it is: a loop split over rayon's
/// workers would wait for the one sharing a busy core as the barrier pool's ops would. A GPU's
/// forward always stays on the calling thread, where its context is.
pub fn within_limit<R: Send>(device: &candle_core::Device, f: impl FnOnce() -> R + Send) -> R {
    if !device.is_cpu() || limit() > 1 || rayon::current_num_threads() <= 1 {
        return f();
    }
    static ONE: std::sync::OnceLock<Option<rayon::ThreadPool>> = std::sync::OnceLock::new();
    let one = ONE.get_or_init(|| {
        rayon::ThreadPoolBuilder::new().num_threads(1).thread_name(|_| "tandem-one".into()).build().ok()
    });
    match one {
        Some(pool) => pool.install(f),
        None => f(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_item_runs_once_with_its_index() {
        let mut data = vec![0u32; 40];
        let items: Vec<&mut [u32]> = data.chunks_mut(4).collect();
        for_each_item(items, |i, piece| piece.iter_mut().for_each(|x| *x += i as u32 + 1));
        let want: Vec<u32> = (0..40).map(|j| j / 4 + 1).collect();
        assert_eq!(data, want);
        for_each_item(Vec::<&mut [u32]>::new(), |_, _| unreachable!("no items"));
    }

    #[test]
    fn a_limit_of_one_runs_every_chunk_on_the_calling_thread() {
        let before = limit();
        set_limit(1);
        assert_eq!(threads(), 1);
        let me = std::thread::current().id();
        let seen = std::sync::Mutex::new(Vec::new());
        execute_chunked(10, |r| seen.lock().unwrap().push((r, std::thread::current().id())));
        let seen = seen.into_inner().unwrap();
        assert_eq!(seen, vec![(0..10, me)]);
        set_limit(0);
        assert_eq!(limit(), 1, "the limit is at least one thread");
        let inner = within_limit(&candle_core::Device::Cpu, rayon::current_num_threads);
        assert_eq!(inner, 1, "rayon loops run on one thread under a limit of one");
        LIMIT.store(before, Ordering::Relaxed);
    }
}
