//! The Python/transformers builtins Hugging Face chat templates expect, for minijinja.
//!
//! - `tojson`: transformers' version (Python `json.dumps`): `", "` / `": "` separators,
//!   `ensure_ascii=False` by default, optional `indent` and `sort_keys`, no HTML escaping.
//!   minijinja's own `tojson` is compact and HTML-escapes, which would change prompts.
//! - `raise_exception(msg)`: fails the render with `msg`.
//! - `strftime_now(fmt)`: the current UTC time formatted with the common `strftime` codes.
//! - [`strip_generation_tags`]: removes transformers' `{% generation %}` markers, which only
//!   matter for training masks.

use minijinja::value::{Kwargs, Value};
use minijinja::{Error, ErrorKind};
use serde::Serialize;

/// serde_json formatter that reproduces Python's `json.dumps` layout.
struct PyFormatter {
    indent: Option<Vec<u8>>,
    level: usize,
    has_value: bool,
}

impl PyFormatter {
    fn newline<W: ?Sized + std::io::Write>(&self, w: &mut W) -> std::io::Result<()> {
        if let Some(ind) = &self.indent {
            w.write_all(b"\n")?;
            for _ in 0..self.level {
                w.write_all(ind)?;
            }
        }
        Ok(())
    }
    fn open<W: ?Sized + std::io::Write>(&mut self, w: &mut W, c: &[u8]) -> std::io::Result<()> {
        self.level += 1;
        self.has_value = false;
        w.write_all(c)
    }
    fn close<W: ?Sized + std::io::Write>(&mut self, w: &mut W, c: &[u8]) -> std::io::Result<()> {
        self.level -= 1;
        if self.has_value {
            self.newline(w)?;
        }
        self.has_value = true;
        w.write_all(c)
    }
    fn item<W: ?Sized + std::io::Write>(&mut self, w: &mut W, first: bool) -> std::io::Result<()> {
        if !first {
            w.write_all(b",")?;
        }
        if self.indent.is_some() {
            self.newline(w)
        } else if !first {
            w.write_all(b" ")
        } else {
            Ok(())
        }
    }
}

impl serde_json::ser::Formatter for PyFormatter {
    fn begin_array<W: ?Sized + std::io::Write>(&mut self, w: &mut W) -> std::io::Result<()> {
        self.open(w, b"[")
    }
    fn end_array<W: ?Sized + std::io::Write>(&mut self, w: &mut W) -> std::io::Result<()> {
        self.close(w, b"]")
    }
    fn begin_array_value<W: ?Sized + std::io::Write>(&mut self, w: &mut W, first: bool) -> std::io::Result<()> {
        self.item(w, first)
    }
    fn end_array_value<W: ?Sized + std::io::Write>(&mut self, _w: &mut W) -> std::io::Result<()> {
        self.has_value = true;
        Ok(())
    }
    fn begin_object<W: ?Sized + std::io::Write>(&mut self, w: &mut W) -> std::io::Result<()> {
        self.open(w, b"{")
    }
    fn end_object<W: ?Sized + std::io::Write>(&mut self, w: &mut W) -> std::io::Result<()> {
        self.close(w, b"}")
    }
    fn begin_object_key<W: ?Sized + std::io::Write>(&mut self, w: &mut W, first: bool) -> std::io::Result<()> {
        self.item(w, first)
    }
    fn begin_object_value<W: ?Sized + std::io::Write>(&mut self, w: &mut W) -> std::io::Result<()> {
        w.write_all(b": ")
    }
    fn end_object_value<W: ?Sized + std::io::Write>(&mut self, _w: &mut W) -> std::io::Result<()> {
        self.has_value = true;
        Ok(())
    }
}

