//! The on-disk entry format of the prefix cache's disk tier: one file per KV block or
//! recurrent checkpoint, a fixed header, the token ids the entry stands for, the payload.
//!
//! ```text
//!  0  magic "TNDMPC\0\x01"         8 bytes
//!  8  format version               u32
//! 12  kind (1 block, 2 checkpoint) u8, 3 bytes zero
//! 16  namespace fingerprint        u128
//! 32  key (chain hash)             u128
//! 48  parent key                   u128 (blocks; 0 for checkpoints)
//! 64  position after the entry     u64
//! 72  token count                  u32, 4 bytes zero
//! 80  payload length               u64
//! 88  checksum                     u64: xxh3-64 of bytes 0..88, the tokens and the payload
//! 96  tokens (u32 LE), then the payload
//! ```
//! All integers little-endian. A block carries its own 16 token ids and its parent's key, a
//! checkpoint every token id of the prefix it was taken after, so whatever the hash does, an
//! entry is only used for exactly the tokens it was computed for. [`decode`] checks all of it.

use xxhash_rust::xxh3::{xxh3_128, xxh3_64};

pub const MAGIC: [u8; 8] = *b"TNDMPC\0\x01";
/// Bump when the layout or the meaning of a payload changes (the namespace includes it).
/// 2: checkpoints carry sliding-window rows; blocks hold only the paged (non-ring) layers.
pub const FORMAT_VERSION: u32 = 2;
pub const HEADER: usize = 96;

/// A chain hash: the key of a block is `hash(parent key, its tokens)`, from [`ROOT`].
pub type Key = u128;
pub const ROOT: Key = 0x7461_6e64_656d_2d64_6973_6b2d_726f_6f74;

/// The key of the block holding `tokens` after the block keyed `parent`.
pub fn chain_key(parent: Key, tokens: &[u32]) -> Key {
    let mut buf = Vec::with_capacity(16 + 4 * tokens.len());
    buf.extend(parent.to_le_bytes());
    buf.extend(tokens.iter().flat_map(|t| t.to_le_bytes()));
    xxh3_128(&buf)
}

/// The keys of the first `n` full blocks of `tokens`.
pub fn chain_keys(tokens: &[u32], block_size: usize, n: usize) -> Vec<Key> {
    let mut keys = Vec::with_capacity(n);
    let mut k = ROOT;
    for blk in tokens.chunks_exact(block_size).take(n) {
        k = chain_key(k, blk);
        keys.push(k);
    }
    keys
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Kind {
    Block = 1,
    Checkpoint = 2,
}

impl Kind {
    /// The file name extension.
    pub fn ext(self) -> &'static str {
        match self {
            Kind::Block => "kvb",
            Kind::Checkpoint => "ckp",
        }
    }
}

/// Why an entry was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reject {
    Truncated,
    Magic,
    Version,
    /// Written for another model or cache format (fingerprint).
    Foreign,
    /// Not the entry its name says (renamed, or another key's file).
    WrongEntry,
    Checksum,
    /// Valid, but for other tokens than asked (a hash collision).
    Tokens,
}

pub struct Header {
    pub kind: Kind,
    pub fingerprint: u128,
    pub key: Key,
    pub parent: Key,
    pub position: u64,
}

pub fn encode(h: &Header, tokens: &[u32], payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(HEADER + 4 * tokens.len() + payload.len());
    out.extend(MAGIC);
    out.extend(FORMAT_VERSION.to_le_bytes());
    out.extend([h.kind as u8, 0, 0, 0]);
    out.extend(h.fingerprint.to_le_bytes());
    out.extend(h.key.to_le_bytes());
    out.extend(h.parent.to_le_bytes());
    out.extend(h.position.to_le_bytes());
    out.extend((tokens.len() as u32).to_le_bytes());
    out.extend([0u8; 4]);
    out.extend((payload.len() as u64).to_le_bytes());
    out.extend([0u8; 8]);
    out.extend(tokens.iter().flat_map(|t| t.to_le_bytes()));
    out.extend_from_slice(payload);
    let sum = checksum(&out);
    out[88..96].copy_from_slice(&sum.to_le_bytes());
    out
}

