//! Grammar walks on the tiny Qwen2 fixture's byte-level tokenizer: every token of a text the
//! grammar admits is allowed before it is consumed, texts it does not admit are refused at the
//! first wrong token, and the end-of-generation token is allowed exactly when the text is
//! complete.

use std::path::PathBuf;
use std::sync::Arc;

use super::*;

fn tokenizer() -> Arc<Tokenizer> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/tiny/qwen2");
    Arc::new(Tokenizer::from_hf_dir(&dir).expect("tokenizer"))
}

fn grammars() -> (Grammars, Arc<Tokenizer>) {
    let t = tokenizer();
    (Grammars::new(t.clone(), 384).expect("grammars"), t)
}

/// Feeds `text`'s tokens; the index of the first token the grammar refuses, if any.
fn walk(c: &mut Constraint, t: &Tokenizer, text: &str) -> Option<usize> {
    for (i, id) in t.encode(text, false).unwrap().into_iter().enumerate() {
        if !c.allows(id) {
            return Some(i);
        }
        c.consume(id).unwrap();
    }
    None
}

fn eos_allowed(c: &mut Constraint, t: &Tokenizer) -> bool {
    c.allows(t.eos_ids()[0])
}

#[test]
fn a_reasoning_prefix_then_the_answer_grammar() {
    let (g, t) = grammars();
    let after = Grammar::AfterText {
        close: "</think>".into(),
        inner: Box::new(Grammar::Choice(vec!["yes".into(), "no".into()])),
    };
    let mut c = g.compile(&after).unwrap();
    assert_eq!(walk(&mut c, &t, "Let me think: 2 < 3, and </thin is not the end."), None);
    assert!(!eos_allowed(&mut c, &t), "still inside the reasoning");
    assert_eq!(walk(&mut c, &t, "</think>\n\n"), None);
    assert!(!eos_allowed(&mut c, &t), "no answer yet");
    assert_eq!(walk(&mut c, &t, "yes"), None);
    assert!(eos_allowed(&mut c, &t) && c.is_accepting());
    let mut c = g.compile(&after).unwrap();
    walk(&mut c, &t, "ok</think>");
    assert!(walk(&mut c, &t, "maybe").is_some(), "the answer grammar binds after the block");
    // A continuation after the block uses only the answer part.
    let mut c = g.compile(&after.answer_part()).unwrap();
    assert_eq!(walk(&mut c, &t, "no"), None);
    assert!(eos_allowed(&mut c, &t));
}

#[test]
fn gbnf_grammars_run_as_written_for_llama_cpp() {
    let (g, t) = grammars();
    let gbnf = r#"root ::= answer " " [0-9]{2} ("!" | "?")?
answer ::= "yes" | "no""#;
    let mut c = g.compile(&Grammar::Gbnf(gbnf.into())).unwrap();
    assert_eq!(walk(&mut c, &t, "no 42"), None);
    assert!(eos_allowed(&mut c, &t));
    assert_eq!(walk(&mut c, &t, "?"), None);
    let mut c = g.compile(&Grammar::Gbnf(gbnf.into())).unwrap();
    assert!(walk(&mut c, &t, "yes 4x").is_some());
}

#[test]
fn json_whitespace_is_bounded_and_schemas_bind() {
    let (g, t) = grammars();
    let schema = serde_json::json!({"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]});
    let mut c = g.compile(&Grammar::JsonSchema(schema.clone())).unwrap();
    assert_eq!(walk(&mut c, &t, "{\n  \"n\": 12\n}"), None, "pretty-printed JSON is admitted");
    assert!(eos_allowed(&mut c, &t));
    let mut c = g.compile(&Grammar::JsonSchema(schema.clone())).unwrap();
    assert!(walk(&mut c, &t, "{\"n\": \"12\"}").is_some(), "a string where an integer belongs");
    let mut c = g.compile(&Grammar::JsonSchema(schema)).unwrap();
    let spaces = " ".repeat(200);
    assert!(walk(&mut c, &t, &format!("{{{spaces}")).is_some(), "200 blanks in a row are refused");
    let mut c = g.compile(&Grammar::JsonObject).unwrap();
    assert!(walk(&mut c, &t, "[1]").is_some(), "json_object means an object");
}

#[test]
fn special_tokens_are_referenced_by_id() {
    let (g, t) = grammars();
    let id = t.token_to_id("<|im_end|>").unwrap();
    assert_eq!(g.token_or_literal(&t, "<|im_end|>"), format!("<[{id}]>"));
    assert_eq!(g.token_or_literal(&t, "<tool_call>"), "\"<tool_call>\"");
    let mut c = g.compile(&Grammar::Lark(format!("start: \"a\" {}", g.token_or_literal(&t, "<|im_end|>")))).unwrap();
    assert_eq!(walk(&mut c, &t, "a"), None);
    assert!(c.allows(id));
}

#[test]
fn a_vocabulary_wider_than_the_logits_is_refused() {
    assert!(Grammars::new(tokenizer(), 100).unwrap_err().contains("more than"));
}
