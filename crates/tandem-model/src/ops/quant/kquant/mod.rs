//! Q2K, Q3K, Q4K, Q5K and Q6K weights on the CPU with a kernel of our own ([`KQuantMatrix`]),
//! in place of candle's; and Q8_0, Q5_0 and Q4_0 on the same kernel, one column a lane
//! ([`tile8`], [`tile50`], [`tile40`]).
//!
//! candle runs Q4K on repacked VNNI tiles that it builds lazily beside the file's blocks (the
//! matrix then sits in memory twice, 10.5 bits a value), takes 4 activation rows per pass over
//! a tile, and quantises the activations with a scalar loop on every call: 43% of
//! qwen2.5-coder-1.5b's prefill was its tiles. Here the matrix is packed once at load
//! ([`tile`]: 4.625 bits a value for Q4K, 5.6 for Q5K, the file's blocks dropped), a pass over a tile serves up to 8
//! rows, the activations are quantised by the AVX-512 or AVX2 quantiser of [`super::q6k`], and every
//! (row, column) result has one fixed order of operations ([`tile::dot`]), so a row gets the
//! same bits in a decode step, a verify chunk or a prefill chunk.
//!
//! x86_64 with AVX-512 VNNI ([`avx512`]) or AVX2 + FMA + F16C ([`avx2`]: the same results bit
//! for bit, by `vpmaddubsw` where the other has `vpdpbusd`) ([`available`]); elsewhere the
//! loader keeps candle's `QMatMul`.

mod acts;
mod grouped;
mod route;
pub mod tile;
pub mod tile2;
pub mod tile3;
pub mod tile40;
pub mod tile50;
pub mod tile6;
pub mod tile8;

pub use grouped::{matmul_grouped, Job};
use route::block32;
pub use route::{fits, q50_tiles, q6k_layers, q8_tiles, q8_tiles_for, supports, takes};

#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx512;
#[cfg(test)]
mod tests;
#[cfg(target_arch = "x86_64")]
mod x86;

use candle_core::quantized::GgmlDType;
use candle_core::{Device, Storage, Tensor};

pub(crate) use acts::act;
use acts::{act6, quantize, Acts};
use tile::{HighBits, Tile, COLS, QK_K};
use tile2::Tile2;
use tile3::Tile3;
use tile40::Tile40;
use tile50::Tile50;
use tile6::{Sub16, Tile6};
use tile8::Tile8;

/// A Q4K, Q5K or Q6K weight matrix of `n` output rows by `k` inputs, packed for
/// [`KQuantMatrix::forward`].
pub struct KQuantMatrix {
    n: usize,
    k: usize,
    /// Q4K / Q5K tiles (empty for Q6K).
    tiles: Vec<Tile>,
    /// Q5K: each tile's fifth bits; empty otherwise.
    high: Vec<HighBits>,
    /// Q6K tiles (empty otherwise).
    six: Vec<Tile6>,
    /// Q3K tiles (empty otherwise).
    three: Vec<Tile3>,
    /// Q2K tiles (empty otherwise).
    two: Vec<Tile2>,
    /// Q8_0 tiles (empty otherwise; see [`takes`]).
    eight: Vec<Tile8>,
    /// Q5_0 tiles (empty otherwise; AVX-512 only, see [`takes`]); rows of any multiple of 32
    /// values, padded to whole stretches ([`tile50`]).
    five0: Vec<Tile50>,
    /// Q4_0 tiles (empty otherwise), padded as the Q5_0 ones ([`tile40`]).
    four0: Vec<Tile40>,
}

impl std::fmt::Debug for KQuantMatrix {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "KQuantMatrix({:?}, n={}, k={})", self.dtype(), self.n, self.k)
    }
}

