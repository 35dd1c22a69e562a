//! `tandem-cache`: the bookkeeping of KV memory and recurrent state, independent of any model.
//!
//! * [`BlockPool`]: a fixed number of KV blocks (16 token positions each by default) with
//!   reference counts and a free list; the memory itself lives with the model
//!   (`tandem_model::kv::PagedKvStore`), indexed by the block ids handed out here.
//! * [`BlockTable`]: one sequence's ordered block ids, with copy-on-write of shared blocks
//!   it is about to write into.
//! * [`PrefixTree`]: full token blocks linked by a hash chain, each node holding a
//!   reference to the KV block computed for it, optionally a recurrent-state checkpoint
//!   (a generic payload with its byte size), LRU eviction of unreferenced leaves and a
//!   separate byte budget with LRU for checkpoints.
//! * [`StateSlots`]: the fixed set of recurrent-state slots a running sequence occupies.
//! * [`MemoryBudget`]: "bytes or a fraction of RAM", as the `--kv-memory` flag takes it.
//!
//! Data enters as token ids and block ids from the engine's scheduler and leaves as block
//! ids (a prefix hit, blocks to copy) and checkpoint payloads; nothing here knows about
//! tensors, requests or HTTP.

mod budget;
mod pool;
mod prefix;
mod slots;
mod table;

pub use budget::MemoryBudget;
pub use pool::{BlockId, BlockPool};
pub use prefix::{NodeRef, PrefixMatch, PrefixTree};
pub use slots::{SlotId, StateSlots};
pub use table::{BlockCopy, BlockTable};

/// Default number of token positions per KV block.
pub const DEFAULT_BLOCK_SIZE: usize = 16;

/// Everything that can go wrong in the cache bookkeeping.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CacheError {
    #[error("out of KV blocks: {needed} needed, {free} free")]
    OutOfBlocks { needed: usize, free: usize },
    #[error("KV block {0} is not allocated")]
    NotAllocated(BlockId),
    #[error("state slot {0} is not in use")]
    SlotNotInUse(SlotId),
    #[error("prefix tree node is gone (evicted)")]
    StaleNode,
    #[error("invalid cache setting: {0}")]
    Config(String),
    #[error("cannot write positions {start}..{end}: the table covers {covered} positions")]
    Hole { start: usize, end: usize, covered: usize },
}

pub type Result<T> = std::result::Result<T, CacheError>;
