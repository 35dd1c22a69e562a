//! The prefix cache's disk tier: after a restart a request is served from disk and gives the
//! same greedy tokens and log-probabilities (1e-4) as a cold run, on a Llama-family fixture, the
//! sliding-window fixture and the three hybrid fixtures (hybrids and sliding-window models
//! resume from a persisted checkpoint, which carries the window's keys and values), with hits that
//! end inside, at and past a checkpoint; damaged, renamed and foreign entries are refused,
//! counted and never change an output; the budget holds; a disk that refuses writes turns the
//! tier off and nothing else; concurrent requests sharing a prefix while the tier writes all
//! match; nothing leaks.

mod common;

use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use common::*;
use tandem_engine::*;

const MODELS: [&str; 5] = ["tiny/qwen3", "tiny/gemma3", "hybrid/qwen3_5", "hybrid/qwen3_next", "hybrid/qwen3_5_moe"];

/// The name `--exact` takes for `test` in this binary (the device suite nests the file in a module).
fn exact(test: &str) -> String {
    match module_path!().split_once("::") {
        Some((_, m)) => format!("{m}::{test}"),
        None => test.to_string(),
    }
}

fn with_disk(dir: &Path, budget: u64) -> EngineConfig {
    EngineConfig {
        checkpoint_interval: 32,
        disk_cache: Some(DiskCacheConfig { dir: dir.to_path_buf(), budget }),
        ..Default::default()
    }
}

/// Waits until `n` requests finished and the writer has nothing left to write.
fn settle(e: &EngineHandle, n: usize) {
    let s = e.stats();
    let t = Instant::now();
    while s.finished.load(Ordering::Relaxed) < n || s.disk.pending.load(Ordering::Relaxed) > 0 {
        assert!(t.elapsed() < Duration::from_secs(60), "the disk tier did not settle");
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Every entry file under a cache root.
fn entries(root: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else if p.extension().is_some_and(|x| x == "kvb" || x == "ckp") {
                out.push(p);
            }
        }
    }
    out.sort();
    out
}

/// The prompts of the second life: the first one again (its hit ends at the checkpoint before
/// its end), one that goes past it, and one that diverges between two checkpoints.
fn second_prompts(p: &[u32]) -> Vec<Vec<u32>> {
    let mut diverge = p[..75].to_vec();
    diverge.push(p[75] ^ 1);
    diverge.extend_from_slice(&p[76..90]);
    vec![p[..100].to_vec(), p[..140].to_vec(), diverge]
}

#[test]
fn a_restart_is_served_from_disk_and_changes_nothing() {
    for path in MODELS {
        let dir = tempfile::tempdir().unwrap();
        let p = long_prompt(path, 160);
        let cold = engine(path, cache_off());
        {
            let first = engine(path, with_disk(dir.path(), 1 << 30));
            let a = run(&first, greedy(p[..100].to_vec(), 6));
            assert_same(&a, &run(&cold, greedy(p[..100].to_vec(), 6)), &format!("{path}: first life"));
            settle(&first, 1);
            let d = &first.stats().disk;
            assert!(d.writes.load(Ordering::Relaxed) >= 6, "{path}: blocks written");
            assert_eq!(d.enabled.load(Ordering::Relaxed), 1);
            // Block copies handed to the writer (the CPU's read-back) were each released once
            // read back; none held, none dropped.
            assert_eq!(d.held_copy_bytes.load(Ordering::Relaxed), 0, "{path}: copies held");
            assert_eq!(d.dropped_writes.load(Ordering::Relaxed), 0, "{path}");
        }
        assert!(!entries(dir.path()).is_empty());
        // Each prompt right after a restart, so that its whole hit comes from disk.
        for (i, q) in second_prompts(&p).into_iter().enumerate() {
            let second = engine(path, with_disk(dir.path(), 1 << 30));
            let got = run(&second, greedy(q.clone(), 6));
            assert_same(&got, &run(&cold, greedy(q.clone(), 6)), &format!("{path}: after a restart, prompt {i}"));
            let want = [96, 96, 64][i];
            assert_eq!(got.usage.cached_tokens, want, "{path}: prompt {i}: {:?}", got.usage);
            assert_eq!(got.usage.disk_cached_tokens, want, "{path}: prompt {i} from disk");
            let d = &second.stats().disk;
            assert!(d.hit_tokens.load(Ordering::Relaxed) > 0 && d.read_bytes.load(Ordering::Relaxed) > 0);
            assert_eq!(d.rejected.load(Ordering::Relaxed), 0);
            settle(&second, 1);
            assert_no_leaks(&second);
        }
    }
}