/// Whether this CPU runs our K-quant kernel (AVX-512 F/BW/VNNI, or AVX2 + FMA + F16C). `TANDEM_QUANT_KERNEL=candle`
/// (all quantised types) or `TANDEM_KQUANT_KERNEL=candle` (Q4K and Q5K only) keeps candle's, for
/// comparisons.
pub fn available() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        static CANDLE: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        let candle = *CANDLE
            .get_or_init(|| std::env::var("TANDEM_KQUANT_KERNEL").is_ok_and(|v| v.eq_ignore_ascii_case("candle")));
        simd().is_some() && !super::Kernel::candle_only() && !candle
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// The instruction sets of the kernel.
#[cfg(target_arch = "x86_64")]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Simd {
    /// [`avx512`]: 16 columns a register, up to 8 rows a pass.
    Avx512,
    /// [`avx2`]: two halves of 8 columns, up to 4 rows a pass.
    Avx2,
}

#[cfg(target_arch = "x86_64")]
impl Simd {
    fn available(self) -> bool {
        match self {
            Simd::Avx512 => avx512::available(),
            Simd::Avx2 => avx2::available(),
        }
    }
}

/// The best kernel this CPU runs (AVX-512 where it can; `TANDEM_KQUANT_SIMD=avx2` takes the
/// AVX2 one on an AVX-512 CPU, for comparisons).
#[cfg(target_arch = "x86_64")]
fn simd() -> Option<Simd> {
    static SIMD: std::sync::OnceLock<Option<Simd>> = std::sync::OnceLock::new();
    *SIMD.get_or_init(|| {
        let avx2_only = std::env::var("TANDEM_KQUANT_SIMD").is_ok_and(|v| v.eq_ignore_ascii_case("avx2"));
        [Simd::Avx512, Simd::Avx2].into_iter().find(|s| s.available() && !(avx2_only && *s == Simd::Avx512))
    })
}

/// Activation bytes per block of rows: they stay in L2 while a task's columns pass over them.
#[cfg(target_arch = "x86_64")]
const ROW_BLOCK_BYTES: usize = 256 * 1024;

impl KQuantMatrix {
    /// From a GGUF tensor's bytes: `n` rows of `k / 256` blocks of `dtype` (Q2K .. Q6K).
    pub fn from_bytes(dtype: GgmlDType, n: usize, k: usize, bytes: &[u8]) -> candle_core::Result<Self> {
        if !fits(dtype, k) || n == 0 {
            let unit = if block32(dtype) { 32 } else { QK_K };
            candle_core::bail!("{dtype:?} matrix [{n}, {k}]: k must be a positive multiple of {unit}");
        }
        let block = match dtype {
            GgmlDType::Q4K => tile::BLOCK_BYTES,
            GgmlDType::Q5K => tile::BLOCK5_BYTES,
            GgmlDType::Q6K => tile6::BLOCK6_BYTES,
            GgmlDType::Q3K => tile3::BLOCK3_BYTES,
            GgmlDType::Q2K => tile2::BLOCK2_BYTES,
            GgmlDType::Q8_0 => tile8::STRETCH8_BYTES,
            GgmlDType::Q5_0 => tile50::BLOCK50_BYTES * QK_K / 32,
            GgmlDType::Q4_0 => tile40::BLOCK40_BYTES * QK_K / 32,
            other => candle_core::bail!("{other:?} is not a type of the K-quant kernel (Q2K .. Q6K, Q8_0, Q5_0, Q4_0)"),
        };
        let want = n * k * block / QK_K;
        if bytes.len() != want {
            candle_core::bail!("{dtype:?} matrix [{n}, {k}]: expected {want} bytes, got {}", bytes.len());
        }
        let empty = Self {
            n,
            k,
            tiles: Vec::new(),
            high: Vec::new(),
            six: Vec::new(),
            three: Vec::new(),
            two: Vec::new(),
            eight: Vec::new(),
            five0: Vec::new(),
            four0: Vec::new(),
        };
        Ok(match dtype {
            GgmlDType::Q4K => Self { tiles: tile::pack(bytes, n, k), ..empty },
            GgmlDType::Q5K => {
                let (tiles, high) = tile::pack5(bytes, n, k);
                Self { tiles, high, ..empty }
            }
            GgmlDType::Q3K => Self { three: tile3::pack3(bytes, n, k), ..empty },
            GgmlDType::Q2K => Self { two: tile2::pack2(bytes, n, k), ..empty },
            GgmlDType::Q8_0 => Self { eight: tile8::pack8(bytes, n, k), ..empty },
            GgmlDType::Q5_0 => Self { five0: tile50::pack50(bytes, n, k), ..empty },
            GgmlDType::Q4_0 => Self { four0: tile40::pack40(bytes, n, k), ..empty },
            _ => Self { six: tile6::pack6(bytes, n, k), ..empty },
        })
    }

