//! Validation of a GGUF file's header before anything trusts it: every count, length and size
//! is checked against the bytes the file really has (so a hostile header cannot make us
//! allocate or loop on numbers it invents), arithmetic is checked (no overflow panics), and
//! the tensors must be well formed: a known type, an element count that fits and divides into
//! whole blocks, data aligned to `general.alignment` (a non-zero power of two), inside the
//! file, and not overlapping another tensor's. Only a file that passes is handed to candle's
//! reader. Format: <https://github.com/ggml-org/ggml/blob/master/docs/gguf.md>.

use crate::error::{ModelError, Result};

const MAGIC: u32 = 0x4655_4747; // "GGUF"
/// Nesting of arrays in metadata values we accept.
const MAX_ARRAY_DEPTH: usize = 2;
/// Dimensions of a tensor we accept.
const MAX_DIMS: u32 = 8;

/// One tensor as the header describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorEntry {
    pub name: String,
    pub dims: Vec<u64>,
    pub dtype: u32,
    pub offset: u64,
}

/// What a valid header says.
#[derive(Debug, Clone)]
pub struct Header {
    pub version: u32,
    pub alignment: u64,
    pub tensors: Vec<TensorEntry>,
    /// Byte offset of the tensor data section (after the header, aligned).
    pub data_start: u64,
}

struct Reader<'a> {
    b: &'a [u8],
    pos: usize,
}

fn bad(msg: impl Into<String>) -> ModelError {
    ModelError::Config(format!("not a valid GGUF file: {}", msg.into()))
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: u64, what: &str) -> Result<&'a [u8]> {
        let left = (self.b.len() - self.pos) as u64;
        if n > left {
            return Err(bad(format!("{what} needs {n} bytes at offset {} but {left} are left", self.pos)));
        }
        let s = &self.b[self.pos..self.pos + n as usize];
        self.pos += n as usize;
        Ok(s)
    }
    fn u32(&mut self, what: &str) -> Result<u32> {
        let s = self.take(4, what)?;
        Ok(u32::from_le_bytes([s[0], s[1], s[2], s[3]]))
    }
    fn u64(&mut self, what: &str) -> Result<u64> {
        let s = self.take(8, what)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(s);
        Ok(u64::from_le_bytes(a))
    }
    fn string(&mut self, what: &str) -> Result<&'a [u8]> {
        let n = self.u64(what)?;
        self.take(n, what)
    }
    /// Skips a metadata value of type `ty`, returning it as a u64 when it is an integer.
    fn value(&mut self, ty: u32, depth: usize, key: &str) -> Result<Option<u64>> {
        let fixed = |ty: u32| -> Option<u64> {
            match ty {
                0 | 1 | 7 => Some(1),
                2 | 3 => Some(2),
                4..=6 => Some(4),
                10..=12 => Some(8),
                _ => None,
            }
        };
        match ty {
            8 => {
                self.string(key)?;
                Ok(None)
            }
            9 => {
                if depth >= MAX_ARRAY_DEPTH {
                    return Err(bad(format!("metadata `{key}`: arrays nested too deeply")));
                }
                let elem = self.u32(key)?;
                let count = self.u64(key)?;
                match fixed(elem) {
                    Some(size) => {
                        let bytes =
                            count.checked_mul(size).ok_or_else(|| bad(format!("metadata `{key}`: array too large")))?;
                        self.take(bytes, key)?;
                    }
                    None => {
                        // Strings and arrays: each takes at least 8 bytes, so the count is
                        // bounded by the bytes left before we loop over it.
                        let left = (self.b.len() - self.pos) as u64;
                        if count > left / 8 {
                            return Err(bad(format!("metadata `{key}`: {count} entries cannot fit in {left} bytes")));
                        }
                        for _ in 0..count {
                            self.value(elem, depth + 1, key)?;
                        }
                    }
                }
                Ok(None)
            }
            t => match fixed(t) {
                Some(size) => {
                    let s = self.take(size, key)?;
                    let mut a = [0u8; 8];
                    a[..s.len()].copy_from_slice(s);
                    Ok(Some(u64::from_le_bytes(a)))
                }
                None => Err(bad(format!("metadata `{key}` has unknown value type {t}"))),
            },
        }
    }
}

/// Bytes a tensor of `dims` in ggml type `dtype` occupies, checked.
/// `(values per block, bytes per block)` of the ggml types candle reads.
fn block_layout(dtype: u32) -> Option<(u64, u64)> {
    Some(match dtype {
        0 => (1, 4),      // F32
        1 | 30 => (1, 2), // F16, BF16
        2 => (32, 18),    // Q4_0
        3 => (32, 20),    // Q4_1
        6 => (32, 22),    // Q5_0
        7 => (32, 24),    // Q5_1
        8 => (32, 34),    // Q8_0
        9 => (32, 36),    // Q8_1
        10 => (256, 84),  // Q2_K
        11 => (256, 110),
        12 => (256, 144),
        13 => (256, 176),
        14 => (256, 210),
        15 => (256, 292), // Q8_K
        _ => return None,
    })
}

