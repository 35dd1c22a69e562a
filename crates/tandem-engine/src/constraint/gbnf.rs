//! GBNF (llama.cpp's grammar format) to llguidance's Lark dialect, so that grammars written
//! for llama.cpp work unchanged. Rules `name ::= ...` become `r_name: ...` (Lark rule names
//! are lower-case identifiers; `root` is the start), string literals are decoded and written
//! again as Lark strings, character classes become regex terminals, `.` any character;
//! grouping, alternation and the `* + ? {m,n}` repetitions mean the same in both.

use super::lark_string;

#[derive(Debug, Clone, PartialEq)]
enum Tok {
    Name(String),
    Define,
    Str(String),
    Class(String),
    Any,
    Op(String),
}

fn rule_name(name: &str) -> String {
    let clean: String =
        name.chars().map(|c| if c.is_ascii_alphanumeric() { c.to_ascii_lowercase() } else { '_' }).collect();
    format!("r_{clean}")
}

/// The Lark text of GBNF grammar `src`, or what is wrong with it.
pub fn gbnf_to_lark(src: &str) -> Result<String, String> {
    let toks = lex(src)?;
    let mut out = String::new();
    let mut has_root = false;
    let mut i = 0;
    while i < toks.len() {
        match (&toks[i], toks.get(i + 1)) {
            (Tok::Name(n), Some(Tok::Define)) => {
                has_root |= n == "root";
                if !out.is_empty() {
                    out.push('\n');
                }
                out.push_str(&rule_name(n));
                out.push(':');
                i += 2;
                continue;
            }
            _ if out.is_empty() => return Err("a GBNF grammar must start with a rule `name ::= ...`".into()),
            (Tok::Name(n), _) => out.push_str(&format!(" {}", rule_name(n))),
            (Tok::Define, _) => return Err("`::=` without a rule name before it".into()),
            (Tok::Str(s), _) => out.push_str(&format!(" {}", lark_string(s))),
            (Tok::Class(c), _) => out.push_str(&format!(" /[{}]/", c.replace('/', "\\/"))),
            (Tok::Any, _) => out.push_str(" /(?s:.)/"),
            (Tok::Op(o), _) => out.push_str(&format!(" {o}")),
        }
        i += 1;
    }
    if !has_root {
        return Err("a GBNF grammar needs a `root ::= ...` rule".into());
    }
    Ok(format!("start: r_root\n{out}\n"))
}

fn lex(src: &str) -> Result<Vec<Tok>, String> {
    let chars: Vec<char> = src.chars().collect();
    let mut toks = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        if c.is_whitespace() {
            i += 1;
        } else if c == '#' {
            while i < chars.len() && chars[i] != '\n' {
                i += 1;
            }
        } else if c == ':' && chars.get(i + 1) == Some(&':') && chars.get(i + 2) == Some(&'=') {
            toks.push(Tok::Define);
            i += 3;
        } else if c.is_alphanumeric() || c == '-' || c == '_' {
            let start = i;
            while i < chars.len() && (chars[i].is_alphanumeric() || chars[i] == '-' || chars[i] == '_') {
                i += 1;
            }
            toks.push(Tok::Name(chars[start..i].iter().collect()));
        } else if c == '"' {
            i += 1;
            let mut s = String::new();
            loop {
                match chars.get(i) {
                    None => return Err("unterminated string literal".into()),
                    Some('"') => break,
                    Some('\\') => {
                        let (ch, used) = escape(&chars[i + 1..])?;
                        s.push(ch);
                        i += 1 + used;
                    }
                    Some(&ch) => {
                        s.push(ch);
                        i += 1;
                    }
                }
            }
            i += 1;
            toks.push(Tok::Str(s));
        } else if c == '[' {
            i += 1;
            let mut s = String::new();
            loop {
                match chars.get(i) {
                    None => return Err("unterminated character class".into()),
                    Some(']') => break,
                    Some('\\') => {
                        let next = chars.get(i + 1).ok_or("unterminated character class")?;
                        s.push('\\');
                        s.push(*next);
                        i += 2;
                    }
                    Some(&ch) => {
                        s.push(ch);
                        i += 1;
                    }
                }
            }
            i += 1;
            if s.is_empty() {
                return Err("empty character class `[]`".into());
            }
            toks.push(Tok::Class(s));
        } else if c == '.' {
            toks.push(Tok::Any);
            i += 1;
        } else if c == '{' {
            let start = i;
            while i < chars.len() && chars[i] != '}' {
                i += 1;
            }
            if i == chars.len() {
                return Err("unterminated repetition `{`".into());
            }
            i += 1;
            let rep: String = chars[start..i].iter().collect();
            if !rep[1..rep.len() - 1].chars().all(|c| c.is_ascii_digit() || c == ',' || c == ' ') {
                return Err(format!("bad repetition `{rep}`"));
            }
            toks.push(Tok::Op(rep.replace(' ', "")));
        } else if "|()*+?".contains(c) {
            toks.push(Tok::Op(c.to_string()));
            i += 1;
        } else {
            return Err(format!("unexpected character `{c}` in the grammar"));
        }
    }
    Ok(toks)
}

/// The character a backslash escape (after the backslash) stands for, and how many characters
/// it used.
fn escape(rest: &[char]) -> Result<(char, usize), String> {
    let hex = |n: usize| -> Result<(char, usize), String> {
        let digits: String = rest.iter().skip(1).take(n).collect();
        let v = u32::from_str_radix(&digits, 16).map_err(|_| format!("bad escape `\\{}{digits}`", rest[0]))?;
        char::from_u32(v)
            .map(|c| (c, n + 1))
            .ok_or_else(|| format!("escape `\\{}{digits}` is not a character", rest[0]))
    };
    match rest.first() {
        Some('n') => Ok(('\n', 1)),
        Some('r') => Ok(('\r', 1)),
        Some('t') => Ok(('\t', 1)),
        Some('x') => hex(2),
        Some('u') => hex(4),
        Some('U') => hex(8),
        Some(&c) => Ok((c, 1)),
        None => Err("a string ends in a backslash".into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn converts_llama_cpp_style_grammars() {
        let g = r#"
            # a yes/no answer, then digits
            root ::= answer " " num
            answer ::= ("yes" | "no")
            num ::= [0-9]{1,3} "\x21"?
            any-char ::= .
        "#;
        let lark = gbnf_to_lark(g).unwrap();
        assert_eq!(
            lark,
            "start: r_root\nr_root: r_answer \" \" r_num\nr_answer: ( \"yes\" | \"no\" )\nr_num: /[0-9]/ {1,3} \"!\" ?\nr_any_char: /(?s:.)/\n"
        );
    }

    #[test]
    fn reports_what_is_wrong() {
        for (g, want) in [
            ("answer ::= \"x\"", "root"),
            ("root ::= \"x", "unterminated string"),
            ("root ::= [a-z", "unterminated character class"),
            ("\"x\" root ::= \"y\"", "must start with a rule"),
            ("root ::= \"x\" ; ", "unexpected character"),
            ("root ::= \"\\xZZ\"", "bad escape"),
        ] {
            let e = gbnf_to_lark(g).unwrap_err();
            assert!(e.contains(want), "{g}: {e}");
        }
    }
}
