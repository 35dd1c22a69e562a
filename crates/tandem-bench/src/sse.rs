//! Incremental Server-Sent Events parsing: bytes in (in any pieces), `data` payloads out.
//! Handles `\n`, `\r\n` and `\r` line ends, multi-line `data:` fields and comment lines.

/// Splits an SSE byte stream into events' `data` payloads.
#[derive(Debug, Default)]
pub struct SseParser {
    buf: Vec<u8>,
    data: Vec<String>,
    /// The previous chunk ended with `\r`; a `\n` at the start of the next one belongs to it.
    pending_cr: bool,
}

impl SseParser {
    pub fn new() -> Self {
        Self::default()
    }

    /// Feeds bytes; returns the `data` of every event completed by them (lines of a multi-line
    /// `data` field joined with `\n`). Invalid UTF-8 is replaced, never an error.
    pub fn feed(&mut self, bytes: &[u8]) -> Vec<String> {
        let mut out = Vec::new();
        let mut bytes = bytes;
        if self.pending_cr && bytes.first() == Some(&b'\n') {
            bytes = &bytes[1..];
        }
        self.pending_cr = false;
        let mut i = 0;
        while i < bytes.len() {
            match bytes[i] {
                b'\n' => self.end_line(&mut out),
                b'\r' => {
                    self.end_line(&mut out);
                    if bytes.get(i + 1) == Some(&b'\n') {
                        i += 1;
                    } else if i + 1 == bytes.len() {
                        self.pending_cr = true;
                    }
                }
                b => self.buf.push(b),
            }
            i += 1;
        }
        out
    }

    /// Ends the stream: a last event not followed by a blank line is still delivered.
    pub fn finish(&mut self) -> Vec<String> {
        let mut out = Vec::new();
        if !self.buf.is_empty() {
            self.end_line(&mut out);
        }
        if !self.data.is_empty() {
            out.push(std::mem::take(&mut self.data).join("\n"));
        }
        out
    }

    fn end_line(&mut self, out: &mut Vec<String>) {
        let line = String::from_utf8_lossy(&self.buf).into_owned();
        self.buf.clear();
        if line.is_empty() {
            if !self.data.is_empty() {
                out.push(std::mem::take(&mut self.data).join("\n"));
            }
            return;
        }
        if line.starts_with(':') {
            return;
        }
        let (field, value) = match line.split_once(':') {
            Some((f, v)) => (f, v.strip_prefix(' ').unwrap_or(v)),
            None => (line.as_str(), ""),
        };
        if field == "data" {
            self.data.push(value.to_string());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_split_anywhere() {
        let stream = b": comment\r\ndata: {\"a\":1}\r\n\r\nevent: x\ndata: two\ndata: lines\n\ndata: [DONE]\n\n";
        for cut in 0..stream.len() {
            let mut p = SseParser::new();
            let mut got = p.feed(&stream[..cut]);
            got.extend(p.feed(&stream[cut..]));
            got.extend(p.finish());
            assert_eq!(got, vec!["{\"a\":1}", "two\nlines", "[DONE]"], "cut at {cut}");
        }
    }

    #[test]
    fn unterminated_last_event_is_kept() {
        let mut p = SseParser::new();
        assert!(p.feed(b"data: x").is_empty());
        assert_eq!(p.finish(), vec!["x"]);
    }
}
