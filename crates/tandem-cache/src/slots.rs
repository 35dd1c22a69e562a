//! Recurrent-state slots: a running sequence of a model with recurrent layers holds one slot
//! (its conv + SSM state) from admission until it finishes, is cancelled or preempted.

use crate::{CacheError, Result};

pub type SlotId = u32;

#[derive(Debug)]
pub struct StateSlots {
    in_use: Vec<bool>,
    free: Vec<SlotId>,
}

impl StateSlots {
    pub fn new(total: usize) -> Self {
        Self { in_use: vec![false; total], free: (0..total as SlotId).rev().collect() }
    }

    pub fn total(&self) -> usize {
        self.in_use.len()
    }

    pub fn free_count(&self) -> usize {
        self.free.len()
    }

    pub fn acquire(&mut self) -> Option<SlotId> {
        let id = self.free.pop()?;
        self.in_use[id as usize] = true;
        Some(id)
    }

    pub fn release(&mut self, id: SlotId) -> Result<()> {
        match self.in_use.get_mut(id as usize) {
            Some(u) if *u => {
                *u = false;
                self.free.push(id);
                Ok(())
            }
            _ => Err(CacheError::SlotNotInUse(id)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn acquire_release() {
        let mut s = StateSlots::new(2);
        let a = s.acquire().unwrap();
        let b = s.acquire().unwrap();
        assert_ne!(a, b);
        assert_eq!(s.acquire(), None);
        s.release(a).unwrap();
        assert_eq!(s.release(a), Err(CacheError::SlotNotInUse(a)));
        assert_eq!(s.free_count(), 1);
        s.release(b).unwrap();
        assert_eq!(s.free_count(), s.total());
    }
}