pub fn tensor_bytes(name: &str, dims: &[u64], dtype: u32) -> Result<u64> {
    let (block, block_bytes) =
        block_layout(dtype).ok_or_else(|| bad(format!("tensor `{name}` has unknown type {dtype}")))?;
    let elems = dims
        .iter()
        .try_fold(1u64, |acc, &d| acc.checked_mul(d))
        .ok_or_else(|| bad(format!("tensor `{name}`: dimensions {dims:?} overflow")))?;
    if elems % block != 0 {
        return Err(bad(format!("tensor `{name}`: {elems} values are not whole blocks of {block} (type {dtype})")));
    }
    (elems / block).checked_mul(block_bytes).ok_or_else(|| bad(format!("tensor `{name}`: size overflows")))
}

/// Checks the whole header and the tensor layout of a GGUF file held in `bytes`.
pub fn check(bytes: &[u8]) -> Result<Header> {
    let mut r = Reader { b: bytes, pos: 0 };
    if r.u32("magic")? != MAGIC {
        return Err(bad("wrong magic (expected GGUF)"));
    }
    let version = r.u32("version")?;
    if !(2..=3).contains(&version) {
        return Err(bad(format!("version {version} (tandem reads versions 2 and 3)")));
    }
    let n_tensors = r.u64("tensor count")?;
    let n_kv = r.u64("metadata count")?;
    // Every entry takes at least 8 bytes (a string length): counts cannot exceed the file.
    let cap = bytes.len() as u64 / 8;
    if n_tensors > cap || n_kv > cap {
        return Err(bad(format!(
            "{n_tensors} tensors and {n_kv} metadata entries cannot fit in {} bytes",
            bytes.len()
        )));
    }
    let mut alignment = 32u64;
    for _ in 0..n_kv {
        let key = String::from_utf8_lossy(r.string("metadata key")?).into_owned();
        let ty = r.u32(&key)?;
        let v = r.value(ty, 0, &key)?;
        if key == "general.alignment" {
            alignment = v.ok_or_else(|| bad("general.alignment is not an integer"))?;
            if alignment == 0 || !alignment.is_power_of_two() {
                return Err(bad(format!("general.alignment = {alignment} (must be a non-zero power of two)")));
            }
            // Tensors are read in place as f32 / f16 / i32 slices: an alignment below 8 lets a
            // file place them at addresses those types cannot start at (found by fuzzing).
            if alignment < 8 {
                return Err(bad(format!("general.alignment = {alignment} (tandem needs at least 8; writers use 32)")));
            }
        }
    }
    let mut tensors = Vec::with_capacity(n_tensors.min(4096) as usize);
    for _ in 0..n_tensors {
        let name = String::from_utf8_lossy(r.string("tensor name")?).into_owned();
        let n_dims = r.u32(&name)?;
        if n_dims > MAX_DIMS {
            return Err(bad(format!("tensor `{name}` has {n_dims} dimensions")));
        }
        let dims = (0..n_dims).map(|_| r.u64(&name)).collect::<Result<Vec<_>>>()?;
        let dtype = r.u32(&name)?;
        let offset = r.u64(&name)?;
        tensors.push(TensorEntry { name, dims, dtype, offset });
    }
    let data_start = (r.pos as u64).div_ceil(alignment) * alignment;
    let file_len = bytes.len() as u64;
    let mut spans = Vec::with_capacity(tensors.len());
    for t in &tensors {
        let size = tensor_bytes(&t.name, &t.dims, t.dtype)?;
        // An empty tensor would be read into an empty buffer whose dangling address is not
        // aligned for its element type (undefined behaviour in the reader; found by fuzzing).
        if size == 0 || t.dims.contains(&0) {
            return Err(bad(format!("tensor `{}` has no elements (shape {:?})", t.name, t.dims)));
        }
        if t.offset % alignment != 0 {
            return Err(bad(format!("tensor `{}` at offset {} is not aligned to {alignment}", t.name, t.offset)));
        }
        let end = data_start
            .checked_add(t.offset)
            .and_then(|s| s.checked_add(size))
            .ok_or_else(|| bad(format!("tensor `{}`: offset {} overflows", t.name, t.offset)))?;
        if end > file_len {
            return Err(bad(format!(
                "tensor `{}` ends at byte {end} but the file has {file_len} bytes (truncated download?)",
                t.name
            )));
        }
        spans.push((t.offset, t.offset + size, &t.name));
    }
    spans.sort();
    for w in spans.windows(2) {
        if w[1].0 < w[0].1 {
            return Err(bad(format!("tensors `{}` and `{}` overlap", w[0].2, w[1].2)));
        }
    }
    Ok(Header { version, alignment, tensors, data_start })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A GGUF file: metadata `(key, type, value bytes)`, tensors `(name, dims, type, offset)`,
    /// and `data` bytes of tensor data after the aligned header.
    pub(crate) fn gguf(kv: &[(&str, u32, Vec<u8>)], tensors: &[(&str, &[u64], u32, u64)], data: usize) -> Vec<u8> {
        let mut b = Vec::new();
        b.extend(MAGIC.to_le_bytes());
        b.extend(3u32.to_le_bytes());
        b.extend((tensors.len() as u64).to_le_bytes());
        b.extend((kv.len() as u64).to_le_bytes());
        let s = |b: &mut Vec<u8>, x: &str| {
            b.extend((x.len() as u64).to_le_bytes());
            b.extend(x.as_bytes());
        };
        for (k, ty, v) in kv {
            s(&mut b, k);
            b.extend(ty.to_le_bytes());
            b.extend(v);
        }
        for (name, dims, ty, off) in tensors {
            s(&mut b, name);
            b.extend((dims.len() as u32).to_le_bytes());
            for d in *dims {
                b.extend(d.to_le_bytes());
            }
            b.extend(ty.to_le_bytes());
            b.extend(off.to_le_bytes());
        }
        while b.len() % 32 != 0 {
            b.push(0);
        }
        b.extend(std::iter::repeat_n(0u8, data));
        b
    }

    fn err(bytes: &[u8]) -> String {
        check(bytes).expect_err("must be refused").to_string()
    }

    const F32: u32 = 0;

    #[test]
    fn a_good_file_passes() {
        let b = gguf(
            &[("general.alignment", 4, 32u32.to_le_bytes().to_vec())],
            &[("a", &[4, 2], F32, 0), ("b", &[8], F32, 32)],
            64,
        );
        let h = check(&b).unwrap();
        assert_eq!((h.alignment, h.tensors.len(), h.data_start % 32), (32, 2, 0));
    }

    #[test]
    fn hostile_headers_are_errors_not_panics() {
        let align0 = gguf(&[("general.alignment", 4, 0u32.to_le_bytes().to_vec())], &[("a", &[8], F32, 0)], 32);
        assert!(err(&align0).contains("alignment = 0"), "{}", err(&align0));
        let align3 = gguf(&[("general.alignment", 4, 3u32.to_le_bytes().to_vec())], &[], 0);
        assert!(err(&align3).contains("power of two"));
        let align2 = gguf(&[("general.alignment", 4, 2u32.to_le_bytes().to_vec())], &[("a", &[8], F32, 2)], 32);
        assert!(err(&align2).contains("at least 8"), "{}", err(&align2));
        let empty = gguf(&[], &[("a", &[8, 0], F32, 0)], 32);
        assert!(err(&empty).contains("no elements"), "{}", err(&empty));
        let offset = gguf(&[], &[("a", &[8], F32, u64::MAX - 31)], 32);
        assert!(err(&offset).contains("overflows") || err(&offset).contains("aligned"), "{}", err(&offset));
        let offset = gguf(&[], &[("a", &[8], F32, (u64::MAX / 32) * 32)], 32);
        assert!(err(&offset).contains("overflows"), "{}", err(&offset));
        let dims = gguf(&[], &[("a", &[1 << 40, 1 << 40], F32, 0)], 32);
        assert!(err(&dims).contains("overflow"), "{}", err(&dims));
        let big = gguf(&[], &[("a", &[1 << 20], F32, 0)], 32);
        assert!(err(&big).contains("truncated"), "{}", err(&big));
        let overlap = gguf(&[], &[("a", &[16], F32, 0), ("b", &[16], F32, 32)], 128);
        assert!(err(&overlap).contains("overlap"), "{}", err(&overlap));
        let misaligned = gguf(&[], &[("a", &[4], F32, 4)], 64);
        assert!(err(&misaligned).contains("not aligned"), "{}", err(&misaligned));
        let badtype = gguf(&[], &[("a", &[4], 999, 0)], 64);
        assert!(err(&badtype).contains("unknown type"));
        let partial_block = gguf(&[], &[("a", &[7], 8, 0)], 64); // Q8_0 needs blocks of 32
        assert!(err(&partial_block).contains("whole"));
        // Counts that claim more entries than the file could hold.
        let mut counts = gguf(&[], &[], 0);
        counts[8..16].copy_from_slice(&(1u64 << 60).to_le_bytes());
        assert!(err(&counts).contains("cannot fit"));
        // A string array that claims 2^60 entries.
        let mut arr = 8u32.to_le_bytes().to_vec();
        arr.extend((1u64 << 60).to_le_bytes());
        let huge = gguf(&[("tokenizer.ggml.tokens", 9, arr)], &[], 0);
        assert!(err(&huge).contains("cannot fit"), "{}", err(&huge));
        // Every truncation of a good file is an error, never a panic.
        let good =
            gguf(&[("k", 8, [5u64.to_le_bytes().to_vec(), b"hello".to_vec()].concat())], &[("a", &[8], F32, 0)], 32);
        for n in 0..good.len() {
            assert!(check(&good[..n]).is_err(), "prefix of {n} bytes passed");
        }
        assert!(check(&good).is_ok());
    }
}