/// Python `json.dumps(value, ensure_ascii, indent, sort_keys)`.
pub(crate) fn py_json(
    value: &impl Serialize,
    indent: Option<String>,
    ensure_ascii: bool,
    sort_keys: bool,
) -> std::result::Result<String, String> {
    let fmt = PyFormatter { indent: indent.map(String::into_bytes), level: 0, has_value: false };
    let mut out = Vec::new();
    let mut ser = serde_json::Serializer::with_formatter(&mut out, fmt);
    if sort_keys {
        let mut v = serde_json::to_value(value).map_err(|e| e.to_string())?;
        v.sort_all_objects();
        v.serialize(&mut ser).map_err(|e| e.to_string())?;
    } else {
        value.serialize(&mut ser).map_err(|e| e.to_string())?;
    }
    let s = String::from_utf8(out).map_err(|e| e.to_string())?;
    if !ensure_ascii || s.is_ascii() {
        return Ok(s);
    }
    let mut escaped = String::with_capacity(s.len() + 16);
    let mut units = [0u16; 2];
    for c in s.chars() {
        if c.is_ascii() {
            escaped.push(c);
        } else {
            for u in c.encode_utf16(&mut units) {
                escaped.push_str(&format!("\\u{u:04x}"));
            }
        }
    }
    Ok(escaped)
}

/// The `tojson` filter (transformers semantics).
pub(crate) fn tojson(value: Value, kwargs: Kwargs) -> Result<Value, Error> {
    let indent: Option<Value> = kwargs.get("indent")?;
    let ensure_ascii: Option<bool> = kwargs.get("ensure_ascii")?;
    let sort_keys: Option<bool> = kwargs.get("sort_keys")?;
    // `separators` is accepted and ignored (Python's defaults are what templates use).
    let _: Option<Value> = kwargs.get("separators")?;
    kwargs.assert_all_used()?;
    let indent = match indent {
        None => None,
        Some(v) if v.is_none() || v.is_undefined() => None,
        Some(v) => match (v.as_str(), i64::try_from(v.clone()).ok()) {
            (Some(s), _) => Some(s.to_string()),
            (None, Some(n)) => Some(" ".repeat(n.clamp(0, 32) as usize)),
            _ => return Err(Error::new(ErrorKind::InvalidOperation, "tojson: bad indent")),
        },
    };
    py_json(&value, indent, ensure_ascii.unwrap_or(false), sort_keys.unwrap_or(false))
        .map(Value::from_safe_string)
        .map_err(|e| Error::new(ErrorKind::InvalidOperation, format!("tojson: {e}")))
}

/// `raise_exception(message)`.
pub(crate) fn raise_exception(message: String) -> Result<Value, Error> {
    Err(Error::new(ErrorKind::InvalidOperation, message))
}

const MONTHS: [&str; 12] = [
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
];
const WEEKDAYS: [&str; 7] = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"];

/// Gregorian (year, month 1-12, day 1-31) of a day count since 1970-01-01.
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (yoe + era * 400 + i64::from(m <= 2), m, d)
}

/// Formats a Unix timestamp (UTC) with the usual `strftime` codes.
pub(crate) fn strftime(secs: i64, fmt: &str) -> String {
    let days = secs.div_euclid(86_400);
    let tod = secs.rem_euclid(86_400);
    let (y, m, d) = civil_from_days(days);
    let (hh, mm, ss) = (tod / 3600, (tod / 60) % 60, tod % 60);
    let wd = (days + 3).rem_euclid(7) as usize; // 1970-01-01 was a Thursday
    let month = MONTHS[(m - 1) as usize];
    let yday = days - (civil_days(y) - 1);
    let mut out = String::new();
    let mut chars = fmt.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('Y') => out.push_str(&y.to_string()),
            Some('y') => out.push_str(&format!("{:02}", y.rem_euclid(100))),
            Some('m') => out.push_str(&format!("{m:02}")),
            Some('d') => out.push_str(&format!("{d:02}")),
            Some('-') => match chars.next() {
                Some('d') => out.push_str(&d.to_string()),
                Some('m') => out.push_str(&m.to_string()),
                Some(o) => out.extend(['%', '-', o]),
                None => out.push_str("%-"),
            },
            Some('e') => out.push_str(&format!("{d:>2}")),
            Some('H') => out.push_str(&format!("{hh:02}")),
            Some('I') => out.push_str(&format!("{:02}", (hh + 11) % 12 + 1)),
            Some('p') => out.push_str(if hh < 12 { "AM" } else { "PM" }),
            Some('M') => out.push_str(&format!("{mm:02}")),
            Some('S') => out.push_str(&format!("{ss:02}")),
            Some('B') => out.push_str(month),
            Some('b') | Some('h') => out.push_str(&month[..3]),
            Some('A') => out.push_str(WEEKDAYS[wd]),
            Some('a') => out.push_str(&WEEKDAYS[wd][..3]),
            Some('j') => out.push_str(&format!("{yday:03}")),
            Some('Z') => out.push_str("UTC"),
            Some('z') => out.push_str("+0000"),
            Some('%') => out.push('%'),
            Some(o) => out.extend(['%', o]),
            None => out.push('%'),
        }
    }
    out
}

