//! Workload generation is deterministic: the same seed gives the same texts and token counts,
//! sized with the model's tokenizer; another seed gives another workload.

use std::path::Path;

use tandem_bench::tokens::{ApproxCounter, ModelTokenizer, TokenCounter};
use tandem_bench::workload::{generate, WorkloadConfig, WorkloadError};

fn fixture(rel: &str) -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").join(rel)
}

fn small() -> WorkloadConfig {
    WorkloadConfig {
        seed: 7,
        sessions: 3,
        shared_prefix_tokens: 1500,
        session_context_tokens: 200,
        turns_min: 3,
        turns_max: 6,
        tool_result_tokens_min: 50,
        tool_result_tokens_max: 300,
        user_tokens: 20,
        ..Default::default()
    }
}

fn check(counter: &dyn TokenCounter) {
    let cfg = small();
    let a = generate(&cfg, counter).unwrap();
    let b = generate(&cfg, counter).unwrap();
    assert_eq!(a, b, "same seed, same workload");
    // Sizes are measured with the counter and land at (or just under) the targets.
    assert_eq!(a.shared_prefix.tokens, counter.count(&a.shared_prefix.text));
    assert!(a.shared_prefix.tokens <= 1500 && a.shared_prefix.tokens >= 1450, "{}", a.shared_prefix.tokens);
    assert_eq!(a.sessions.len(), 3);
    for s in &a.sessions {
        assert!((3..=6).contains(&s.turns.len()));
        assert!(s.context.tokens <= 200 && s.context.tokens >= 180, "{}", s.context.tokens);
        for t in &s.turns {
            assert_eq!(t.tool_result.tokens, counter.count(&t.tool_result.text));
            assert!(t.tool_result.tokens <= 300 && t.tool_result.tokens + 15 >= 50, "{}", t.tool_result.tokens);
            assert!(t.user.tokens <= 20 && t.user.tokens >= 10, "{}", t.user.tokens);
        }
    }
    let other = generate(&WorkloadConfig { seed: 8, ..cfg.clone() }, counter).unwrap();
    assert_ne!(a.shared_prefix.text, other.shared_prefix.text);
    // More sessions leave the earlier ones as they were.
    let more = generate(&WorkloadConfig { sessions: 4, ..cfg }, counter).unwrap();
    assert_eq!(more.sessions[..3], a.sessions[..]);
}

#[test]
fn deterministic_with_the_model_tokenizer() {
    let tok = ModelTokenizer::load(&fixture("fixtures/tiny/llama")).unwrap();
    assert!(tok.exact());
    check(&tok);
}

#[test]
fn deterministic_with_smollm2_tokenizer_when_present() {
    let p = fixture("models/smollm2-135m.gguf");
    if !p.exists() {
        eprintln!("models/smollm2-135m.gguf missing (run `make models`); skipped");
        return;
    }
    check(&ModelTokenizer::load(&p).unwrap());
}

#[test]
fn deterministic_with_the_approximate_counter() {
    check(&ApproxCounter);
}

#[test]
fn single_turn_and_bad_configs() {
    let cfg = WorkloadConfig { single_turn: true, single_turn_prompt_tokens: 100, sessions: 2, ..Default::default() };
    let w = generate(&cfg, &ApproxCounter).unwrap();
    assert_eq!(w.shared_prefix.tokens, 0);
    assert!(w.sessions.iter().all(|s| s.turns.is_empty() && s.context.tokens <= 100 && s.context.tokens > 90));
    assert_eq!(w.requests(), 2);
    let bad = WorkloadConfig { turns_min: 5, turns_max: 2, ..Default::default() };
    assert!(matches!(generate(&bad, &ApproxCounter), Err(WorkloadError::Range { .. })));
    let bad = WorkloadConfig { sessions: 0, ..Default::default() };
    assert_eq!(generate(&bad, &ApproxCounter).unwrap_err(), WorkloadError::Zero("sessions"));
}

/// A counter that never counts anything must not hang generation.
struct Zero;

impl TokenCounter for Zero {
    fn count(&self, _: &str) -> usize {
        0
    }
    fn name(&self) -> String {
        "zero".into()
    }
    fn exact(&self) -> bool {
        false
    }
}

#[test]
fn a_degenerate_counter_does_not_hang() {
    let cfg = WorkloadConfig { shared_prefix_tokens: 100, turns_min: 1, turns_max: 1, ..Default::default() };
    let w = generate(&cfg, &Zero).unwrap();
    assert_eq!(w.shared_prefix.tokens, 0);
    assert!(!w.shared_prefix.text.is_empty());
}

#[test]
fn fixed_replies_are_sized_and_leave_the_other_texts_alone() {
    let counter = &ApproxCounter;
    let cfg = WorkloadConfig { max_tokens: 48, ..small() };
    let plain = generate(&cfg, counter).unwrap();
    let fixed = generate(&WorkloadConfig { fixed_replies: true, ..cfg }, counter).unwrap();
    assert_eq!(plain.shared_prefix, fixed.shared_prefix);
    for (p, f) in plain.sessions.iter().zip(&fixed.sessions) {
        assert_eq!(p.context, f.context);
        assert_eq!(p.turns.len(), f.turns.len());
        for (pt, ft) in p.turns.iter().zip(&f.turns) {
            assert_eq!((&pt.tool_result, &pt.user, &pt.reply), (&ft.tool_result, &ft.user, &None));
            let reply = ft.reply.as_ref().expect("a fixed reply");
            assert_eq!(reply.tokens, counter.count(&reply.text));
            assert!(reply.tokens <= 48 && reply.tokens >= 38, "{}", reply.tokens);
        }
    }
    // The same seed gives the same replies; replies differ turn to turn.
    let again = generate(&WorkloadConfig { fixed_replies: true, ..small() }, counter).unwrap();
    let r: Vec<_> = again.sessions[0].turns.iter().map(|t| t.reply.clone().unwrap().text).collect();
    assert!(r.windows(2).all(|w| w[0] != w[1]));
}