#[test]
fn damaged_renamed_and_foreign_entries_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = "hybrid/qwen3_5";
    let p = long_prompt(path, 120);
    let want = run(&engine(path, cache_off()), greedy(p[..100].to_vec(), 6));
    {
        let e = engine(path, with_disk(dir.path(), 1 << 30));
        run(&e, greedy(p[..100].to_vec(), 6));
        settle(&e, 1);
    }
    let files = entries(dir.path());
    assert!(files.len() >= 7, "{} entries", files.len());
    // Damage every entry a different way: a flipped payload bit, a truncation, a header bit,
    // a swap of two files' contents (renamed), and a foreign model's file copied in.
    let foreign_dir = tempfile::tempdir().unwrap();
    {
        let e = engine("hybrid/qwen3_next", with_disk(foreign_dir.path(), 1 << 30));
        run(&e, greedy(long_prompt("hybrid/qwen3_next", 100), 2));
        settle(&e, 1);
    }
    let foreign = entries(foreign_dir.path());
    for (i, f) in files.iter().enumerate() {
        let mut bytes = std::fs::read(f).unwrap();
        match i % 5 {
            0 => {
                let n = bytes.len() - 1;
                bytes[n] ^= 1;
            }
            1 => bytes.truncate(bytes.len() / 2),
            2 => bytes[20] ^= 0x40,
            3 => bytes = std::fs::read(&files[(i + 1) % files.len()]).unwrap(),
            _ => bytes = std::fs::read(&foreign[i % foreign.len()]).unwrap(),
        }
        std::fs::write(f, bytes).unwrap();
    }
    let e = engine(path, with_disk(dir.path(), 1 << 30));
    let got = run(&e, greedy(p[..100].to_vec(), 6));
    assert_same(&got, &want, "after damage");
    let d = &e.stats().disk;
    assert!(d.rejected.load(Ordering::Relaxed) >= 1, "nothing was refused");
    // A refused entry is deleted: what is left (and what the request wrote anew) is valid.
    settle(&e, 1);
    drop(e);
    let e = engine(path, with_disk(dir.path(), 1 << 30));
    let again = run(&e, greedy(p[..100].to_vec(), 6));
    assert_same(&again, &want, "after the rewrite");
    assert!(again.usage.disk_cached_tokens > 0, "the rewritten entries serve the next start");
    assert_eq!(e.stats().disk.rejected.load(Ordering::Relaxed), 0);
}

#[test]
fn interrupted_writes_are_never_used() {
    let dir = tempfile::tempdir().unwrap();
    let path = "tiny/qwen3";
    let p = long_prompt(path, 100);
    let want = run(&engine(path, cache_off()), greedy(p.clone(), 4));
    {
        let e = engine(path, with_disk(dir.path(), 1 << 30));
        run(&e, greedy(p.clone(), 4));
        settle(&e, 1);
    }
    // What a process killed mid-write leaves: a partial file in tmp/ (the rename never
    // happened), and, had a crash torn a renamed file, a short entry.
    let files = entries(dir.path());
    let ns = files[0].parent().unwrap().parent().unwrap().to_path_buf();
    let partial = std::fs::read(&files[0]).unwrap();
    std::fs::write(ns.join("tmp").join("interrupted.kvb.1.1"), &partial[..partial.len() / 3]).unwrap();
    std::fs::write(&files[1], &partial[..partial.len() / 3]).unwrap();
    let e = engine(path, with_disk(dir.path(), 1 << 30));
    assert_eq!(std::fs::read_dir(ns.join("tmp")).unwrap().count(), 0, "leftover writes are removed at start");
    let got = run(&e, greedy(p.clone(), 4));
    assert_same(&got, &want, "after an interrupted write");
    assert!(e.stats().disk.rejected.load(Ordering::Relaxed) >= 1);
}

