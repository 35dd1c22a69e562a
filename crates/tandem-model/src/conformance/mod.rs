//! Conformance of a device against the CPU references: every op tandem runs (paged attention
//! in each KV format, the GDN conv and delta rule with verify lanes, norms, dense and
//! quantised matmuls, KV writes) over several shapes, and then the fixture models end to end.
//! `tandem check-device` prints the result as a table and fails on any failed check, like
//! llama.cpp's `test-backend-ops`; the CPU itself passes too (its ops are compared with the
//! plain references), which is what CI checks.
//!
//! A check compares the device's output with the CPU reference (`max |a - b| / max |b|`
//! within `tol`), or requires bit equality (`exact`: row invariance, the property lossless
//! speculation rests on). `info` checks report without failing (a property of candle's
//! kernels we do not control yet, such as row invariance of its quantised CUDA matmuls).

use std::time::Instant;

use candle_core::{Device, Tensor};

use crate::error::Result;

pub mod attn_batch;
pub mod attn_glue;
pub mod decode_graph;
pub mod fused;
pub mod gdn_batch;
pub mod gdn_step;
pub mod gguf;
pub mod kq_chain;
pub mod models;
pub mod moe;
pub mod norm;
pub mod ops;
pub mod quant;
pub mod rope;
pub mod sampling;

/// How a check is judged.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Judge {
    /// Relative error at most this.
    Tolerance(f32),
    /// Bit for bit.
    Exact,
    /// Reported, never failing.
    Info,
}

/// One row of the table.
#[derive(Debug, Clone)]
pub struct Check {
    pub op: String,
    pub shape: String,
    pub format: String,
    /// `max |a - b| / max |b|` (0 for bit-identical outputs).
    pub max_rel_err: f32,
    pub judge: Judge,
    pub pass: bool,
    /// Wall time of the device run (synchronised), milliseconds.
    pub ms: f64,
    /// Why a check could not run, or what an `info` row means.
    pub note: String,
}

impl Check {
    pub fn new(op: &str, shape: String, format: &str, err: f32, judge: Judge, ms: f64) -> Self {
        let pass = match judge {
            Judge::Tolerance(t) => err.is_finite() && err <= t,
            Judge::Exact => err == 0.0,
            Judge::Info => true,
        };
        Self { op: op.into(), shape, format: format.into(), max_rel_err: err, judge, pass, ms, note: String::new() }
    }

    /// A check that could not run: a failure carrying the error.
    pub fn error(op: &str, shape: String, format: &str, e: impl std::fmt::Display) -> Self {
        Self {
            op: op.into(),
            shape,
            format: format.into(),
            max_rel_err: f32::NAN,
            judge: Judge::Exact,
            pass: false,
            ms: 0.0,
            note: e.to_string(),
        }
    }

    pub fn with_note(mut self, note: impl Into<String>) -> Self {
        self.note = note.into();
        self
    }
}

/// `max |a - b| / max |b|` over two tensors of the same size (any devices, any float dtype).
pub fn rel_err(a: &Tensor, b: &Tensor) -> Result<f32> {
    let (a, b) = (host_f32(a)?, host_f32(b)?);
    Ok(rel_err_slices(&a, &b))
}

pub fn rel_err_slices(a: &[f32], b: &[f32]) -> f32 {
    if a.len() != b.len() {
        return f32::INFINITY;
    }
    let diff =
        a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0f32, |m, d| if d.is_nan() { f32::NAN } else { m.max(d) });
    diff / b.iter().map(|y| y.abs()).fold(0f32, f32::max).max(1e-6)
}

/// 0 when bit-identical, else the relative error (so an `Exact` check shows how far off).
pub fn bits_err(a: &Tensor, b: &Tensor) -> Result<f32> {
    let (x, y) = (host_f32(a)?, host_f32(b)?);
    if x.len() == y.len() && x.iter().zip(&y).all(|(p, q)| p.to_bits() == q.to_bits()) {
        return Ok(0.0);
    }
    Ok(rel_err_slices(&x, &y).max(f32::MIN_POSITIVE))
}

pub fn host_f32(t: &Tensor) -> Result<Vec<f32>> {
    Ok(t.to_dtype(candle_core::DType::F32)?.flatten_all()?.to_vec1::<f32>()?)
}

/// Runs `f` on `dev` and returns its result and the synchronised wall time in ms.
pub fn timed<T>(dev: &Device, f: impl FnOnce() -> Result<T>) -> Result<(T, f64)> {
    dev.synchronize()?;
    let t0 = Instant::now();
    let out = f()?;
    dev.synchronize()?;
    Ok((out, t0.elapsed().as_secs_f64() * 1e3))
}

/// Deterministic pseudo-random values in [-1, 1) (xorshift).
pub struct Rng(pub u64);

