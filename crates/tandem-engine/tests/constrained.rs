//! Constrained decoding on the tiny fixtures: JSON-schema outputs always parse and validate
//! (checked by an independent validator) across seeds and temperatures, alone, in a batch of
//! 8 and under speculative decoding; greedy output under a grammar that admits the
//! unconstrained answer equals the unconstrained greedy output; a grammar that binds changes
//! the output into one it admits and then ends it; speculation under a grammar is lossless;
//! bad grammars are refused with a message; nothing leaks.

mod common;

use common::*;
use serde_json::{json, Value};
use tandem_engine::*;

const PATH: &str = "tiny/qwen2";

fn schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 6},
            "age": {"type": "integer", "minimum": 0, "maximum": 99},
            "ok": {"type": "boolean"},
            "tags": {"type": "array", "items": {"enum": ["a", "b", "c"]}, "maxItems": 2}
        },
        "required": ["name", "age", "ok", "tags"],
        "additionalProperties": false,
        "x-guidance": {"whitespace_flexible": false}
    })
}

fn constrained(prompt: Vec<u32>, grammar: Grammar, temperature: f32, seed: u64, max_tokens: usize) -> GenerateRequest {
    GenerateRequest {
        prompt_ids: prompt,
        sampling: SamplingParams { temperature, seed: Some(seed), ..Default::default() },
        stop: StopParams { max_tokens, ..Default::default() },
        grammar: Some(grammar),
        ..Default::default()
    }
}

/// n-gram prompt lookup, 4 drafts, fixed length.
fn ngram() -> SpecConfig {
    SpecConfig {
        method: SpecMethod::Ngram,
        num_draft_tokens: 4,
        ngram_min: 1,
        ngram_max: 3,
        adaptive: false,
        draft_vocab: 0,
    }
}

fn text(e: &EngineHandle, ids: &[u32]) -> String {
    e.tokenizer().decode(ids, true)
}

/// The output (without its end-of-generation token) parses as JSON and validates.
fn assert_valid(e: &EngineHandle, o: &Outcome, what: &str) {
    assert_eq!(o.reason, Some(FinishReason::Stop), "{what}: the grammar should have completed");
    let eos = e.tokenizer().eos_ids();
    let body: Vec<u32> = o.ids.iter().copied().filter(|t| !eos.contains(t)).collect();
    let out = text(e, &body);
    let v: Value = serde_json::from_str(&out).unwrap_or_else(|err| panic!("{what}: {out:?} does not parse: {err}"));
    let mut s = schema();
    s.as_object_mut().unwrap().remove("x-guidance");
    let validator = jsonschema::validator_for(&s).expect("schema");
    assert!(validator.is_valid(&v), "{what}: {out} does not validate");
}

#[test]
fn json_schema_outputs_parse_and_validate() {
    let e = engine(PATH, cache_off());
    let p = prompt(PATH);
    for (i, t) in [0.0f32, 0.7, 1.0, 1.5].into_iter().enumerate() {
        for seed in 0..3u64 {
            let o = run(&e, constrained(p.clone(), Grammar::JsonSchema(schema()), t, seed * 7 + i as u64, 120));
            assert_valid(&e, &o, &format!("temperature {t} seed {seed}"));
        }
    }
    // A batch of 8 at once, different seeds and prompts.
    let rxs: Vec<_> = (0..8u64)
        .map(|i| {
            let pr: Vec<u32> = p.iter().skip(i as usize).copied().collect();
            e.submit(constrained(pr, Grammar::JsonSchema(schema()), 1.0, 100 + i, 120)).expect("submit")
        })
        .collect();
    for (i, rx) in rxs.into_iter().enumerate() {
        assert_valid(&e, &collect(rx), &format!("batch member {i}"));
    }
    assert_no_leaks(&e);
}

#[test]
fn a_grammar_that_does_not_bind_changes_nothing() {
    let e = engine(PATH, cache_off());
    let p = prompt(PATH);
    let n = 24;
    let plain = run(&e, greedy(p.clone(), n));
    // Any tokens at all, and exactly the first half of the unconstrained answer's tokens
    // followed by anything (a grammar that binds for those steps, and agrees with them).
    // Token-level, because a random model's bytes need not be UTF-8 that a text regex admits.
    let head: Vec<String> = plain.ids[..n / 2].iter().map(|t| format!("<[{t}]>")).collect();
    let grammars = [Grammar::Lark("start: <[*]>*".into()), Grammar::Lark(format!("start: {} <[*]>*", head.join(" ")))];
    for g in grammars {
        let mut req = greedy(p.clone(), n);
        req.grammar = Some(g.clone());
        let got = run(&e, req);
        assert_same(&got, &plain, &format!("{g:?}"));
    }
}

