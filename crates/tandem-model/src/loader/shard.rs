//! Tensor-parallel shards of a checkpoint: [`ShardSource`] wraps any [`WeightSource`] and hands
//! out rank `r` of `world`'s slice of each tensor, as an architecture's rule ([`Split`] by
//! name) says: the output rows of column-parallel projections (a rank's heads, its share of an
//! FFN's intermediate), the input columns of row-parallel ones (o_proj, out_proj, down_proj:
//! their outputs are partial sums the ranks add), the rows of an embedding table (its
//! vocabulary), or the whole tensor (norms).
//!
//! Slices are exact: dense weights keep their dtype, and block-quantised weights are cut at
//! block boundaries from their bytes (rows whole; columns in whole blocks), so the shards of a
//! tensor put back together are the tensor, bit for bit (tests below).

use std::borrow::Cow;
use std::ops::Range;

use candle_core::quantized::{QMatMul, QStorage, QTensor};
use candle_core::{Device, Tensor};

use super::{Embedding, LinearWeight, WeightSource};
use crate::error::{ModelError, Result};

/// How one tensor is divided among the ranks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Split {
    /// Every rank holds the whole tensor.
    Whole,
    /// Along dim 0 (a matrix's output rows, a vector's entries): each segment cut into `ways`
    /// equal pieces, and the rank takes piece `rank * ways / world` of every segment in turn (a
    /// fused `[q | k | v]` projection has three segments, each cut by heads). `ways` is the
    /// world for an even split; fewer where ranks share a piece (KV heads fewer than the ranks,
    /// each held by `world / ways` of them).
    Rows { segments: Vec<Range<usize>>, ways: usize },
    /// A matrix's input columns, cut the same way (row-parallel projections).
    Cols { segments: Vec<Range<usize>>, ways: usize },
    /// Along dim `dim` of any tensor, cut the same way (stacked experts `[E, rows, cols]`:
    /// dim 1 for their rows, 2 for their columns); served by `tensor_f32`.
    Along { dim: usize, segments: Vec<Range<usize>>, ways: usize },
    /// Not served to the ranks at all (`has` is false): a part the sharded model leaves out.
    Absent,
}

impl Split {
    /// Rows `0..n` cut `ways` ways.
    pub fn rows(n: usize, ways: usize) -> Self {
        Split::Rows { segments: vec![0..n], ways }
    }
    /// Columns `0..n` cut `ways` ways.
    pub fn cols(n: usize, ways: usize) -> Self {
        Split::Cols { segments: vec![0..n], ways }
    }
}

/// The ranges rank `rank` of `world` holds when each of `segments` is cut into `ways` equal
/// pieces of whole `unit`s (a quantised block's columns): piece `rank * ways / world` of each.
/// A cut that is uneven, splits a unit or leaves ranks without a piece is an error.
pub fn share(
    segments: &[Range<usize>],
    rank: usize,
    world: usize,
    ways: usize,
    unit: usize,
) -> Result<Vec<Range<usize>>> {
    if world == 0 || rank >= world || ways == 0 || !world.is_multiple_of(ways) {
        return Err(ModelError::Config(format!("tensor parallelism: rank {rank} of {world} in {ways} pieces")));
    }
    let piece = rank * ways / world;
    segments
        .iter()
        .map(|s| {
            let len = s.end - s.start;
            if !len.is_multiple_of(ways) || !(len / ways).is_multiple_of(unit.max(1)) {
                return Err(ModelError::Config(format!(
                    "tensor parallelism: {len} rows or columns do not split {ways} ways in whole pieces of {unit}"
                )));
            }
            let per = len / ways;
            Ok(s.start + piece * per..s.start + (piece + 1) * per)
        })
        .collect()
}

/// `n` (heads, FFN columns: `what`) per rank of `world`; an uneven cut is a config error.
pub fn per_rank(what: &str, n: usize, world: usize) -> Result<usize> {
    if world > 0 && n.is_multiple_of(world) {
        Ok(n / world)
    } else {
        Err(ModelError::Config(format!("tensor parallelism {world}: {what} ({n}) do not divide {world} ways")))
    }
}