    /// The weight type the matrix was packed from.
    pub fn dtype(&self) -> GgmlDType {
        if !self.six.is_empty() {
            GgmlDType::Q6K
        } else if !self.three.is_empty() {
            GgmlDType::Q3K
        } else if !self.two.is_empty() {
            GgmlDType::Q2K
        } else if !self.eight.is_empty() {
            GgmlDType::Q8_0
        } else if !self.five0.is_empty() {
            GgmlDType::Q5_0
        } else if !self.four0.is_empty() {
            GgmlDType::Q4_0
        } else if self.high.is_empty() {
            GgmlDType::Q4K
        } else {
            GgmlDType::Q5K
        }
    }

    /// The high bits of tiles `from ..` (null for Q4K), for the kernel.
    #[cfg(target_arch = "x86_64")]
    fn high_ptr(&self, from: usize) -> *const HighBits {
        if self.high.is_empty() {
            std::ptr::null()
        } else {
            self.high[from..].as_ptr()
        }
    }

    pub fn n(&self) -> usize {
        self.n
    }

    pub fn k(&self) -> usize {
        self.k
    }

    /// Superblocks (stretches of 256 values) per row: the last one padded where `k` is not a
    /// multiple of 256 (Q8_0, Q5_0, Q4_0).
    fn nb(&self) -> usize {
        self.k.div_ceil(QK_K)
    }

    /// The first `n` rows (at most [`Self::n`]).
    pub fn first_rows(&self, n: usize) -> Self {
        let n = n.clamp(1, self.n);
        let nb = self.nb();
        let t = n.div_ceil(COLS) * nb;
        let cut = |len: usize| t.min(len);
        Self {
            n,
            k: self.k,
            tiles: self.tiles[..cut(self.tiles.len())].to_vec(),
            high: self.high[..cut(self.high.len())].to_vec(),
            six: self.six[..cut(self.six.len())].to_vec(),
            three: self.three[..cut(self.three.len())].to_vec(),
            two: self.two[..cut(self.two.len())].to_vec(),
            eight: self.eight[..cut(self.eight.len())].to_vec(),
            five0: self.five0[..cut(self.five0.len())].to_vec(),
            four0: self.four0[..cut(self.four0.len())].to_vec(),
        }
    }

    /// The weights as f32, `[n, k]` row-major.
    pub fn dequantize(&self) -> Vec<f32> {
        let mut out = vec![0f32; self.n * self.k];
        for (row, o) in out.chunks_exact_mut(self.k).enumerate() {
            self.dequantize_row(row, o);
        }
        out
    }

