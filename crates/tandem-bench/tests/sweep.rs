//! The sweep: cells that cannot fit (or cannot run) are skipped with a reason and never
//! launched; finished cells are not run again (resume); the memory estimate is within 20% of
//! the peak measured in a child process for the fixture models.

use std::path::{Path, PathBuf};

use tandem_bench::sweep::{
    estimate, grid, run_sweep, CellLauncher, CellMeasurement, CellOutcome, CellSpec, ChildLauncher, GridAxes,
    SweepOptions,
};

fn repo(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").join(rel)
}

fn spec(model: &Path) -> CellSpec {
    CellSpec {
        model: model.display().to_string(),
        weights: "native".into(),
        kv: "f32".into(),
        prefill_chunk: 64,
        prompt_lens: vec![64, 160],
        gen_tokens: 16,
        ppl_tokens: 128,
        ppl_window: 32,
        threads: 2,
        kv_block_size: 16,
    }
}

/// Records which cells it was asked to run.
#[derive(Default)]
struct Recorder {
    ran: Vec<String>,
}

impl CellLauncher for Recorder {
    fn probe(&mut self) -> anyhow::Result<u64> {
        Ok(10 << 20)
    }
    fn run(&mut self, spec: &CellSpec) -> anyhow::Result<CellMeasurement> {
        self.ran.push(spec.id());
        Ok(CellMeasurement { peak_rss_bytes: 1, ..Default::default() })
    }
}

#[test]
fn over_budget_and_unsupported_cells_are_skipped_not_attempted() {
    let model = repo("fixtures/tiny/llama");
    let mut summary = tandem_model::loader::summarize(&model).unwrap();
    // A model with a large KV per token makes long prompts expensive.
    summary.num_layers = 32;
    summary.num_kv_heads = 8;
    summary.head_dim = 128;
    summary.context_length = 1 << 20;
    let small = spec(&model);
    let huge = CellSpec { prompt_lens: vec![200_000], ..small.clone() };
    let est_small = estimate(&summary, &small, 10 << 20).total_bytes;
    let est_huge = estimate(&summary, &huge, 10 << 20).total_bytes;
    assert!(est_huge > 10 * est_small);
    let dir = tempfile::tempdir().unwrap();
    let opts = SweepOptions {
        results_path: dir.path().join("sweep.json"),
        budget_bytes: (est_small + est_huge) / 2,
        headroom: 1.0,
        summary,
        progress: false,
    };
    let axes = GridAxes {
        weights: vec!["native".into(), "q4_0".into(), "fp3".into()],
        kv: vec!["f32".into()],
        chunks: vec![64],
    };
    let mut cells = grid(&axes, &small);
    cells.push(CellSpec { prefill_chunk: 128, ..huge });
    let mut rec = Recorder::default();
    let res = run_sweep(&cells, &opts, &mut rec).unwrap();
    assert_eq!(rec.ran, vec!["weights=native,kv=f32,chunk=64".to_string(), "weights=q4_0,kv=f32,chunk=64".to_string()]);
    let outcome = |id: &str| res.get(id).unwrap().outcome.clone();
    assert!(matches!(outcome("weights=native,kv=f32,chunk=64"), CellOutcome::Done(_)));
    assert!(matches!(outcome("weights=q4_0,kv=f32,chunk=64"), CellOutcome::Done(_)));
    match outcome("weights=fp3,kv=f32,chunk=64") {
        CellOutcome::Skipped { reason } => assert!(reason.contains("unknown weight precision"), "{reason}"),
        o => panic!("{o:?}"),
    }
    match outcome("weights=native,kv=f32,chunk=128") {
        CellOutcome::Skipped { reason } => assert!(reason.contains("exceeds the memory budget of"), "{reason}"),
        o => panic!("{o:?}"),
    }
    // Resume: the done cell is not run again; the skipped ones are re-evaluated and skipped.
    let mut again = Recorder::default();
    let res2 = run_sweep(&cells, &opts, &mut again).unwrap();
    assert!(again.ran.is_empty(), "{:?}", again.ran);
    assert_eq!(res2.cells.len(), 4);
    // The report renders skipped cells with their reasons.
    let md = tandem_bench::report::sweep_markdown(&res2);
    assert!(md.contains("exceeds the memory budget") && md.contains("unknown weight precision"), "{md}");
    tandem_bench::report::write_sweep_report(dir.path(), &res2).unwrap();
    assert!(dir.path().join("sweep_memory.png").exists() && dir.path().join("sweep_memory.svg").exists());
}

#[test]
fn memory_estimate_within_20_percent_of_measured_peak() {
    let mut launcher = ChildLauncher {
        program: PathBuf::from(env!("CARGO_BIN_EXE_tandem-bench-cell")),
        args: Vec::new(),
        env: vec![("RAYON_NUM_THREADS".into(), "2".into())],
    };
    let baseline = launcher.probe().unwrap();
    assert!(baseline > 0, "probe measured no memory");
    // (model, weights): the checkpoints' own, and quantised at load.
    let mut models: Vec<(PathBuf, &str)> = vec![
        (repo("fixtures/tiny/llama"), "native"),
        (repo("fixtures/tiny/qwen3"), "native"),
        (repo("fixtures/hybrid/qwen3_5"), "native"),
        (repo("fixtures/hybrid/qwen3_5"), "q8_0"),
        (repo("fixtures/tiny/llama"), "q4_0"),
    ];
    let smollm2 = repo("models/smollm2-135m.gguf");
    if smollm2.exists() {
        models.push((smollm2.clone(), "native"));
        models.push((smollm2, "q8_0"));
    }
    let mut ppl = std::collections::HashMap::new();
    for (model, weights) in models {
        let summary = tandem_model::loader::summarize(&model).unwrap();
        let s = CellSpec { weights: weights.into(), ..spec(&model) };
        let est = estimate(&summary, &s, baseline);
        let m = launcher.run(&s).unwrap_or_else(|e| panic!("{}: {e:#}", model.display()));
        let ratio = est.total_bytes as f64 / m.peak_rss_bytes as f64;
        eprintln!(
            "{}: estimate {:.1} MiB, measured peak {:.1} MiB (ratio {ratio:.3}; {est:?}); ppl {:?}; runs {:?}",
            model.display(),
            est.total_bytes as f64 / 1048576.0,
            m.peak_rss_bytes as f64 / 1048576.0,
            m.perplexity,
            m.runs
        );
        assert!((0.8..=1.2).contains(&ratio), "{} {weights}: ratio {ratio}", model.display());
        assert!(m.perplexity.is_some_and(|p| p.is_finite() && p > 1.0));
        // A cell quantised at load measures other weights than the checkpoint's own.
        match ppl.get(&model) {
            Some(native) => assert_ne!(Some(*native), m.perplexity, "{} {weights}", model.display()),
            None => {
                ppl.insert(model.clone(), m.perplexity.unwrap_or_default());
            }
        }
        assert!(m.runs.iter().all(|r| r.skipped.is_none() && r.decode_tok_s > 0.0 && r.ttft_s > 0.0));
    }
}