/// KV heads per rank: an even share, or one where the heads are fewer than the ranks (each
/// held whole by the `world / heads` ranks whose queries read it).
pub fn kv_heads_per_rank(heads: usize, world: usize) -> Result<usize> {
    if heads > 0 && heads < world && world.is_multiple_of(heads) {
        Ok(1)
    } else {
        per_rank("KV heads", heads, world)
    }
}

/// The `ways` a KV projection's rows are cut ([`Split::Rows`]): one piece a head where the
/// heads are fewer than the ranks, else one a rank.
pub fn kv_ways(heads: usize, world: usize) -> usize {
    heads.min(world)
}

/// `world` ranks loaded by `load`, each from `ws` cut by `split` and then wrapped by `wrap`
/// (load-time quantisation of the slices).
pub fn load_ranks<'a, M>(
    ws: &'a dyn WeightSource,
    world: usize,
    split: impl Fn(&str) -> Result<Split> + Clone + 'a,
    wrap: &impl for<'b> Fn(&'b ShardSource<'a>) -> Box<dyn WeightSource + 'b>,
    load: impl Fn(&dyn WeightSource) -> Result<M>,
) -> Result<Vec<M>> {
    (0..world)
        .map(|r| {
            let shard = ShardSource::new(ws, r, world, split.clone())?;
            let src = wrap(&shard);
            let rank = load(&*src);
            drop(src);
            rank
        })
        .collect()
}

/// A [`WeightSource`] serving rank `rank` of `world`: each tensor cut as `split(name)` says.
pub struct ShardSource<'a> {
    inner: &'a dyn WeightSource,
    rank: usize,
    world: usize,
    split: Box<dyn Fn(&str) -> Result<Split> + 'a>,
}

impl<'a> ShardSource<'a> {
    pub fn new(
        inner: &'a dyn WeightSource,
        rank: usize,
        world: usize,
        split: impl Fn(&str) -> Result<Split> + 'a,
    ) -> Result<Self> {
        if world == 0 || rank >= world {
            return Err(ModelError::Config(format!("tensor parallelism: rank {rank} of {world}")));
        }
        Ok(Self { inner, rank, world, split: Box::new(split) })
    }

    /// This rank's [`share`] of tensor `name`'s `segments`, a bad cut's error naming it.
    fn share_of(&self, name: &str, segments: &[Range<usize>], ways: usize, unit: usize) -> Result<Vec<Range<usize>>> {
        share(segments, self.rank, self.world, ways, unit).map_err(|e| match e {
            ModelError::Config(m) => ModelError::Config(format!("{name}: {m}")),
            e => e,
        })
    }
}