#[test]
fn the_budget_holds_and_least_recently_used_entries_go() {
    let dir = tempfile::tempdir().unwrap();
    let path = "tiny/qwen3";
    let budget = 40_000;
    let e = engine(path, with_disk(dir.path(), budget));
    for salt in 0..6u32 {
        let q: Vec<u32> = long_prompt(path, 80).iter().map(|t| (t + salt * 7) % 300 + 5).collect();
        run(&e, greedy(q, 2));
        settle(&e, salt as usize + 1);
        let on_disk: u64 = entries(dir.path()).iter().map(|f| f.metadata().unwrap().len()).sum();
        assert!(on_disk <= budget, "{on_disk} bytes on disk over a budget of {budget}");
        assert_eq!(on_disk, e.stats().disk.bytes.load(Ordering::Relaxed));
    }
    assert!(e.stats().disk.evictions.load(Ordering::Relaxed) > 0);
    assert_no_leaks(&e);
}

#[test]
fn concurrent_requests_sharing_a_prefix_while_the_tier_writes() {
    let dir = tempfile::tempdir().unwrap();
    for path in ["tiny/qwen3", "hybrid/qwen3_5"] {
        let p = long_prompt(path, 120);
        let cold = engine(path, cache_off());
        let e = engine(path, with_disk(&dir.path().join(path), 1 << 30));
        let prompts: Vec<Vec<u32>> = (0..8).map(|i| [&p[..96], &p[96 + i..100 + i]].concat()).collect();
        let rxs: Vec<_> = prompts.iter().map(|q| e.submit(greedy(q.clone(), 5)).unwrap()).collect();
        for (q, rx) in prompts.iter().zip(rxs) {
            assert_same(&collect(rx), &run(&cold, greedy(q.clone(), 5)), &format!("{path}: concurrent"));
        }
        settle(&e, 8);
        assert_no_leaks(&e);
        drop(e);
        // And the next life starts from what they wrote.
        let e = engine(path, with_disk(&dir.path().join(path), 1 << 30));
        let got = run(&e, greedy(prompts[3].clone(), 5));
        assert_same(&got, &run(&cold, greedy(prompts[3].clone(), 5)), &format!("{path}: restart"));
        assert!(got.usage.disk_cached_tokens > 0);
    }
}

/// Run in a child process (below): a file-size limit makes every write fail with EFBIG; the
/// tier must turn itself off with a warning and the requests go on.
#[test]
fn a_disk_that_refuses_writes_turns_the_tier_off() {
    if std::env::var_os("TANDEM_DISK_CHILD").is_some() {
        return child_with_a_file_size_limit();
    }
    let dir = tempfile::tempdir().unwrap();
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", &exact("a_disk_that_refuses_writes_turns_the_tier_off"), "--nocapture", "--test-threads=1"])
        .env("TANDEM_DISK_CHILD", dir.path())
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "the child failed:\n{text}");
    assert!(text.contains("child: tier off, outputs match"), "{text}");
}