impl Rng {
    pub fn next_f32(&mut self) -> f32 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        ((self.0 >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }
    pub fn vec(&mut self, n: usize) -> Vec<f32> {
        (0..n).map(|_| self.next_f32()).collect()
    }
}

/// Every op check on `dev`, then the fixture models under `fixtures` (the repository's
/// `fixtures/` folder), when it exists.
pub fn run_all(dev: &Device, fixtures: Option<&std::path::Path>) -> Vec<Check> {
    run_selected(dev, fixtures, &[])
}

/// The check groups, in the order they run (`ops/...` are the op families of `ops.rs`).
pub const GROUPS: [&str; 20] = [
    "ops/paged_attention",
    "ops/kv_encode",
    "ops/gdn_conv",
    "ops/gdn_delta",
    "ops/norms",
    "ops/dense",
    "ops/quantised",
    "ops/embedding",
    "gdn_step",
    "gdn_batch",
    "attn_batch",
    "attn_glue",
    "rope",
    "moe",
    "fused",
    "norm",
    "sampling",
    "decode_graph",
    "gguf",
    "models",
];

/// Whether group `name` (one of [`GROUPS`]) runs under the filter `only`: every group when it
/// is empty, else those whose name contains one of its entries.
pub fn selected(name: &str, only: &[String]) -> bool {
    only.is_empty() || only.iter().any(|o| name.contains(o.as_str()))
}

/// [`run_all`] for the groups `only` selects ([`selected`]; `tandem check-device --only`: a
/// kernel's own checks in seconds where a device's time is short). The models run only with
/// `fixtures`.
pub fn run_selected(dev: &Device, fixtures: Option<&std::path::Path>, only: &[String]) -> Vec<Check> {
    let on = |g: &str| selected(g, only);
    let mut checks = ops::run_selected(dev, &on);
    let groups: [(&str, &dyn Fn() -> Vec<Check>); 11] = [
        ("gdn_step", &|| gdn_step::run(dev)),
        ("gdn_batch", &|| gdn_batch::run(dev)),
        ("attn_batch", &|| attn_batch::run(dev)),
        ("attn_glue", &|| attn_glue::run(dev)),
        ("rope", &|| rope::run(dev)),
        ("moe", &|| moe::run(dev)),
        ("fused", &|| fused::run(dev)),
        ("norm", &|| norm::run(dev)),
        ("sampling", &|| sampling::run(dev)),
        ("decode_graph", &|| decode_graph::run(dev, fixtures)),
        ("gguf", &|| gguf::run(dev)),
    ];
    for (name, run) in groups {
        if on(name) {
            checks.extend(run());
        }
    }
    if let Some(root) = fixtures {
        if on("models") {
            checks.extend(models::run(dev, root));
        }
    }
    checks
}

/// The checks as a Markdown table.
pub fn table(checks: &[Check]) -> String {
    let mut s = String::from(
        "| op | shape | format | max rel err | judged | result | ms | note |\n|---|---|---|---|---|---|---|---|\n",
    );
    for c in checks {
        let judged = match c.judge {
            Judge::Tolerance(t) => format!("<= {t:.0e}"),
            Judge::Exact => "exact".into(),
            Judge::Info => "info".into(),
        };
        let result = if !c.pass {
            "FAIL"
        } else if c.judge == Judge::Info {
            if c.max_rel_err == 0.0 {
                "exact"
            } else {
                "differs"
            }
        } else {
            "pass"
        };
        s.push_str(&format!(
            "| {} | {} | {} | {:.2e} | {} | {} | {:.3} | {} |\n",
            c.op, c.shape, c.format, c.max_rel_err, judged, result, c.ms, c.note
        ));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The CPU conforms to its own references (op suite and the fixture models).
    #[test]
    fn cpu_passes_every_check() {
        let root = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fixtures");
        let checks = run_all(&Device::Cpu, Some(&root));
        let failed: Vec<_> = checks.iter().filter(|c| !c.pass).collect();
        assert!(failed.is_empty(), "failed checks:\n{}", table(&checks));
        assert!(checks.len() > 40, "only {} checks ran", checks.len());
        assert!(checks.iter().any(|c| c.op.starts_with("model")), "no model checks ran");
    }

    #[test]
    fn judges_fail_what_they_should() {
        assert!(!Check::new("x", "s".into(), "f", 1e-3, Judge::Tolerance(1e-4), 0.0).pass);
        assert!(!Check::new("x", "s".into(), "f", f32::NAN, Judge::Tolerance(1e-4), 0.0).pass);
        assert!(!Check::new("x", "s".into(), "f", 1e-9, Judge::Exact, 0.0).pass);
        assert!(Check::new("x", "s".into(), "f", 0.0, Judge::Exact, 0.0).pass);
        assert!(Check::new("x", "s".into(), "f", 0.5, Judge::Info, 0.0).pass);
        let a = Tensor::new(&[1f32, 2.0], &Device::Cpu).unwrap();
        let b = Tensor::new(&[1f32, 2.0000002], &Device::Cpu).unwrap();
        assert!(bits_err(&a, &b).unwrap() > 0.0);
        assert_eq!(bits_err(&a, &a).unwrap(), 0.0);
    }
}

#[cfg(test)]
mod selection_tests {
    use super::{run_selected, selected, GROUPS};
    use candle_core::Device;

    #[test]
    fn the_filter_picks_groups_by_substring() {
        let only = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert!(GROUPS.iter().all(|g| selected(g, &[])));
        let attn: Vec<_> = GROUPS.iter().filter(|g| selected(g, &only(&["attn"]))).collect();
        assert_eq!(attn, [&"attn_batch", &"attn_glue"]);
        let ops = GROUPS.iter().filter(|g| selected(g, &only(&["ops/"]))).count();
        assert_eq!(ops, 8);
        assert!(!selected("models", &only(&["paged_attention", "norm"])));
        assert!(selected("norm", &only(&["paged_attention", "norm"])));
    }

    #[test]
    fn a_selected_group_runs_alone() {
        // The CPU's own checks (every op against its reference on the CPU): only the RoPE
        // group's rows come back.
        let checks = run_selected(&Device::Cpu, None, &["rope".to_string()]);
        assert!(!checks.is_empty());
        assert!(checks.iter().all(|c| c.op.contains("rope")), "{:?}", checks.iter().map(|c| &c.op).collect::<Vec<_>>());
        assert!(checks.iter().all(|c| c.pass));
    }
}
