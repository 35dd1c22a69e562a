//! Stored responses for `GET /v1/responses/{id}` and `previous_response_id`: each response
//! object and its conversation (chat messages, without instructions) kept in memory, bounded
//! in count and bytes, the least recently used dropped first. A continued conversation is
//! re-rendered from these messages; the prefix cache then serves the part already computed.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;

use serde_json::Value;

/// Responses kept at most.
pub const MAX_ENTRIES: usize = 1024;
/// Bytes (of serialised JSON) kept at most.
pub const MAX_BYTES: usize = 64 << 20;

struct Entry {
    response: Value,
    conversation: Vec<Value>,
    bytes: usize,
}

#[derive(Default)]
struct Inner {
    map: HashMap<String, Entry>,
    /// Least recently used first.
    order: VecDeque<String>,
    bytes: usize,
}

/// The bounded store.
pub struct ResponseStore {
    inner: Mutex<Inner>,
    max_entries: usize,
    max_bytes: usize,
}

impl Default for ResponseStore {
    fn default() -> Self {
        Self::new(MAX_ENTRIES, MAX_BYTES)
    }
}

impl ResponseStore {
    pub fn new(max_entries: usize, max_bytes: usize) -> Self {
        Self { inner: Mutex::new(Inner::default()), max_entries: max_entries.max(1), max_bytes }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Keeps a response; one larger than the whole budget is not kept.
    pub fn put(&self, id: &str, response: Value, conversation: Vec<Value>) {
        let bytes = response.to_string().len() + conversation.iter().map(|m| m.to_string().len()).sum::<usize>();
        if bytes > self.max_bytes {
            return;
        }
        let mut g = self.lock();
        remove(&mut g, id);
        while !g.order.is_empty() && (g.order.len() >= self.max_entries || g.bytes + bytes > self.max_bytes) {
            let oldest = g.order.pop_front().expect("not empty");
            if let Some(e) = g.map.remove(&oldest) {
                g.bytes -= e.bytes;
            }
        }
        g.bytes += bytes;
        g.order.push_back(id.to_string());
        g.map.insert(id.to_string(), Entry { response, conversation, bytes });
    }

    /// The response and its conversation, marked as recently used.
    pub fn get(&self, id: &str) -> Option<(Value, Vec<Value>)> {
        let mut g = self.lock();
        let found = g.map.get(id).map(|e| (e.response.clone(), e.conversation.clone()))?;
        if let Some(pos) = g.order.iter().position(|k| k == id) {
            g.order.remove(pos);
        }
        g.order.push_back(id.to_string());
        Some(found)
    }

    /// Forgets a response; whether it was there.
    pub fn delete(&self, id: &str) -> bool {
        remove(&mut self.lock(), id)
    }

    /// Responses and bytes held.
    pub fn usage(&self) -> (usize, usize) {
        let g = self.lock();
        (g.map.len(), g.bytes)
    }
}

fn remove(g: &mut Inner, id: &str) -> bool {
    let Some(e) = g.map.remove(id) else { return false };
    g.bytes -= e.bytes;
    if let Some(pos) = g.order.iter().position(|k| k == id) {
        g.order.remove(pos);
    }
    true
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn bounded_and_least_recently_used_first() {
        let s = ResponseStore::new(3, 1 << 20);
        for id in ["a", "b", "c"] {
            s.put(id, json!({"id": id}), vec![json!({"role": "user", "content": id})]);
        }
        assert!(s.get("a").is_some()); // a is now the most recent
        s.put("d", json!({"id": "d"}), vec![]);
        assert!(s.get("b").is_none(), "the least recently used went first");
        assert_eq!(s.get("a").unwrap().1[0]["content"], "a");
        assert_eq!(s.usage().0, 3);
        assert!(s.delete("a") && !s.delete("a"));
        // A byte budget: an entry too large for it is never kept, others push the old out.
        let small = ResponseStore::new(100, 200);
        small.put("huge", json!({"x": "y".repeat(500)}), vec![]);
        assert!(small.get("huge").is_none());
        for i in 0..10 {
            small.put(&i.to_string(), json!({"x": "y".repeat(50)}), vec![]);
        }
        let (n, bytes) = small.usage();
        assert!(bytes <= 200 && n < 10 && small.get("9").is_some(), "{n} entries, {bytes} bytes");
    }
}
