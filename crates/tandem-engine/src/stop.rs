//! Stop-string detection on streamed text.
//!
//! Decoded text enters piece by piece through [`StopStringMatcher::push`]; what can no longer
//! be part of a stop string leaves at once, while a tail that could still grow into one is held
//! back. When a stop string completes, the text before it is released, everything from the
//! match on is discarded and the matcher remembers which string it was
//! ([`StopStringMatcher::matched_stop`]). Held text always ends on a UTF-8 character boundary
//! because it is a suffix of a `String` that starts at a character boundary.

/// Finds the earliest occurrence of any of a set of stop strings in a stream of text.
#[derive(Debug, Clone, Default)]
pub struct StopStringMatcher {
    stops: Vec<String>,
    /// Longest stop string, in bytes.
    max_len: usize,
    /// Text received but not yet released: a suffix that may be the start of a stop string.
    held: String,
    /// The stop string that matched (index into `stops`); nothing more is emitted after it.
    matched: Option<usize>,
}

impl StopStringMatcher {
    /// A matcher for `stops`; empty strings are ignored (and duplicates dropped).
    pub fn new(stops: &[String]) -> Self {
        let mut v: Vec<String> = stops.iter().filter(|s| !s.is_empty()).cloned().collect();
        v.sort();
        v.dedup();
        let max_len = v.iter().map(|s| s.len()).max().unwrap_or(0);
        Self { stops: v, max_len, held: String::new(), matched: None }
    }

    /// True when there is at least one stop string to look for.
    pub fn is_active(&self) -> bool {
        !self.stops.is_empty()
    }

    /// True once a stop string has matched.
    pub fn is_matched(&self) -> bool {
        self.matched.is_some()
    }

    /// The stop string that ended the text, once one has matched.
    pub fn matched_stop(&self) -> Option<&str> {
        self.matched.map(|i| self.stops[i].as_str())
    }

    /// Feeds newly decoded text. Returns the text that is safe to emit now and whether a stop
    /// string completed. On a match the returned text is everything before the (earliest)
    /// match and the rest is discarded; after a match every call returns `("", true)`.
    pub fn push(&mut self, text: &str) -> (String, bool) {
        if self.matched.is_some() {
            return (String::new(), true);
        }
        if self.stops.is_empty() {
            return (text.to_owned(), false);
        }
        self.held.push_str(text);

        // Earliest match start; among matches at the same start the shortest (it completed
        // first); that one is reported by `matched_stop`.
        let found = self
            .stops
            .iter()
            .enumerate()
            .filter_map(|(i, s)| self.held.find(s.as_str()).map(|p| (p, s.len(), i)))
            .min();
        if let Some((pos, _, i)) = found {
            self.matched = Some(i);
            let mut out = std::mem::take(&mut self.held);
            out.truncate(pos);
            return (out, true);
        }

        let keep_from = self.holdback_start();
        let rest = self.held.split_off(keep_from);
        let out = std::mem::replace(&mut self.held, rest);
        (out, false)
    }

    /// Releases the held-back text at the end of generation (empty after a match).
    pub fn flush(&mut self) -> String {
        std::mem::take(&mut self.held)
    }

