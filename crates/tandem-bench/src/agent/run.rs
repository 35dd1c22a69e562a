//! Running a workload against one endpoint: one task per session, all started together.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use indicatif::ProgressBar;

use super::results::{Overall, SessionResult, SystemResult, TurnResult};
use crate::client::{ChatClient, ClientConfig, Message};
use crate::stats::Summary;
use crate::timing::turn_timing;
use crate::tokens::TokenCounter;
use crate::workload::{SessionPlan, Workload};

/// Which system to measure.
#[derive(Debug, Clone)]
pub struct SystemConfig {
    /// Name in reports (`tandem`, `llama.cpp`, ...).
    pub label: String,
    pub client: ClientConfig,
    /// The `model` field; `None` asks `GET /v1/models`.
    pub model: Option<String>,
}

/// Runs every session of `workload` against the system concurrently; errors of single requests
/// are recorded (and end their session), not returned.
pub async fn run_system(
    workload: Arc<Workload>,
    sys: &SystemConfig,
    counter: Arc<dyn TokenCounter>,
    progress: ProgressBar,
) -> anyhow::Result<SystemResult> {
    let client = ChatClient::new(sys.client.clone())?;
    let model = match &sys.model {
        Some(m) => m.clone(),
        None => client.first_model().await.with_context(|| format!("asking {} for its model", client.base_url()))?,
    };
    let t0 = Instant::now();
    let mut tasks = Vec::new();
    for plan in workload.sessions.clone() {
        let (client, model, wl, counter, pb) =
            (client.clone(), model.clone(), workload.clone(), counter.clone(), progress.clone());
        tasks.push(tokio::spawn(async move { run_session(&client, &model, &wl, &plan, &*counter, t0, &pb).await }));
    }
    let mut turns = Vec::new();
    let mut sessions = Vec::new();
    for t in tasks {
        let (s, ts) = t.await.context("a session task panicked")?;
        sessions.push(s);
        turns.extend(ts);
    }
    let wall_s = t0.elapsed().as_secs_f64();
    turns.sort_by_key(|t| (t.session, t.turn));
    let overall = overall(&turns, &sessions, wall_s);
    Ok(SystemResult {
        label: sys.label.clone(),
        endpoint: client.base_url().to_string(),
        model,
        wall_s,
        turns,
        sessions,
        overall,
    })
}

async fn run_session(
    client: &ChatClient,
    model: &str,
    wl: &Workload,
    plan: &SessionPlan,
    counter: &dyn TokenCounter,
    t0: Instant,
    pb: &ProgressBar,
) -> (SessionResult, Vec<TurnResult>) {
    let mut messages = Vec::new();
    let mut history_tokens = 0;
    if !wl.shared_prefix.text.is_empty() {
        messages.push(Message::new("system", wl.shared_prefix.text.clone()));
        history_tokens += wl.shared_prefix.tokens;
    }
    // Single-turn mode is one request with the context alone; otherwise the context opens the
    // first user message, so roles alternate as strict chat templates require.
    let user_texts: Vec<(String, usize)> = if plan.turns.is_empty() {
        vec![(plan.context.text.clone(), plan.context.tokens)]
    } else {
        plan.turns
            .iter()
            .enumerate()
            .map(|(i, t)| {
                let mut text = format!("{}\n\n{}", t.tool_result.text, t.user.text);
                let mut n = t.tool_result.tokens + t.user.tokens;
                if i == 0 {
                    text = format!("{}\n\n{text}", plan.context.text);
                    n += plan.context.tokens;
                }
                (text, n)
            })
            .collect()
    };
    let started = Instant::now();
    let mut session = SessionResult { id: plan.id, turns_planned: user_texts.len(), ..Default::default() };
    let mut results = Vec::new();
    for (i, (text, n)) in user_texts.into_iter().enumerate() {
        if i > 0 && wl.config.think_time_ms > 0 {
            tokio::time::sleep(Duration::from_millis(wl.config.think_time_ms)).await;
        }
        messages.push(Message::new("user", text));
        history_tokens += n;
        let sent_at_s = t0.elapsed().as_secs_f64();
        let mut r = TurnResult { session: plan.id, turn: i + 1, sent_at_s, history_tokens, ..Default::default() };
        match client.stream_chat(model, &messages, wl.config.max_tokens).await {
            Ok(st) => {
                let tm = turn_timing(&st.arrivals, st.usage.completion_tokens, st.end_s);
                r.prompt_tokens = st.usage.prompt_tokens;
                r.cached_tokens = st.usage.cached_tokens;
                r.completion_tokens = tm.output_tokens;
                r.ttft_s = tm.ttft_s;
                r.tpot_s = tm.tpot_s;
                r.decode_tok_s = tm.decode_tok_s;
                r.itl_s = Summary::of(&tm.itl_s);
                r.itl_raw_s = tm.itl_s;
                r.e2e_s = tm.e2e_s;
                match plan.turns.get(i).and_then(|t| t.reply.as_ref()) {
                    Some(reply) => {
                        history_tokens += reply.tokens;
                        messages.push(Message::new("assistant", reply.text.clone()));
                    }
                    None => {
                        history_tokens += counter.count(&st.text);
                        messages.push(Message::new("assistant", st.text));
                    }
                }
                session.turns_done += 1;
                results.push(r);
                pb.inc(1);
            }
            Err(e) => {
                r.error = Some(format!("{e:#}"));
                session.error = r.error.clone();
                results.push(r);
                pb.inc((session.turns_planned - i) as u64);
                break;
            }
        }
    }
    session.wall_s = started.elapsed().as_secs_f64();
    (session, results)
}

/// Aggregates turns into the overall numbers; inter-token gaps are pooled over all turns.
fn overall(turns: &[TurnResult], sessions: &[SessionResult], wall_s: f64) -> Overall {
    let ok: Vec<&TurnResult> = turns.iter().filter(|t| t.error.is_none()).collect();
    let ms = |f: &dyn Fn(&TurnResult) -> Option<f64>| {
        Summary::of(&ok.iter().filter_map(|t| f(t)).collect::<Vec<_>>()).map(|s| s.scaled(1e3))
    };
    let output_tokens: usize = ok.iter().map(|t| t.completion_tokens).sum();
    Overall {
        requests: turns.len(),
        errors: turns.len() - ok.len(),
        ttft_ms: ms(&|t| t.ttft_s),
        tpot_ms: ms(&|t| t.tpot_s),
        itl_ms: Summary::of(&ok.iter().flat_map(|t| t.itl_raw_s.iter().copied()).collect::<Vec<_>>())
            .map(|s| s.scaled(1e3)),
        e2e_ms: ms(&|t| Some(t.e2e_s)),
        decode_tok_s: Summary::of(&ok.iter().filter_map(|t| t.decode_tok_s).collect::<Vec<_>>()),
        session_wall_s: Summary::of(&sessions.iter().map(|s| s.wall_s).collect::<Vec<_>>()),
        prompt_tokens: ok.iter().filter_map(|t| t.prompt_tokens).sum(),
        cached_tokens: ok.iter().filter_map(|t| t.cached_tokens).sum(),
        output_tokens,
        output_tok_per_s: if wall_s > 0.0 { output_tokens as f64 / wall_s } else { 0.0 },
    }
}
