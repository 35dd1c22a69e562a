//! A sequence's cache bookkeeping: its block table, recurrent-state slot, place in the prefix
//! tree, the checkpoint positions still ahead of it and the decode checkpoint kept for the next
//! turn, its disk-tier keys. [`super::EngineCache`] is its only writer (the fields are private to the `cache`
//! module); the scheduler reads what it plans with through methods.

use tandem_cache::{BlockTable, NodeRef, SlotId};
use tandem_model::kv::RecurrentSnapshot;

pub(crate) struct CacheBook {
    pub(super) table: BlockTable,
    pub(super) slot: Option<SlotId>,
    /// Full blocks of the sequence's tokens already in the prefix tree and the node of the last.
    pub(super) tree_blocks: usize,
    pub(super) tree_node: Option<NodeRef>,
    /// A hash collision stopped prefix caching for this sequence.
    pub(super) tree_stuck: bool,
    /// Block-aligned positions at which to checkpoint recurrent state, ascending.
    pub(super) checkpoints: Vec<usize>,
    /// Recurrent state at the last block boundary reached while generating, and the prefix
    /// tree node of that block: kept as a checkpoint when the request finishes, so that the
    /// next turn of a conversation resumes after the answer, not at the previous prompt's end.
    pub(super) decode_checkpoint: Option<(NodeRef, RecurrentSnapshot)>,
    /// The disk tier's chain keys of the sequence's first blocks (computed as they are needed).
    pub(super) disk_keys: Vec<super::disk::Key>,
    /// Prompt tokens this sequence got from the disk tier at admission.
    pub(super) disk_tokens: usize,
}

impl CacheBook {
    pub fn new() -> Self {
        Self {
            table: BlockTable::new(),
            slot: None,
            tree_blocks: 0,
            tree_node: None,
            tree_stuck: false,
            checkpoints: Vec::new(),
            decode_checkpoint: None,
            disk_keys: Vec::new(),
            disk_tokens: 0,
        }
    }

    /// Prompt tokens the sequence got from the disk tier.
    pub fn disk_tokens(&self) -> usize {
        self.disk_tokens
    }

    /// The next checkpoint position after `pos`: a step must not run past it (it would skip it).
    pub fn next_checkpoint_after(&self, pos: usize) -> Option<usize> {
        self.checkpoints.iter().copied().find(|&c| c > pos)
    }
}