fn child_with_a_file_size_limit() {
    let dir = PathBuf::from(std::env::var_os("TANDEM_DISK_CHILD").unwrap());
    // SAFETY: plain libc calls on this process; SIGXFSZ ignored so a write past the limit
    // fails with EFBIG instead of killing the process.
    unsafe {
        libc::signal(libc::SIGXFSZ, libc::SIG_IGN);
        let lim = libc::rlimit { rlim_cur: 1000, rlim_max: 1000 };
        assert_eq!(libc::setrlimit(libc::RLIMIT_FSIZE, &lim), 0);
    }
    let path = "hybrid/qwen3_5";
    let p = long_prompt(path, 100);
    let e = engine(path, with_disk(&dir, 1 << 30));
    let cold = engine(path, cache_off());
    for n in [100, 90] {
        let got = run(&e, greedy(p[..n].to_vec(), 4));
        assert_same(&got, &run(&cold, greedy(p[..n].to_vec(), 4)), "with a file-size limit");
    }
    let t = Instant::now();
    while e.stats().disk.enabled.load(Ordering::Relaxed) == 1 {
        assert!(t.elapsed() < Duration::from_secs(30), "the tier stayed on");
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(e.stats().disk.writes.load(Ordering::Relaxed), 0);
    assert_no_leaks(&e);
    println!("child: tier off, outputs match");
}

fn killed_child_prompt(path: &str, salt: u32) -> Vec<u32> {
    long_prompt(path, 110).iter().map(|t| (t + salt * 13) % 300 + 5).collect()
}

/// A server killed (SIGKILL) while its tier writes leaves nothing that is ever used wrongly:
/// the next start drops its unfinished writes and every output equals a cold run.
#[test]
fn a_process_killed_while_writing_leaves_nothing_wrong() {
    let path = "hybrid/qwen3_5";
    if let Some(dir) = std::env::var_os("TANDEM_DISK_KILL_CHILD") {
        let e = engine(path, with_disk(Path::new(&dir), 1 << 30));
        for salt in 0.. {
            run(&e, greedy(killed_child_prompt(path, salt % 20), 2));
        }
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    /// Kills the child however this test ends (it loops forever).
    struct Killed(std::process::Child);
    impl Drop for Killed {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let child = Killed(
        std::process::Command::new(std::env::current_exe().unwrap())
            .args(["--exact", &exact("a_process_killed_while_writing_leaves_nothing_wrong"), "--test-threads=1"])
            .env("TANDEM_DISK_KILL_CHILD", dir.path())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap(),
    );
    let t = Instant::now();
    while entries(dir.path()).len() < 30 {
        assert!(t.elapsed() < Duration::from_secs(120), "the child wrote fewer than 30 entries in 120 s");
        std::thread::sleep(Duration::from_millis(2));
    }
    drop(child); // SIGKILL, mid-write or not
    let e = engine(path, with_disk(dir.path(), 1 << 30));
    let cold = engine(path, cache_off());
    let mut from_disk = 0;
    for salt in 0..4 {
        let q = killed_child_prompt(path, salt);
        let got = run(&e, greedy(q.clone(), 2));
        assert_same(&got, &run(&cold, greedy(q, 2)), &format!("prompt {salt} after the kill"));
        from_disk += got.usage.disk_cached_tokens;
    }
    assert!(from_disk > 0, "what the child finished writing serves the next start");
}

/// Two servers on one directory at the same time: each writes and reads while the other does;
/// a third start then serves both servers' prompts from disk, unchanged.
#[test]
fn two_servers_sharing_a_directory_do_not_corrupt_it() {
    let dir = tempfile::tempdir().unwrap();
    let path = "hybrid/qwen3_5";
    let cold = engine(path, cache_off());
    let prompts: Vec<Vec<u32>> = (0..6u32).map(|s| killed_child_prompt(path, s + 30)).collect();
    let (a, b) = (engine(path, with_disk(dir.path(), 1 << 30)), engine(path, with_disk(dir.path(), 1 << 30)));
    let ra: Vec<_> = prompts.iter().map(|q| a.submit(greedy(q.clone(), 3)).unwrap()).collect();
    let rb: Vec<_> = prompts.iter().rev().map(|q| b.submit(greedy(q.clone(), 3)).unwrap()).collect();
    for (q, rx) in prompts.iter().zip(ra).chain(prompts.iter().rev().zip(rb)) {
        assert_same(&collect(rx), &run(&cold, greedy(q.clone(), 3)), "while sharing");
    }
    settle(&a, 6);
    settle(&b, 6);
    drop((a, b));
    let c = engine(path, with_disk(dir.path(), 1 << 30));
    for q in &prompts {
        let got = run(&c, greedy(q.clone(), 3));
        assert_same(&got, &run(&cold, greedy(q.clone(), 3)), "after sharing");
        assert!(got.usage.disk_cached_tokens > 0);
    }
    assert_eq!(c.stats().disk.rejected.load(Ordering::Relaxed), 0);
}

/// The three read-backs of published blocks (`TANDEM_DISK_READBACK`, each in a child process:
/// the variable is read once a process) write the same entries, byte for byte: block by block
/// on the engine's thread, copies read back there (the GPU's default), copies read back by the
/// writer's thread (the CPU's default; on another device only with
/// `TANDEM_TEST_WRITER_READBACK=1`: it wrote wrong bytes on CUDA with an earlier copy).
#[test]
fn the_read_back_paths_write_the_same_entries() {
    let path = "hybrid/qwen3_5";
    let prompt = long_prompt(path, 100);
    if let Some(dir) = std::env::var_os("TANDEM_DISK_READBACK_CHILD") {
        let e = engine(path, with_disk(Path::new(&dir), 1 << 30));
        run(&e, greedy(prompt.clone(), 4));
        settle(&e, 1);
        let d = &e.stats().disk;
        assert_eq!(d.dropped_writes.load(Ordering::Relaxed), 0);
        // The child ran the read-back it was given.
        let (copies, to_writer) = (d.block_copies.load(Ordering::Relaxed), d.writer_copies.load(Ordering::Relaxed));
        match std::env::var("TANDEM_DISK_READBACK").as_deref() {
            Ok("engine") => assert_eq!(copies, 0),
            Ok("batched") => assert!(copies > 0 && to_writer == 0, "{copies} copies, {to_writer} to the writer"),
            Ok("writer") => assert!(to_writer > 0 && to_writer == copies, "{copies} copies, {to_writer} to the writer"),
            other => panic!("read-back {other:?}"),
        }
        return;
    }
    let cpu = tandem_model::device::default_device().unwrap().is_cpu();
    let mut modes = vec!["engine", "batched"];
    if cpu || std::env::var("TANDEM_TEST_WRITER_READBACK").is_ok_and(|v| v == "1") {
        modes.push("writer");
    }
    let written: Vec<(&str, std::collections::BTreeMap<String, Vec<u8>>)> = modes
        .iter()
        .map(|&mode| {
            let dir = tempfile::tempdir().unwrap();
            let out = std::process::Command::new(std::env::current_exe().unwrap())
                .args(["--exact", &exact("the_read_back_paths_write_the_same_entries"), "--test-threads=1"])
                .env("TANDEM_DISK_READBACK_CHILD", dir.path())
                .env("TANDEM_DISK_READBACK", mode)
                .output()
                .unwrap();
            let text = String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
            assert!(out.status.success(), "the {mode} child failed:\n{text}");
            let files = entries(dir.path())
                .iter()
                .map(|f| (f.file_name().unwrap().to_string_lossy().into_owned(), std::fs::read(f).unwrap()))
                .collect();
            (mode, files)
        })
        .collect();
    let (_, reference) = &written[0];
    assert!(reference.len() >= 6, "{} entries", reference.len());
    for (mode, files) in &written[1..] {
        assert_eq!(reference.keys().collect::<Vec<_>>(), files.keys().collect::<Vec<_>>(), "{mode}");
        let differ: Vec<String> = reference
            .iter()
            .filter(|(name, bytes)| files.get(*name) != Some(bytes))
            .map(|(name, bytes)| {
                let other = &files[name];
                let at =
                    bytes.iter().zip(other.iter()).position(|(a, b)| a != b).unwrap_or(bytes.len().min(other.len()));
                format!("{name} ({} / {} bytes, first difference at {at})", bytes.len(), other.len())
            })
            .collect();
        assert!(differ.is_empty(), "{mode}: {} of {} entries differ: {differ:?}", differ.len(), reference.len());
    }
}

/// Blocks copied together on the process's device (`PagedKvStore::copy_blocks`) read back as
/// `read_block` reads them one by one, in every KV format: on the calling thread, and on
/// another thread (as the disk tier's writer does) while this one goes on writing other blocks.
#[test]
fn block_copies_read_back_as_block_reads() {
    use candle_core::{DType, Tensor};
    use tandem_model::kv::{KvDtype, LayerCacheSpec, PagedKvStore};
    let dev = tandem_model::device::default_device().unwrap();
    let spec = vec![
        LayerCacheSpec::Attention { kv_heads: 2, head_dim: 64 },
        LayerCacheSpec::Attention { kv_heads: 2, head_dim: 64 },
    ];
    let (blocks, bs) = (24usize, 16usize);
    for dtype in [KvDtype::F32, KvDtype::F16, KvDtype::Q8_0, KvDtype::Q4_0] {
        let store = std::sync::Arc::new(PagedKvStore::new(&spec, blocks, bs, dtype, &dev).unwrap());
        let rows = |seed: u64| {
            let n = 2 * 8 * bs * 64;
            let v: Vec<f32> =
                (0..n as u64).map(|i| (((i * 2654435761 + seed * 97) % 1000) as f32 - 500.0) / 250.0).collect();
            Tensor::from_vec(v, (2, 8 * bs, 64), &dev).unwrap().to_dtype(DType::F32).unwrap()
        };
        // Blocks 0..16 written by two 8-block sequences, in both layers.
        for (i, table) in [(0..8u32).collect::<Vec<_>>(), (8..16u32).rev().collect()].iter().enumerate() {
            for li in 0..2 {
                let (k, v) = (rows(10 * i as u64 + li as u64), rows(100 + 10 * i as u64 + li as u64));
                store.write(li, table, 0, &k, &v).unwrap();
            }
        }
        let want: Vec<Vec<u8>> = (0..16u32).map(|b| store.read_block(b).unwrap()).collect();
        let check = |got: Vec<Vec<u8>>, picks: &[u32], how: &str| {
            assert_eq!(got.len(), picks.len(), "{dtype} {how}");
            for (g, &b) in got.iter().zip(picks) {
                let w = &want[b as usize];
                let at = w.iter().zip(g.iter()).position(|(x, y)| x != y);
                assert!(
                    at.is_none() && g.len() == w.len(),
                    "{dtype} {how}: block {b} differs at byte {at:?} of {}",
                    w.len()
                );
            }
        };
        let picks: Vec<u32> = vec![3, 1, 2, 15, 8, 0, 9, 14];
        check(store.copy_blocks(&picks).unwrap().to_host().unwrap(), &picks, "same thread");
        // One block a commit is the common case while decoding.
        check(store.copy_blocks(&[9]).unwrap().to_host().unwrap(), &[9], "one block");
        // Copies are their own: overwriting the copied blocks (and others) after the copies
        // were queued changes neither, read back here or on another thread (the writer's).
        let (one, copy) = (store.copy_blocks(&[8]).unwrap(), store.copy_blocks(&picks).unwrap());
        let table: Vec<u32> = (8..16).collect();
        for li in 0..2 {
            store.write(li, &table, 0, &rows(700 + li as u64), &rows(800 + li as u64)).unwrap();
        }
        let reader = std::thread::spawn(move || {
            let _share = tandem_model::device::stream_share();
            let got = copy.to_host();
            drop(copy);
            got
        });
        for li in 0..2 {
            store.write(li, &(16..24u32).collect::<Vec<_>>(), 0, &rows(900), &rows(901)).unwrap();
        }
        check(reader.join().unwrap().unwrap(), &picks, "another thread");
        check(one.to_host().unwrap(), &[8], "one block, overwritten");
        // The overwrites did change the pool, so the checks above could fail.
        for b in [8u32, 9, 14, 15] {
            assert_ne!(store.read_block(b).unwrap(), want[b as usize], "{dtype}: block {b} not overwritten");
        }
    }
}