#[test]
fn a_binding_grammar_steers_and_then_ends_the_output() {
    let e = engine(PATH, cache_off());
    let p = prompt(PATH);
    let options = ["yes", "no", "maybe later"];
    for seed in 0..6u64 {
        let g = Grammar::Choice(options.iter().map(|s| s.to_string()).collect());
        let o = run(&e, constrained(p.clone(), g, 1.0, seed, 32));
        assert_eq!(o.reason, Some(FinishReason::Stop), "seed {seed}");
        let eos = e.tokenizer().eos_ids();
        assert!(eos.contains(o.ids.last().unwrap()), "seed {seed}: ends with an end-of-generation token");
        let out = text(&e, &o.ids[..o.ids.len() - 1]);
        assert!(options.contains(&out.as_str()), "seed {seed}: {out:?}");
    }
    let o = run(&e, constrained(p.clone(), Grammar::Regex("[0-9]{3}-[a-z]{2}".into()), 0.0, 0, 32));
    let out = text(&e, &o.ids[..o.ids.len() - 1]);
    assert!(out.len() == 6 && out.as_bytes()[3] == b'-', "{out:?}");
    // A grammar the token budget cannot complete ends by length, its output a prefix.
    let o = run(&e, constrained(p, Grammar::Regex("a{50}".into()), 0.0, 0, 5));
    assert_eq!(o.reason, Some(FinishReason::Length));
    assert!(text(&e, &o.ids).chars().all(|c| c == 'a'));
}

#[test]
fn speculation_under_a_grammar_is_lossless_and_valid() {
    let plain = engine(PATH, cache_off());
    let p = prompt(PATH);
    let want = run(&plain, constrained(p.clone(), Grammar::JsonSchema(schema()), 0.0, 0, 120));
    assert_valid(&plain, &want, "plain");
    let cfg = EngineConfig { speculative: ngram(), ..cache_off() };
    let e = engine(PATH, cfg);
    let got = run(&e, constrained(p.clone(), Grammar::JsonSchema(schema()), 0.0, 0, 120));
    assert_eq!(got.ids, want.ids, "greedy under a grammar, with and without speculation");
    assert!(got.usage.speculative.drafted_tokens > 0, "the n-gram proposer drafted");
    for seed in 0..4u64 {
        let o = run(&e, constrained(p.clone(), Grammar::JsonSchema(schema()), 1.0, seed, 120));
        assert_valid(&e, &o, &format!("speculative, seed {seed}"));
    }
    assert_no_leaks(&e);
}

#[test]
fn bad_grammars_are_refused_with_a_reason() {
    let e = engine(PATH, cache_off());
    let p = prompt(PATH);
    let bad = [
        Grammar::JsonSchema(json!(5)),
        Grammar::JsonSchema(json!({"type": "no-such-type"})),
        Grammar::Lark("start: undefined_rule".into()),
        Grammar::Regex("(unclosed".into()),
        Grammar::Choice(vec![]),
    ];
    for g in bad {
        match e.submit(constrained(p.clone(), g.clone(), 0.0, 0, 8)) {
            Err(SubmitError::InvalidGrammar(msg)) => assert!(!msg.is_empty(), "{g:?}"),
            other => panic!("{g:?}: {:?}", other.map(|_| ())),
        }
    }
}

/// SmolLM2-135M (the default model, `make models`), prefix cache on: schema-valid JSON across
/// seeds and temperatures, alone, in a batch of 8 and with n-gram speculation, and a repeated
/// request (a prefix-cache hit) gives the same output as the first.
#[test]
fn smollm2_json_schema_outputs_validate_with_the_prefix_cache() {
    let path = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../models/smollm2-135m.gguf");
    if !path.exists() {
        eprintln!("models/smollm2-135m.gguf missing (make models); skipped");
        return;
    }
    let cfg = EngineConfig { speculative: ngram(), ..Default::default() };
    let e = EngineHandle::load(&path, cfg).expect("smollm2");
    let p = e.tokenizer().encode("A person described as JSON with a name, an age, ok and tags:\n", true).unwrap();
    let plain_spec = |t: f32, seed: u64| {
        let mut r = constrained(p.clone(), Grammar::JsonSchema(schema()), t, seed, 100);
        r.speculative = Some(SpecRequest { method: Some(SpecMethod::Off), num_draft_tokens: None });
        r
    };
    for (t, seed) in [(0.0, 0), (0.8, 1), (1.2, 2)] {
        let first = run(&e, plain_spec(t, seed));
        assert_valid(&e, &first, &format!("smollm2 t {t}"));
        let again = run(&e, plain_spec(t, seed));
        assert!(again.usage.cached_tokens > 0, "the repeat is a prefix-cache hit");
        assert_eq!(again.ids, first.ids, "t {t}: a prefix-cache hit changes nothing");
        // The same request speculated (n-gram): greedy is token-for-token the same.
        let spec = run(&e, constrained(p.clone(), Grammar::JsonSchema(schema()), t, seed, 100));
        assert_valid(&e, &spec, &format!("smollm2 speculative t {t}"));
        if t == 0.0 {
            assert_eq!(spec.ids, first.ids, "greedy with speculation");
        }
    }
    let rxs: Vec<_> = (0..8u64)
        .map(|i| e.submit(constrained(p.clone(), Grammar::JsonSchema(schema()), 1.0, 50 + i, 100)).expect("submit"))
        .collect();
    for (i, rx) in rxs.into_iter().enumerate() {
        assert_valid(&e, &collect(rx), &format!("smollm2 batch member {i}"));
    }
    assert_no_leaks(&e);
}