/// Days since 1970-01-01 of January 1st of `year`.
fn civil_days(year: i64) -> i64 {
    let y = year - 1;
    let era = y.div_euclid(400);
    let yoe = y.rem_euclid(400);
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + 306; // March 1st-based day of Jan 1st
    era * 146_097 + doe - 719_468
}

/// `strftime_now(format)`: the current time, UTC.
pub(crate) fn strftime_now(fmt: String) -> String {
    let secs =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs() as i64).unwrap_or(0);
    strftime(secs, &fmt)
}

/// Removes `{% generation %}` / `{% endgeneration %}` tags (with any `-` trim markers).
pub(crate) fn strip_generation_tags(source: &str) -> String {
    let mut out = String::with_capacity(source.len());
    let mut rest = source;
    while let Some(start) = rest.find("{%") {
        // The closing `%}` comes after the opening `{%` (in `{%}` they overlap: not a tag end).
        let Some(len) = rest[start + 2..].find("%}").map(|e| e + 4) else { break };
        let inner = rest[start + 2..start + len - 2].trim_matches(|c: char| c == '-' || c.is_whitespace());
        out.push_str(&rest[..start]);
        if inner != "generation" && inner != "endgeneration" {
            out.push_str(&rest[start..start + len]);
        }
        rest = &rest[start + len..];
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_matches_python_layout() {
        let v = serde_json::json!({"b": [1, 2.5, "é"], "a": {}, "c": {"x": null, "y": true}});
        assert_eq!(
            py_json(&v, None, false, false).unwrap(),
            r#"{"b": [1, 2.5, "é"], "a": {}, "c": {"x": null, "y": true}}"#
        );
        assert_eq!(
            py_json(&v, None, true, true).unwrap(),
            r#"{"a": {}, "b": [1, 2.5, "\u00e9"], "c": {"x": null, "y": true}}"#
        );
        assert_eq!(
            py_json(&serde_json::json!({"a": [1, []]}), Some("  ".into()), false, false).unwrap(),
            "{\n  \"a\": [\n    1,\n    []\n  ]\n}"
        );
    }

    #[test]
    fn strftime_formats_known_dates() {
        // 2024-07-26 13:05:09 UTC, a Friday.
        let t = 1_722_000_000 - 1_722_000_000 % 86_400 + 13 * 3600 + 5 * 60 + 9;
        assert_eq!(strftime(t, "%d %b %Y %H:%M:%S %A %j"), "26 Jul 2024 13:05:09 Friday 208");
        assert_eq!(strftime(0, "%Y-%m-%d %a %-d %B"), "1970-01-01 Thu 1 January");
        assert_eq!(strftime(951_782_400, "%Y-%m-%d"), "2000-02-29");
    }

    #[test]
    fn generation_tags_are_removed() {
        let src = "{% for m in messages %}{%- generation -%}{{ m }}{% endgeneration %}{% endfor %}";
        assert_eq!(strip_generation_tags(src), "{% for m in messages %}{{ m }}{% endfor %}");
    }
}