    /// Row `row` (< `n`) of the weights as f32 into `o` (`k` values): the values candle's
    /// dequantisation of the file's blocks gives (an embedding lookup from the packed tiles).
    pub fn dequantize_row(&self, row: usize, o: &mut [f32]) {
        let nb = self.nb();
        if nb * QK_K != self.k {
            // Padded stretches (Q8_0, Q5_0, Q4_0): the whole stretches, then the row's own values.
            let mut whole = vec![0f32; nb * QK_K];
            let (ct, c) = (row / COLS, row % COLS);
            if !self.eight.is_empty() {
                values_into(&mut whole, nb, |b, i| tile8::weight(&self.eight[ct * nb + b], c, i));
            } else if self.four0.is_empty() {
                values_into(&mut whole, nb, |b, i| tile50::weight(&self.five0[ct * nb + b], c, i));
            } else {
                values_into(&mut whole, nb, |b, i| tile50::weight(&self.four0[ct * nb + b], c, i));
            }
            o.copy_from_slice(&whole[..self.k]);
            return;
        }
        let (ct, c) = (row / COLS, row % COLS);
        if !self.six.is_empty() {
            return sub16_weights(&self.six[ct * nb..(ct + 1) * nb], c, o);
        }
        if !self.three.is_empty() {
            return sub16_weights(&self.three[ct * nb..(ct + 1) * nb], c, o);
        }
        let at = |b: usize| ct * nb + b;
        if !self.two.is_empty() {
            return values_into(o, nb, |b, i| tile2::weight(&self.two[at(b)], c, i));
        }
        if !self.eight.is_empty() {
            return values_into(o, nb, |b, i| tile8::weight(&self.eight[at(b)], c, i));
        }
        if !self.five0.is_empty() {
            return values_into(o, nb, |b, i| tile50::weight(&self.five0[at(b)], c, i));
        }
        if !self.four0.is_empty() {
            return values_into(o, nb, |b, i| tile50::weight(&self.four0[at(b)], c, i));
        }
        values_into(o, nb, |b, i| tile::weight(&self.tiles[at(b)], self.high.get(at(b)), c, i));
    }

    /// `y = x · Wᵀ` for `x` `[..., k]` f32 on the CPU.
    pub fn forward(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        let dims = x.dims().to_vec();
        if dims.last() != Some(&self.k) {
            candle_core::bail!("Q4K matmul: input {dims:?} does not end in k = {}", self.k);
        }
        let x = x.to_dtype(candle_core::DType::F32)?.contiguous()?;
        let m = x.elem_count() / self.k;
        let mut y = vec![0f32; m * self.n];
        {
            let (storage, layout) = x.storage_and_layout();
            let Storage::Cpu(cpu) = &*storage else { candle_core::bail!("Q4K matmul: input is not on the CPU") };
            let start = layout.start_offset();
            self.matmul(&cpu.as_slice::<f32>()?[start..start + m * self.k], m, &mut y);
        }
        let mut out = dims;
        *out.last_mut().unwrap_or_else(|| unreachable!()) = self.n;
        Tensor::from_vec(y, out, &Device::Cpu)
    }

    /// `y[m, n] = x[m, k] · Wᵀ` with the kernel where it runs, else the reference.
    pub fn matmul(&self, x: &[f32], m: usize, y: &mut [f32]) {
        assert_eq!(x.len(), m * self.k, "Q4K matmul: x has {} values, want {m} × {}", x.len(), self.k);
        assert_eq!(y.len(), m * self.n, "Q4K matmul: y has {} values, want {m} × {}", y.len(), self.n);
        if m == 0 {
            return;
        }
        let acts = self.acts(x, m);
        #[cfg(target_arch = "x86_64")]
        if available() {
            if let Some(simd) = simd() {
                // SAFETY: the CPU has `simd` (checked by `simd`); sizes are asserted above and
                // in `acts`.
                unsafe { self.matmul_simd(simd, &acts, m, y) };
                return;
            }
        }
        self.matmul_reference(&acts, m, y);
    }

    /// Whether the kernel reads activations quantised per 32-value block ([`tile50::Act50`]:
    /// Q8_0, Q5_0 and Q4_0 tiles) rather than Q8K superblocks.
    fn per_block_acts(&self) -> bool {
        !self.five0.is_empty() || !self.four0.is_empty() || !self.eight.is_empty()
    }

    /// `x` (`m` rows of `k`) quantised as this matrix's kernel reads it.
    fn acts(&self, x: &[f32], m: usize) -> Acts {
        if self.per_block_acts() {
            Acts::Block(tile50::quantize_rows(x, m, self.k))
        } else {
            let (q8, bsum) = quantize(x, m, self.nb());
            Acts::Q8K(q8, bsum)
        }
    }