fn checksum(file: &[u8]) -> u64 {
    let mut buf = Vec::with_capacity(file.len() - 8);
    buf.extend_from_slice(&file[..88]);
    buf.extend_from_slice(&file[HEADER..]);
    xxh3_64(&buf)
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}
fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().unwrap_or([0; 8]))
}
fn u128_at(b: &[u8], at: usize) -> u128 {
    u128::from_le_bytes(b[at..at + 16].try_into().unwrap_or([0; 16]))
}

/// A checked entry.
pub struct Decoded<'a> {
    pub parent: Key,
    pub payload: &'a [u8],
}

/// Checks `file` against what the caller expects it to be: its kind, namespace and key, and
/// the tokens it must stand for; returns its payload.
pub fn decode<'a>(
    file: &'a [u8],
    kind: Kind,
    fingerprint: u128,
    key: Key,
    tokens: &[u32],
) -> Result<Decoded<'a>, Reject> {
    if file.len() < HEADER {
        return Err(Reject::Truncated);
    }
    if file[..8] != MAGIC {
        return Err(Reject::Magic);
    }
    if u32_at(file, 8) != FORMAT_VERSION {
        return Err(Reject::Version);
    }
    let n = u32_at(file, 72) as usize;
    let len = u64_at(file, 80);
    let want = (HEADER as u64).checked_add(4 * n as u64).and_then(|x| x.checked_add(len));
    if want != Some(file.len() as u64) {
        return Err(Reject::Truncated);
    }
    if u64_at(file, 88) != checksum(file) {
        return Err(Reject::Checksum);
    }
    if u128_at(file, 16) != fingerprint {
        return Err(Reject::Foreign);
    }
    if file[12] != kind as u8 || u128_at(file, 32) != key {
        return Err(Reject::WrongEntry);
    }
    let stored = &file[HEADER..HEADER + 4 * n];
    if n != tokens.len() || stored.chunks_exact(4).zip(tokens).any(|(b, &t)| u32_at(b, 0) != t) {
        return Err(Reject::Tokens);
    }
    Ok(Decoded { parent: u128_at(file, 48), payload: &file[HEADER + 4 * n..] })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_round_trip_and_every_change_is_refused() {
        let tokens: Vec<u32> = (100..116).collect();
        let key = chain_key(ROOT, &tokens);
        assert_eq!(chain_keys(&[tokens.clone(), tokens.clone()].concat(), 16, 5), vec![key, chain_key(key, &tokens)]);
        let h = Header { kind: Kind::Block, fingerprint: 7, key, parent: ROOT, position: 16 };
        let file = encode(&h, &tokens, b"payload bytes");
        let d = decode(&file, Kind::Block, 7, key, &tokens).ok().expect("valid");
        assert_eq!((d.parent, d.payload), (ROOT, &b"payload bytes"[..]));
        assert_eq!(decode(&file, Kind::Block, 8, key, &tokens).err(), Some(Reject::Foreign));
        assert_eq!(decode(&file, Kind::Checkpoint, 7, key, &tokens).err(), Some(Reject::WrongEntry));
        assert_eq!(decode(&file, Kind::Block, 7, key + 1, &tokens).err(), Some(Reject::WrongEntry));
        assert_eq!(decode(&file, Kind::Block, 7, key, &tokens[1..]).err(), Some(Reject::Tokens));
        assert_eq!(decode(&file[..file.len() - 1], Kind::Block, 7, key, &tokens).err(), Some(Reject::Truncated));
        assert_eq!(decode(&file[..40], Kind::Block, 7, key, &tokens).err(), Some(Reject::Truncated));
        for i in [0, 9, 20, 50, 70, 90, 100, file.len() - 1] {
            let mut bad = file.clone();
            bad[i] ^= 0x10;
            assert!(decode(&bad, Kind::Block, 7, key, &tokens).is_err(), "a flipped bit at byte {i} was accepted");
        }
    }
}
