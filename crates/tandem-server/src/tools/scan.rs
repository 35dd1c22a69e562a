//! Incremental pieces of the streaming tool-call parser: the Hermes call header
//! (`{"name": "…", "arguments": ` up to the arguments object) and a strict JSON syntax scanner
//! that says, character by character, whether the arguments are still valid JSON and when the
//! object is complete.

/// Outcome of matching the start of a call body against a header grammar.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Header {
    /// Not enough text yet to decide.
    Incomplete,
    /// The text cannot be this header (the call is then parsed whole at its end).
    NoMatch,
    /// The header matched: the function name and the bytes it took (the arguments object
    /// starts right after).
    Match { name: String, consumed: usize },
}

struct Cursor<'a> {
    s: &'a str,
    i: usize,
}

enum Step {
    Ok,
    Incomplete,
    No,
}

impl Cursor<'_> {
    fn ws(&mut self) {
        let rest = &self.s[self.i..];
        self.i += rest.len() - rest.trim_start().len();
    }

    fn at_end(&self) -> bool {
        self.i >= self.s.len()
    }

    /// Consumes one of `lits`.
    fn lit(&mut self, lits: &[&str]) -> Step {
        let rest = &self.s[self.i..];
        if let Some(l) = lits.iter().find(|l| rest.starts_with(**l)) {
            self.i += l.len();
            return Step::Ok;
        }
        if lits.iter().any(|l| l.starts_with(rest)) {
            Step::Incomplete
        } else {
            Step::No
        }
    }

    /// Consumes a JSON string and returns its value.
    fn string(&mut self) -> Result<String, Step> {
        let rest = &self.s[self.i..];
        if rest.is_empty() {
            return Err(Step::Incomplete);
        }
        if !rest.starts_with('"') {
            return Err(Step::No);
        }
        let mut escaped = false;
        for (k, c) in rest.char_indices().skip(1) {
            match c {
                _ if escaped => escaped = false,
                '\\' => escaped = true,
                '"' => {
                    let v: String = serde_json::from_str(&rest[..=k]).map_err(|_| Step::No)?;
                    self.i += k + 1;
                    return Ok(v);
                }
                '\n' => return Err(Step::No),
                _ => {}
            }
        }
        Err(Step::Incomplete)
    }
}

/// Matches `{"name": "NAME", "arguments": ` (or `"parameters"`) followed by `{`.
pub(crate) fn hermes_header(s: &str) -> Header {
    let mut c = Cursor { s, i: 0 };
    macro_rules! step {
        ($e:expr) => {
            match $e {
                Step::Ok => {}
                Step::Incomplete => return Header::Incomplete,
                Step::No => return Header::NoMatch,
            }
        };
    }
    c.ws();
    step!(c.lit(&["{"]));
    c.ws();
    step!(c.lit(&["\"name\""]));
    c.ws();
    step!(c.lit(&[":"]));
    c.ws();
    let name = match c.string() {
        Ok(n) => n,
        Err(Step::Incomplete) => return Header::Incomplete,
        Err(_) => return Header::NoMatch,
    };
    let name = name.trim().to_string();
    if name.is_empty() {
        return Header::NoMatch;
    }
    c.ws();
    step!(c.lit(&[","]));
    c.ws();
    step!(c.lit(&["\"arguments\"", "\"parameters\""]));
    c.ws();
    step!(c.lit(&[":"]));
    c.ws();
    if c.at_end() {
        return Header::Incomplete;
    }
    if !s[c.i..].starts_with('{') {
        return Header::NoMatch;
    }
    Header::Match { name, consumed: c.i }
}

/// What one character did to the scanned value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Feed {
    More,
    /// The character completed the value.
    Done,
    /// The character cannot continue valid JSON (it is not part of the value).
    Reject,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Expect {
    Value,
    KeyOrEnd,
    Key,
    Colon,
    CommaOrEnd,
    ValueOrEnd,
    ArrCommaOrEnd,
}

#[derive(Debug, Clone, Copy)]
struct Str {
    key: bool,
    escape: bool,
    hex: u8,
}

/// Deepest nesting accepted.
const MAX_DEPTH: usize = 256;

/// A strict, incremental JSON syntax scanner for one value.
#[derive(Debug, Clone)]
pub(crate) struct JsonScan {
    stack: Vec<u8>,
    expect: Expect,
    string: Option<Str>,
    literal: Option<(&'static [u8], usize)>,
    number: bool,
}

impl JsonScan {
    pub fn new() -> Self {
        Self { stack: Vec::new(), expect: Expect::Value, string: None, literal: None, number: false }
    }