    /// The plain per-element products ([`tile::dot`] and its siblings).
    fn matmul_reference(&self, acts: &Acts, m: usize, y: &mut [f32]) {
        let nb = self.nb();
        let (q8, bsum) = match acts {
            Acts::Q8K(q8, bsum) => (&q8[..], &bsum[..]),
            Acts::Block(a) => {
                for r in 0..m {
                    let row = &a[r * nb..(r + 1) * nb];
                    for col in 0..self.n {
                        let range = (col / COLS) * nb..(col / COLS + 1) * nb;
                        y[r * self.n + col] = if !self.eight.is_empty() {
                            tile8::dot(&self.eight[range], col % COLS, row)
                        } else if !self.four0.is_empty() {
                            tile50::dot(&self.four0[range], col % COLS, row)
                        } else {
                            tile50::dot(&self.five0[range], col % COLS, row)
                        };
                    }
                }
                return;
            }
        };
        for r in 0..m {
            if !self.six.is_empty() || !self.three.is_empty() || !self.two.is_empty() {
                let acts6: Vec<tile6::Act6<'_>> = (0..nb).map(|b| act6(&q8[r * nb + b])).collect();
                for col in 0..self.n {
                    let range = (col / COLS) * nb..(col / COLS + 1) * nb;
                    y[r * self.n + col] = if !self.two.is_empty() {
                        tile2::dot(&self.two[range], col % COLS, &acts6)
                    } else if self.three.is_empty() {
                        tile6::dot(&self.six[range], col % COLS, &acts6)
                    } else {
                        tile6::dot(&self.three[range], col % COLS, &acts6)
                    };
                }
                continue;
            }
            let acts: Vec<tile::Act<'_>> = (0..nb).map(|b| act(&q8[r * nb + b], bsum[r * nb + b])).collect();
            for col in 0..self.n {
                let range = (col / COLS) * nb..(col / COLS + 1) * nb;
                let high = if self.high.is_empty() { &[][..] } else { &self.high[range.clone()] };
                y[r * self.n + col] = tile::dot(&self.tiles[range], high, col % COLS, &acts);
            }
        }
    }

    /// The kernel `simd` on column tile `ct` for the rows `rows` (see [`avx512::rows`];
    /// [`avx2`] takes at most [`avx2::MAX_ROWS`]).
    #[cfg(target_arch = "x86_64")]
    unsafe fn tile_rows<const R: usize>(
        &self,
        simd: Simd,
        ct: usize,
        rows: &[x86::RowPtr; R],
        out: *mut f32,
        ldo: usize,
        cols: usize,
    ) {
        let nb = self.nb();
        // Blocks of the last stretch that hold the row's values (the rest is padding).
        let last = (self.k / 32 - 1) % 8 + 1;
        if !self.five0.is_empty() {
            let tiles = self.five0[ct * nb..].as_ptr();
            return match simd {
                Simd::Avx512 => avx512::rows50::<Tile50, R>(tiles, nb, last, rows, out, ldo, cols),
                Simd::Avx2 => avx2::rows50::<Tile50, R>(tiles, nb, last, rows, out, ldo, cols),
            };
        }
        if !self.four0.is_empty() {
            let tiles = self.four0[ct * nb..].as_ptr();
            return match simd {
                Simd::Avx512 => avx512::rows50::<Tile40, R>(tiles, nb, last, rows, out, ldo, cols),
                Simd::Avx2 => avx2::rows50::<Tile40, R>(tiles, nb, last, rows, out, ldo, cols),
            };
        }
        if !self.eight.is_empty() {
            let tiles = self.eight[ct * nb..].as_ptr();
            return match simd {
                Simd::Avx512 => avx512::rows8::<R>(tiles, nb, rows, out, ldo, cols),
                Simd::Avx2 => avx2::rows8::<R>(tiles, nb, last, rows, out, ldo, cols),
            };
        }
        if simd == Simd::Avx2 {
            if !self.six.is_empty() {
                avx2::rows6::<Tile6, R>(self.six[ct * nb..].as_ptr(), nb, rows, out, ldo, cols);
            } else if !self.three.is_empty() {
                avx2::rows6::<Tile3, R>(self.three[ct * nb..].as_ptr(), nb, rows, out, ldo, cols);
            } else if !self.two.is_empty() {
                avx2::rows2::<R>(self.two[ct * nb..].as_ptr(), nb, rows, out, ldo, cols);
            } else {
                avx2::rows::<R>(self.tiles[ct * nb..].as_ptr(), self.high_ptr(ct * nb), nb, rows, out, ldo, cols);
            }
            return;
        }
        if !self.six.is_empty() {
            avx512::rows6::<Tile6, R>(self.six[ct * nb..].as_ptr(), nb, rows, out, ldo, cols);
        } else if !self.three.is_empty() {
            avx512::rows6::<Tile3, R>(self.three[ct * nb..].as_ptr(), nb, rows, out, ldo, cols);
        } else if !self.two.is_empty() {
            avx512::rows2::<R>(self.two[ct * nb..].as_ptr(), nb, rows, out, ldo, cols);
        } else {
            avx512::rows::<R>(self.tiles[ct * nb..].as_ptr(), self.high_ptr(ct * nb), nb, rows, out, ldo, cols);
        }
    }