    /// Byte offset in `held` where the longest suffix that is a proper prefix of some stop
    /// string begins (`held.len()` when there is none). Only character boundaries are tried.
    fn holdback_start(&self) -> usize {
        let len = self.held.len();
        let earliest = len.saturating_sub(self.max_len.saturating_sub(1));
        self.held
            .char_indices()
            .map(|(i, _)| i)
            .skip_while(|&i| i < earliest)
            .find(|&i| {
                let tail = &self.held.as_bytes()[i..];
                self.stops.iter().any(|s| s.len() > tail.len() && s.as_bytes().starts_with(tail))
            })
            .unwrap_or(len)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn matcher(stops: &[&str]) -> StopStringMatcher {
        StopStringMatcher::new(&stops.iter().map(|s| s.to_string()).collect::<Vec<_>>())
    }

    /// Pushes every piece, collecting emitted text; returns (text, matched) with the flush
    /// appended when nothing matched.
    fn run(m: &mut StopStringMatcher, pieces: &[&str]) -> (String, bool) {
        let mut out = String::new();
        for p in pieces {
            let (t, hit) = m.push(p);
            out.push_str(&t);
            if hit {
                return (out, true);
            }
        }
        out.push_str(&m.flush());
        (out, false)
    }

    #[test]
    fn no_stops_passes_through() {
        let mut m = StopStringMatcher::new(&[String::new()]);
        assert!(!m.is_active());
        assert_eq!(m.push("hello"), ("hello".to_string(), false));
        assert_eq!(m.flush(), "");
    }

    #[test]
    fn whole_stop_in_one_piece() {
        let mut m = matcher(&["END"]);
        assert_eq!(m.push("abcENDxyz"), ("abc".to_string(), true));
        assert!(m.is_matched());
        assert_eq!(m.push("more"), (String::new(), true));
        assert_eq!(m.flush(), "");
    }

    #[test]
    fn stop_split_across_many_pushes() {
        let mut m = matcher(&["<|end|>"]);
        assert_eq!(m.push("Hello <"), ("Hello ".to_string(), false));
        assert_eq!(m.push("|"), (String::new(), false));
        assert_eq!(m.push("en"), (String::new(), false));
        assert_eq!(m.push("d|"), (String::new(), false));
        assert_eq!(m.push(">tail"), (String::new(), true));
    }

    #[test]
    fn partial_prefix_that_does_not_match_is_released() {
        let mut m = matcher(&["STOP"]);
        assert_eq!(m.push("a ST"), ("a ".to_string(), false));
        assert_eq!(m.push("O"), (String::new(), false));
        // "STORE" is not "STOP": release the held text, keep nothing.
        assert_eq!(m.push("RE"), ("STORE".to_string(), false));
        // Held text at the end comes back from flush.
        assert_eq!(m.push("x STO"), ("x ".to_string(), false));
        assert_eq!(m.flush(), "STO");
    }

    #[test]
    fn overlapping_prefix_restarts_inside_held_text() {
        // "aab" is the stop; "aaab" contains it starting at index 1.
        let mut m = matcher(&["aab"]);
        assert_eq!(run(&mut m, &["a", "a", "a", "b", "c"]), ("a".to_string(), true));
    }

    #[test]
    fn earliest_match_wins_among_several_stops() {
        let mut m = matcher(&["world", "lo w"]);
        assert_eq!(m.push("hello world"), ("hel".to_string(), true));
        let mut m = matcher(&["bc", "abcd"]);
        // "abcd" starts earlier but is still incomplete when "bc" completes: the stream stops
        // at "bc" (generation cannot wait for a longer stop that might never come).
        assert_eq!(run(&mut m, &["xa", "b", "c", "d"]), ("xa".to_string(), true));
        let mut m = matcher(&["cd", "abcd"]);
        assert_eq!(m.push("xabcd"), ("x".to_string(), true));
    }

    #[test]
    fn multi_byte_characters_are_never_split() {
        let mut m = matcher(&["é终"]);
        assert_eq!(m.push("café"), ("caf".to_string(), false));
        assert_eq!(m.push("s"), ("és".to_string(), false));
        assert_eq!(m.push("é"), (String::new(), false));
        assert_eq!(m.push("终了"), (String::new(), true));

        // A stop that starts with the second byte sequence of a char never matches mid-char.
        let mut m = matcher(&["\u{a9}x"]); // "©x"; '©' = C2 A9
        let (t, hit) = run(&mut m, &["\u{e9}", "\u{a9}", "y"]);
        assert_eq!((t.as_str(), hit), ("é©y", false));

        let mut m = matcher(&["🙂!"]);
        assert_eq!(run(&mut m, &["a🙂", "🙂", "!b"]), ("a🙂".to_string(), true));
    }

    #[test]
    fn remembers_which_stop_matched() {
        let mut m = matcher(&["</answer>", "\nObservation:", "END"]);
        assert_eq!(m.matched_stop(), None);
        assert_eq!(run(&mut m, &["42 ", "</ans", "wer> END"]), ("42 ".to_string(), true));
        assert_eq!(m.matched_stop(), Some("</answer>"));
        // Later pushes change nothing.
        assert_eq!(m.push("END"), (String::new(), true));
        assert_eq!(m.matched_stop(), Some("</answer>"));

        // Earliest start wins; at the same start, the shorter one (it completed first).
        let mut m = matcher(&["world", "lo w"]);
        m.push("hello world");
        assert_eq!(m.matched_stop(), Some("lo w"));
        let mut m = matcher(&["abcd", "ab"]);
        m.push("xabcd");
        assert_eq!(m.matched_stop(), Some("ab"));
        let mut m = matcher(&["bc", "abcd"]);
        run(&mut m, &["xa", "b", "c", "d"]);
        assert_eq!(m.matched_stop(), Some("bc"));

        // No match, or no stops: nothing to report.
        let mut m = matcher(&["nope"]);
        assert_eq!(run(&mut m, &["no", "p"]), ("nop".to_string(), false));
        assert_eq!(m.matched_stop(), None);
        let mut m = StopStringMatcher::new(&[]);
        m.push("anything");
        assert_eq!(m.matched_stop(), None);
    }

    #[test]
    fn text_split_character_by_character() {
        let text = "The answer is 42.\n\nObservation: done";
        let pieces: Vec<String> = text.chars().map(|c| c.to_string()).collect();
        let refs: Vec<&str> = pieces.iter().map(|s| s.as_str()).collect();
        let mut m = matcher(&["\nObservation:", "Final"]);
        assert_eq!(run(&mut m, &refs), ("The answer is 42.\n".to_string(), true));
        let mut m = matcher(&["nope"]);
        assert_eq!(run(&mut m, &refs), (text.to_string(), false));
    }
}
