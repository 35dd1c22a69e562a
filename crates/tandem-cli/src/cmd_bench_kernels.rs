//! `tandem bench kernels`: times the Gated DeltaNet kernels of one layer on realistic shapes
//! (the recurrent decode step, and the chunked and recurrent forms over a prefill) and relates
//! the time to what they must touch: bytes (the f32 state read and written once, plus q, k, v,
//! β, g in and the output out) and floating-point operations (as the kernels compute them).

use std::time::Instant;

use clap::Args;
use tandem_model::ops::gdn::{gated_delta_chunked, gated_delta_recurrent, l2_normalize, GdnDims, CHUNK};

#[derive(Args, Debug)]
pub struct KernelArgs {
    /// GDN value heads (= recurrent states per layer) to test, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "16,32")]
    pub heads: Vec<usize>,
    /// q/k heads.
    #[arg(long, default_value_t = 16)]
    pub key_heads: usize,
    /// Head dimension (dk = dv).
    #[arg(long, default_value_t = 128)]
    pub head_dim: usize,
    /// Prefill lengths to test, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "512,2048")]
    pub tokens: Vec<usize>,
    /// Minimum seconds spent on each measurement.
    #[arg(long, default_value_t = 1.0)]
    pub min_seconds: f64,
}

/// Deterministic pseudo-random numbers in [-1, 1).
struct Rng(u64);
impl Rng {
    fn vec(&mut self, n: usize) -> Vec<f32> {
        (0..n)
            .map(|_| {
                self.0 ^= self.0 << 13;
                self.0 ^= self.0 >> 7;
                self.0 ^= self.0 << 17;
                ((self.0 >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
            })
            .collect()
    }
}

struct Inputs {
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    beta: Vec<f32>,
    g: Vec<f32>,
}

fn inputs(t: usize, d: GdnDims) -> Inputs {
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let (mut q, mut k) = (rng.vec(t * d.nk * d.dk), rng.vec(t * d.nk * d.dk));
    l2_normalize(&mut q, d.dk, 1e-6);
    l2_normalize(&mut k, d.dk, 1e-6);
    let scale = (d.dk as f32).powf(-0.5);
    q.iter_mut().for_each(|x| *x *= scale);
    let beta = rng.vec(t * d.nv).iter().map(|x| 0.5 + 0.4 * x).collect();
    let g = rng.vec(t * d.nv).iter().map(|x| -0.05 - 0.04 * x).collect();
    Inputs { q, k, v: rng.vec(t * d.nv * d.dv), beta, g }
}

/// Bytes a kernel must move for `t` tokens: the state in and out once, inputs, outputs.
fn bytes(t: usize, d: GdnDims) -> f64 {
    let state = 2 * d.state_len();
    let io = t * (2 * d.nk * d.dk + 2 * d.nv * d.dv + 2 * d.nv);
    (4 * (state + io)) as f64
}

/// FLOPs of the recurrent form: per head and token, decay (dk·dv), Sᵀk (2 dk·dv), the rank-1
/// update and the output Sᵀq (4 dk·dv).
fn recurrent_flops(t: usize, d: GdnDims) -> f64 {
    (7 * t * d.nv * d.dk * d.dv) as f64
}

/// FLOPs of the chunked form as implemented: per head and chunk of c tokens, A = β K Kᵀ ⊙ Γ
/// (c² dk), T = (I + A)⁻¹ by substitution (c³/3), U and W (c² (dk + dv)), W S, Q S and the
/// state update (6 c dk dv), the intra-chunk Q Kᵀ and its product with V' (c² (dk + dv)).
fn chunked_flops(t: usize, d: GdnDims) -> f64 {
    let (dk, dv) = (d.dk as f64, d.dv as f64);
    let mut f = 0.0;
    let mut left = t;
    while left > 0 {
        let c = left.min(CHUNK) as f64;
        f += c * (c - 1.0) * dk + c * c * c / 3.0 + 2.0 * c * (c + 1.0) * (dk + dv) + 6.0 * c * dk * dv + dk * dv;
        left -= left.min(CHUNK);
    }
    f * d.nv as f64
}

/// Mean seconds per call of `f`, repeated for at least `min_s` seconds (and 3 calls).
fn time(min_s: f64, mut f: impl FnMut()) -> f64 {
    f(); // warm-up
    let (start, mut n) = (Instant::now(), 0u32);
    while n < 3 || start.elapsed().as_secs_f64() < min_s {
        f();
        n += 1;
    }
    start.elapsed().as_secs_f64() / n as f64
}

fn row(kernel: &str, d: GdnDims, t: usize, secs: f64, bytes: f64, flops: f64) {
    let time = if secs < 1e-3 { format!("{:.1} µs", secs * 1e6) } else { format!("{:.2} ms", secs * 1e3) };
    println!(
        "| {kernel:<20} | {:>2}/{:<2} | {t:>6} | {time:>10} | {:>9.2} MB | {:>7.2} | {:>8.3} G | {:>7.2} | {:>10.0} |",
        d.nv,
        d.nk,
        bytes / 1e6,
        bytes / secs / 1e9,
        flops / 1e9,
        flops / secs / 1e9,
        t as f64 / secs,
    );
}

pub fn run(a: KernelArgs) -> anyhow::Result<()> {
    println!("GDN kernels, one layer, f32 state, dk = dv = {}, single thread", a.head_dim);
    println!("| kernel               | nv/nk | tokens |       time |  bytes moved | GB/s    | FLOPs      | GFLOP/s | tokens/s   |");
    println!("| -------------------- | ----- | ------ | ---------- | ------------ | ------- | ---------- | ------- | ---------- |");
    for &nv in &a.heads {
        let nk = a.key_heads.min(nv);
        anyhow::ensure!(nk > 0 && nv % nk == 0, "--heads {nv} is not a multiple of --key-heads {nk}");
        let d = GdnDims { nk, nv, dk: a.head_dim, dv: a.head_dim };
        let mut state = vec![0f32; d.state_len()];
        let x = inputs(1, d);
        let secs = time(a.min_seconds, || {
            std::hint::black_box(gated_delta_recurrent(&x.q, &x.k, &x.v, &x.beta, &x.g, &mut state, d));
        });
        row("decode step", d, 1, secs, bytes(1, d), recurrent_flops(1, d));
        for &t in &a.tokens {
            let x = inputs(t, d);
            let secs = time(a.min_seconds, || {
                state.iter_mut().for_each(|s| *s = 0.0);
                std::hint::black_box(gated_delta_chunked(&x.q, &x.k, &x.v, &x.beta, &x.g, &mut state, d));
            });
            row("chunked prefill", d, t, secs, bytes(t, d), chunked_flops(t, d));
            let secs = time(a.min_seconds, || {
                state.iter_mut().for_each(|s| *s = 0.0);
                std::hint::black_box(gated_delta_recurrent(&x.q, &x.k, &x.v, &x.beta, &x.g, &mut state, d));
            });
            row("recurrent prefill", d, t, secs, bytes(t, d), recurrent_flops(t, d));
        }
    }
    println!(
        "bytes: the state read and written once plus q, k, v, β, g and the output; FLOPs as the kernels compute them."
    );
    Ok(())
}