impl WeightSource for ShardSource<'_> {
    fn has(&self, name: &str) -> bool {
        // A rule's error still reports "present", so the load that asks for it says why.
        self.inner.has(name) && !matches!((self.split)(name), Ok(Split::Absent))
    }

    fn qmatmul(&self, name: &str) -> Result<LinearWeight> {
        let (dim, segments, ways) = match (self.split)(name)? {
            Split::Whole => return self.inner.qmatmul(name),
            Split::Rows { segments, ways } => (0, segments, ways),
            Split::Cols { segments, ways } => (1, segments, ways),
            Split::Along { dim, segments, ways } => (dim, segments, ways),
            Split::Absent => return Err(ModelError::MissingTensor(name.to_string())),
        };
        let cut = |unit: usize| self.share_of(name, &segments, ways, unit);
        // A source that repacks matrices for the CPU (GGUF) hands out the stored blocks: cut
        // them, then pack the slice the same way.
        if let Some(q) = self.inner.stored_slice(name, dim, &|dt| cut(if dim == 1 { dt.block_size() } else { 1 }))? {
            return crate::loader::gguf::linear_of_stored(q, false);
        }
        let w = self.inner.qmatmul(name)?;
        Ok(LinearWeight::Candle(match w {
            LinearWeight::Candle(QMatMul::Tensor(t)) => QMatMul::Tensor(dense_slice(&t, dim, &cut(1)?)?),
            LinearWeight::Candle(QMatMul::TensorF16(t)) => QMatMul::TensorF16(dense_slice(&t, dim, &cut(1)?)?),
            LinearWeight::Candle(QMatMul::QTensor(q)) => {
                let unit = if dim == 1 { q.dtype().block_size() } else { 1 };
                QMatMul::from_qtensor(quantised_slice(&q, dim, &cut(unit)?)?)?
            }
            _ => {
                return Err(ModelError::Unsupported(format!(
                    "tensor parallelism: {name} was repacked for this CPU's kernels and cannot be sliced; \
                     load it as stored"
                )))
            }
        }))
    }

    fn tensor_f32(&self, name: &str) -> Result<Tensor> {
        let t = self.inner.tensor_f32(name)?;
        match (self.split)(name)? {
            Split::Whole => Ok(t),
            Split::Rows { segments, ways } => dense_slice(&t, 0, &share(&segments, self.rank, self.world, ways, 1)?),
            Split::Cols { segments, ways } => dense_slice(&t, 1, &share(&segments, self.rank, self.world, ways, 1)?),
            Split::Along { dim, segments, ways } => {
                dense_slice(&t, dim, &share(&segments, self.rank, self.world, ways, 1)?)
            }
            Split::Absent => Err(ModelError::MissingTensor(name.to_string())),
        }
    }

    fn embedding(&self, name: &str) -> Result<Embedding> {
        let (segments, ways) = match (self.split)(name)? {
            Split::Whole => return self.inner.embedding(name),
            Split::Rows { segments, ways } => (segments, ways),
            Split::Absent => return Err(ModelError::MissingTensor(name.to_string())),
            _ => {
                return Err(ModelError::Unsupported(format!(
                    "tensor parallelism: {name} is an embedding table, cut by vocabulary rows only"
                )))
            }
        };
        let rows = self.share_of(name, &segments, ways, 1)?;
        // A source that repacks tables for the CPU (GGUF): cut the stored blocks, then make the
        // table of the slice the same way (a tied one packed to serve as the head too).
        if let Some(q) = self.inner.stored_slice(name, 0, &|_| Ok(rows.clone()))? {
            let tied = !self.inner.has("output.weight");
            return crate::loader::gguf::embedding_of_stored(q, tied);
        }
        Ok(match self.inner.embedding(name)? {
            Embedding::Dense(t) => Embedding::Dense(dense_slice(&t, 0, &rows)?),
            Embedding::Quantized(q) => Embedding::Quantized(std::sync::Arc::new(quantised_slice(&q, 0, &rows)?)),
            _ => {
                return Err(ModelError::Unsupported(format!(
                    "tensor parallelism: {name} was repacked for this CPU's kernels and cannot be cut by \
                     vocabulary; load it as stored"
                )))
            }
        })
    }

    fn device(&self) -> &Device {
        self.inner.device()
    }
}

/// `t`'s ranges along `dim`, concatenated (contiguous, the same dtype and device).
pub fn dense_slice(t: &Tensor, dim: usize, ranges: &[Range<usize>]) -> Result<Tensor> {
    let parts =
        ranges.iter().map(|r| t.narrow(dim, r.start, r.end - r.start)).collect::<candle_core::Result<Vec<_>>>()?;
    Ok(Tensor::cat(&parts, dim)?.contiguous()?)
}

/// A block-quantised `[rows, cols]` matrix's ranges along `dim` (0: rows; 1: columns, in whole
/// blocks), cut from its bytes: the same blocks, on the same device.
pub fn quantised_slice(q: &QTensor, dim: usize, ranges: &[Range<usize>]) -> Result<QTensor> {
    let dims = q.shape().dims2()?;
    let dtype = q.dtype();
    let (out, shape) = slice_bytes(&q.data()?, dims, dtype, dim, ranges)?;
    Ok(QTensor::new(QStorage::from_data(Cow::Owned(out), &q.device(), dtype)?, shape)?)
}