    #[cfg(target_arch = "x86_64")]
    unsafe fn matmul_simd(&self, simd: Simd, acts: &Acts, m: usize, y: &mut [f32]) {
        use super::matrix::{for_column_chunks, OutPtr};
        let (n, nb) = (self.n, self.nb());
        let out = OutPtr(y.as_mut_ptr());
        let row_ptr = |r: usize| match acts {
            Acts::Q8K(q8, bsum) => {
                x86::RowPtr { q8: q8[r * nb..].as_ptr() as *const u8, bsum: bsum[r * nb..].as_ptr() }
            }
            Acts::Block(a) => x86::RowPtr { q8: a[r * nb..].as_ptr() as *const u8, bsum: std::ptr::null() },
        };
        let max_rows = if simd == Simd::Avx2 { avx2::MAX_ROWS } else { 8 };
        let block = (ROW_BLOCK_BYTES / (nb * 292)).max(8) / 8 * 8;
        let threads = crate::ops::cpu_threads::threads();
        for_column_chunks(n.div_ceil(COLS), threads, m * n * self.k, 1, 1, |cts| {
            for r0 in (0..m).step_by(block) {
                let r1 = (r0 + block).min(m);
                for ct in cts.clone() {
                    let cols = COLS.min(n - ct * COLS);
                    let mut r = r0;
                    while r < r1 {
                        let o = out.get().add(r * n + ct * COLS);
                        macro_rules! go {
                            ($R:literal) => {{
                                let rows: [x86::RowPtr; $R] = std::array::from_fn(|i| row_ptr(r + i));
                                self.tile_rows::<$R>(simd, ct, &rows, o, n, cols);
                                r += $R;
                            }};
                        }
                        match (r1 - r).min(max_rows) {
                            1 => go!(1),
                            2 => go!(2),
                            3 => go!(3),
                            4 => go!(4),
                            5 => go!(5),
                            6 => go!(6),
                            7 => go!(7),
                            _ => go!(8),
                        }
                    }
                }
            }
        });
    }
}

/// `o[b * 256 + i] = weight(b, i)` for the `nb` superblocks of one column.
fn values_into(o: &mut [f32], nb: usize, weight: impl Fn(usize, usize) -> f32) {
    for b in 0..nb {
        for i in 0..QK_K {
            o[b * QK_K + i] = weight(b, i);
        }
    }
}

/// Column `c` of the superblocks `tiles` as f32 weights into `o`.
fn sub16_weights<T: Sub16>(tiles: &[T], c: usize, o: &mut [f32]) {
    for (b, t) in tiles.iter().enumerate() {
        for i in 0..QK_K {
            o[b * QK_K + i] = tile6::weight(t, c, i);
        }
    }
}