    pub fn feed(&mut self, c: char) -> Feed {
        if let Some(s) = &mut self.string {
            if s.hex > 0 {
                if !c.is_ascii_hexdigit() {
                    return Feed::Reject;
                }
                s.hex -= 1;
                return Feed::More;
            }
            if s.escape {
                s.escape = false;
                return match c {
                    'u' => {
                        s.hex = 4;
                        Feed::More
                    }
                    '"' | '\\' | '/' | 'b' | 'f' | 'n' | 'r' | 't' => Feed::More,
                    _ => Feed::Reject,
                };
            }
            return match c {
                '\\' => {
                    s.escape = true;
                    Feed::More
                }
                '"' => {
                    let key = s.key;
                    self.string = None;
                    if key {
                        self.expect = Expect::Colon;
                        Feed::More
                    } else {
                        self.after_value()
                    }
                }
                c if (c as u32) < 0x20 => Feed::Reject,
                _ => Feed::More,
            };
        }
        if let Some((lit, n)) = &mut self.literal {
            if lit.get(*n) != Some(&(c as u8)) || !c.is_ascii() {
                return Feed::Reject;
            }
            *n += 1;
            if *n == lit.len() {
                self.literal = None;
                return self.after_value();
            }
            return Feed::More;
        }
        if self.number {
            if c.is_ascii_digit() || matches!(c, '+' | '-' | '.' | 'e' | 'E') {
                return Feed::More;
            }
            self.number = false;
            if self.after_value() == Feed::Done {
                return Feed::Reject;
            }
        }
        if c.is_ascii_whitespace() {
            return Feed::More;
        }
        match (self.expect, c) {
            (Expect::Value | Expect::ValueOrEnd, '{') => self.open(b'{', Expect::KeyOrEnd),
            (Expect::Value | Expect::ValueOrEnd, '[') => self.open(b'[', Expect::ValueOrEnd),
            (Expect::Value | Expect::ValueOrEnd, '"') => {
                self.string = Some(Str { key: false, escape: false, hex: 0 });
                Feed::More
            }
            (Expect::Value | Expect::ValueOrEnd, 't' | 'f' | 'n') => {
                let lit: &'static [u8] = match c {
                    't' => b"true",
                    'f' => b"false",
                    _ => b"null",
                };
                self.literal = Some((lit, 1));
                Feed::More
            }
            (Expect::Value | Expect::ValueOrEnd, '-' | '0'..='9') => {
                self.number = true;
                Feed::More
            }
            (Expect::ValueOrEnd, ']')
            | (Expect::ArrCommaOrEnd, ']')
            | (Expect::KeyOrEnd, '}')
            | (Expect::CommaOrEnd, '}') => {
                self.stack.pop();
                self.after_value()
            }
            (Expect::KeyOrEnd | Expect::Key, '"') => {
                self.string = Some(Str { key: true, escape: false, hex: 0 });
                Feed::More
            }
            (Expect::Colon, ':') => {
                self.expect = Expect::Value;
                Feed::More
            }
            (Expect::CommaOrEnd, ',') => {
                self.expect = Expect::Key;
                Feed::More
            }
            (Expect::ArrCommaOrEnd, ',') => {
                self.expect = Expect::Value;
                Feed::More
            }
            _ => Feed::Reject,
        }
    }

    fn open(&mut self, kind: u8, next: Expect) -> Feed {
        if self.stack.len() >= MAX_DEPTH {
            return Feed::Reject;
        }
        self.stack.push(kind);
        self.expect = next;
        Feed::More
    }

    fn after_value(&mut self) -> Feed {
        match self.stack.last() {
            None => Feed::Done,
            Some(b'{') => {
                self.expect = Expect::CommaOrEnd;
                Feed::More
            }
            Some(_) => {
                self.expect = Expect::ArrCommaOrEnd;
                Feed::More
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scan(s: &str) -> (Feed, usize) {
        let mut j = JsonScan::new();
        for (i, c) in s.char_indices() {
            match j.feed(c) {
                Feed::More => {}
                other => return (other, i),
            }
        }
        (Feed::More, s.len())
    }

    #[test]
    fn json_scanner() {
        let good = r#"{"a": [1, -2.5e3, true, null, {"b": "x\"\u00e9"}], "c": {}}"#;
        assert_eq!(scan(good), (Feed::Done, good.len() - 1));
        assert_eq!(scan(r#"{"a": 1} tail"#).0, Feed::Done);
        assert_eq!(scan(r#"{"a": 1"#).0, Feed::More);
        for bad in [
            r#"{"a" 1}"#,
            r#"{"a": tru}"#,
            r#"{a: 1}"#,
            r#"{"a": 1,}"#,
            "{\"a\": \"\n\"}",
            r#"{"a": 1</tool_call>"#,
            r#"{"a": [1 2]}"#,
        ] {
            assert_eq!(scan(bad).0, Feed::Reject, "{bad}");
        }
        for good in [r#"{"a": 10}"#, r#"{"a": [1]}"#, "{}"] {
            assert_eq!(scan(good).0, Feed::Done, "{good}");
        }
    }

    #[test]
    fn headers() {
        let h = "\n{\"name\": \"get_weather\", \"arguments\": {\"city\"";
        let Header::Match { name, consumed } = hermes_header(h) else { panic!("{h}") };
        assert_eq!((name.as_str(), &h[consumed..consumed + 1]), ("get_weather", "{"));
        for partial in
            ["", "\n{", "{\"na", "{\"name\": \"get_w", "{\"name\": \"f\", \"par", "{\"name\": \"f\", \"arguments\":"]
        {
            assert_eq!(hermes_header(partial), Header::Incomplete, "{partial}");
        }
        for other in [
            "x",
            "{\"arguments\": {}, \"name\": \"f\"}",
            "{\"name\": \"\", \"arguments\": {}}",
            "{\"name\": \"f\"}",
            "{\"name\": \"f\", \"arguments\": \"{}\"}",
        ] {
            assert_eq!(hermes_header(other), Header::NoMatch, "{other}");
        }
    }
}