/// The bytes of a `[rows, cols]` matrix of `dtype` blocks (`data`, row after row) cut along
/// `dim` as [`quantised_slice`] cuts, and the slice's shape.
pub fn slice_bytes(
    data: &[u8],
    (rows, cols): (usize, usize),
    dtype: candle_core::quantized::GgmlDType,
    dim: usize,
    ranges: &[Range<usize>],
) -> Result<(Vec<u8>, (usize, usize))> {
    let (bs, ts) = (dtype.block_size(), dtype.type_size());
    if !cols.is_multiple_of(bs) {
        return Err(ModelError::Config(format!("a {dtype:?} matrix of {cols} columns is not whole blocks")));
    }
    let row_bytes = cols / bs * ts;
    if data.len() != rows * row_bytes {
        return Err(ModelError::Config(format!("a {dtype:?} matrix of {} bytes is not [{rows}, {cols}]", data.len())));
    }
    if dim == 0 {
        let mut out = Vec::new();
        for r in ranges {
            let part = data.get(r.start * row_bytes..r.end * row_bytes);
            out.extend_from_slice(part.ok_or_else(|| ModelError::Config(format!("rows {r:?} of {rows}")))?);
        }
        Ok((out, (ranges.iter().map(|r| r.end - r.start).sum::<usize>(), cols)))
    } else {
        for r in ranges {
            if !r.start.is_multiple_of(bs) || !r.end.is_multiple_of(bs) || r.start > r.end || r.end > cols {
                return Err(ModelError::Config(format!("columns {r:?} cut a {dtype:?} block or pass {cols}")));
            }
        }
        let width: usize = ranges.iter().map(|r| r.end - r.start).sum();
        let mut out = Vec::with_capacity(rows * width / bs * ts);
        for row in data.chunks_exact(row_bytes) {
            for r in ranges {
                out.extend_from_slice(&row[r.start / bs * ts..r.end / bs * ts]);
            }
        }
        Ok((out, (rows, width)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::quantized::GgmlDType;

    fn matrix(rows: usize, cols: usize) -> Tensor {
        let v: Vec<f32> = (0..rows * cols).map(|i| ((i * 7919 % 1013) as f32 - 506.0) / 97.0).collect();
        Tensor::from_vec(v, (rows, cols), &Device::Cpu).unwrap()
    }

    #[test]
    fn cuts_that_do_not_fit_the_matrix_are_errors() {
        use candle_core::quantized::GgmlDType;
        // A Q8_0 matrix of 2 rows of 64 values: 2 blocks of 34 bytes a row.
        let data = vec![0u8; 2 * 2 * 34];
        assert!(slice_bytes(&data, (2, 64), GgmlDType::Q8_0, 0, &[1..2]).is_ok());
        assert!(slice_bytes(&data, (2, 64), GgmlDType::Q8_0, 0, &[1..3]).is_err(), "rows past the end");
        assert!(slice_bytes(&data, (2, 64), GgmlDType::Q8_0, 1, &[16..48]).is_err(), "columns inside a block");
        assert!(slice_bytes(&data, (2, 64), GgmlDType::Q8_0, 1, &[32..96]).is_err(), "columns past the end");
        #[allow(clippy::reversed_empty_ranges)]
        let backwards = [64..32];
        assert!(slice_bytes(&data, (2, 64), GgmlDType::Q8_0, 1, &backwards).is_err(), "a backwards range");
        assert!(slice_bytes(&data[..100], (2, 64), GgmlDType::Q8_0, 0, &[0..1]).is_err(), "too few bytes");
        let (bytes, shape) = slice_bytes(&data, (2, 64), GgmlDType::Q8_0, 1, &[32..64]).unwrap();
        assert_eq!((bytes.len(), shape), (2 * 34, (2, 32)));
    }

    #[test]
    fn shares_are_even_whole_and_cover_every_segment() {
        let segs = [0..8, 8..16, 16..32];
        assert_eq!(share(&segs, 0, 2, 2, 4).unwrap(), vec![0..4, 8..12, 16..24]);
        assert_eq!(share(&segs, 1, 2, 2, 4).unwrap(), vec![4..8, 12..16, 24..32]);
        assert!(share(&segs, 0, 3, 3, 1).is_err(), "8 rows do not split 3 ways");
        assert!(share(&[0..64], 0, 2, 2, 64).is_err(), "32 columns are not a whole 64-value piece");
        assert!(share(&[0..8], 2, 2, 2, 1).is_err(), "rank 2 of 2");
        // Two pieces over four ranks: ranks 0 and 1 share the first, 2 and 3 the second.
        let got: Vec<_> = (0..4).map(|r| share(&[0..8], r, 4, 2, 1).unwrap()).collect();
        assert_eq!(got, vec![vec![0..4], vec![0..4], vec![4..8], vec![4..8]]);
        assert!(share(&[0..9], 0, 4, 3, 1).is_err(), "3 pieces do not go evenly over 4 ranks");
    }

    #[test]
    fn dense_shards_put_back_together_are_the_tensor() {
        let t = matrix(12, 10);
        let segs = [0..4, 4..12];
        let parts: Vec<Tensor> =
            (0..2).map(|r| dense_slice(&t, 0, &share(&segs, r, 2, 2, 2).unwrap()).unwrap()).collect();
        assert_eq!(parts[0].dims(), [6, 10]);
        // Rank 0 holds rows 0..2 and 4..8, rank 1 rows 2..4 and 8..12.
        let back = Tensor::cat(
            &[
                parts[0].narrow(0, 0, 2).unwrap(),
                parts[1].narrow(0, 0, 2).unwrap(),
                parts[0].narrow(0, 2, 4).unwrap(),
                parts[1].narrow(0, 2, 4).unwrap(),
            ],
            0,
        )
        .unwrap();
        assert_eq!(back.to_vec2::<f32>().unwrap(), t.to_vec2::<f32>().unwrap());
        let cols: Vec<Tensor> =
            (0..2).map(|r| dense_slice(&t, 1, &share(&[0..10], r, 2, 2, 1).unwrap()).unwrap()).collect();
        assert_eq!(Tensor::cat(&cols, 1).unwrap().to_vec2::<f32>().unwrap(), t.to_vec2::<f32>().unwrap());
    }

    #[test]
    fn quantised_shards_are_the_same_blocks() {
        for dtype in [GgmlDType::Q8_0, GgmlDType::Q4_0, GgmlDType::Q4K, GgmlDType::Q6K] {
            let (rows, cols) = (6, 1024);
            let q = QTensor::quantize(&matrix(rows, cols), dtype).unwrap();
            let whole = q.dequantize(&Device::Cpu).unwrap().to_vec2::<f32>().unwrap();
            let bytes = q.data().unwrap().into_owned();
            // Rows: the two halves' bytes are the whole's.
            let halves: Vec<QTensor> =
                (0..2).map(|r| quantised_slice(&q, 0, &share(&[0..rows], r, 2, 2, 1).unwrap()).unwrap()).collect();
            let joined: Vec<u8> = halves.iter().flat_map(|h| h.data().unwrap().into_owned()).collect();
            assert_eq!(joined, bytes, "{dtype:?} rows");
            // Columns: each half dequantises to the whole's columns, exactly.
            for r in 0..2 {
                let c = quantised_slice(&q, 1, &share(&[0..cols], r, 2, 2, dtype.block_size()).unwrap()).unwrap();
                assert_eq!(c.shape().dims2().unwrap(), (rows, cols / 2));
                let got = c.dequantize(&Device::Cpu).unwrap().to_vec2::<f32>().unwrap();
                for (g, w) in got.iter().zip(&whole) {
                    assert_eq!(g.as_slice(), &w[r * cols / 2..(r + 1) * cols / 2], "{dtype:?} columns of rank {r}");
                }
            }
            assert!(quantised_slice(&q, 1, &[0..16]).is_err(), "{dtype:?}: half a block");
        }
    }
}
