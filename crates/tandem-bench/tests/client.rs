//! The client's TTFT, ITL, TPOT and percentiles: exactly on scripted timestamps, and within
//! scheduling tolerance against a scripted fake OpenAI streaming server on loopback; the agent
//! runner replays the whole growing history every turn.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Body;
use axum::routing::{get, post};
use axum::{Json, Router};
use serde_json::{json, Value};
use tandem_bench::agent::{run_system, SystemConfig};
use tandem_bench::client::{apply_event, ChatClient, ClientConfig, Message, StreamedTurn};
use tandem_bench::stats::Summary;
use tandem_bench::timing::turn_timing;
use tandem_bench::tokens::ApproxCounter;
use tandem_bench::workload::{generate, WorkloadConfig};

/// Delay before the first token, then the gaps between tokens (ms).
const FIRST_MS: u64 = 150;
const GAPS_MS: [u64; 5] = [40, 40, 80, 40, 120];

#[test]
fn metrics_from_scripted_timestamps_are_exact() {
    let mut t = StreamedTurn::default();
    let events = [
        (0.01, r#"{"choices":[{"delta":{"role":"assistant","content":""}}]}"#),
        (0.10, r#"{"choices":[{"delta":{"content":"a"}}]}"#),
        (0.20, r#"{"choices":[{"delta":{"content":"b"}}]}"#),
        (0.35, r#"{"choices":[{"delta":{"content":"c"}}]}"#),
        (0.45, r#"{"choices":[{"delta":{"content":"d"}}]}"#),
        (0.95, r#"{"choices":[{"delta":{"content":"e"},"finish_reason":"length"}]}"#),
        (
            0.96,
            r#"{"choices":[],"usage":{"prompt_tokens":9,"completion_tokens":5,"prompt_tokens_details":{"cached_tokens":4}}}"#,
        ),
    ];
    for (at, e) in events {
        apply_event(e, at, &mut t).unwrap();
    }
    let m = turn_timing(&t.arrivals, t.usage.completion_tokens, 1.0);
    assert_eq!(m.ttft_s, Some(0.10));
    assert_eq!(m.output_tokens, 5);
    assert!((m.tpot_s.unwrap() - 0.85 / 4.0).abs() < 1e-12);
    let itl = Summary::of(&m.itl_s).unwrap();
    let close = |a: f64, b: f64| (a - b).abs() < 1e-9;
    // Gaps 0.10, 0.15, 0.10, 0.50 → sorted 0.10, 0.10, 0.15, 0.50.
    assert!(close(itl.p50, 0.125), "{itl:?}");
    assert!(close(itl.p90, 0.15 + 0.7 * 0.35), "{itl:?}");
    assert!(close(itl.p99, 0.15 + 0.97 * 0.35), "{itl:?}");
    assert!(close(itl.mean, 0.2125));
    assert_eq!(t.usage.cached_tokens, Some(4));
}

/// Requests the fake server saw: the number of messages of each.
type Seen = Arc<Mutex<Vec<usize>>>;

async fn fake_server(seen: Seen) -> String {
    let chat = move |Json(body): Json<Value>| {
        let seen = seen.clone();
        async move {
            let n_msgs = body["messages"].as_array().map_or(0, |m| m.len());
            seen.lock().unwrap().push(n_msgs);
            let mut steps: Vec<(u64, String)> =
                vec![(0, json!({"choices":[{"delta":{"role":"assistant"}}]}).to_string())];
            steps.push((FIRST_MS, json!({"choices":[{"delta":{"content":"t0 "}}]}).to_string()));
            for (i, g) in GAPS_MS.iter().enumerate() {
                steps.push((*g, json!({"choices":[{"delta":{"content":format!("t{} ", i + 1)}}]}).to_string()));
            }
            let usage = json!({"choices":[],"usage":{"prompt_tokens": 100 * n_msgs, "completion_tokens": 6,
                "prompt_tokens_details": {"cached_tokens": 10 * n_msgs}}});
            steps.push((0, usage.to_string()));
            steps.push((0, "[DONE]".into()));
            let stream = futures::stream::unfold(steps.into_iter(), |mut it| async move {
                let (delay, data) = it.next()?;
                tokio::time::sleep(Duration::from_millis(delay)).await;
                Some((Ok::<_, std::convert::Infallible>(format!("data: {data}\n\n")), it))
            });
            axum::response::Response::builder()
                .header("content-type", "text/event-stream")
                .body(Body::from_stream(stream))
                .unwrap()
        }
    };
    let app = Router::new()
        .route("/v1/models", get(|| async { Json(json!({"object":"list","data":[{"id":"fake-model"}]})) }))
        .route("/v1/chat/completions", post(chat));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    format!("http://{addr}")
}

fn client_cfg(url: &str) -> ClientConfig {
    ClientConfig { base_url: url.into(), api_key: None, timeout: Duration::from_secs(30), extra_body: Value::Null }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fake_server_timings_match_the_script() {
    let seen: Seen = Arc::default();
    let url = fake_server(seen.clone()).await;
    let client = ChatClient::new(client_cfg(&url)).unwrap();
    assert_eq!(client.first_model().await.unwrap(), "fake-model");
    let st = client.stream_chat("fake-model", &[Message::new("user", "hi")], 6).await.unwrap();
    assert_eq!(st.text, "t0 t1 t2 t3 t4 t5 ");
    assert_eq!(st.usage.completion_tokens, Some(6));
    assert_eq!(st.usage.cached_tokens, Some(10));
    let m = turn_timing(&st.arrivals, st.usage.completion_tokens, st.end_s);
    // Scheduling on a loaded machine only adds delay; allow generous slack above the script.
    let slack = 0.1;
    let ttft = m.ttft_s.unwrap();
    assert!(ttft >= FIRST_MS as f64 / 1e3 - 0.005 && ttft < FIRST_MS as f64 / 1e3 + slack, "TTFT {ttft}");
    assert_eq!(m.itl_s.len(), GAPS_MS.len());
    let total: f64 = m.itl_s.iter().sum();
    let script: f64 = GAPS_MS.iter().sum::<u64>() as f64 / 1e3;
    assert!(total >= script - 0.01 && total < script + slack, "ITL sum {total} vs {script}");
    // The 80 ms and 120 ms gaps stay the two longest.
    let mut sorted = m.itl_s.clone();
    sorted.sort_by(|a, b| a.total_cmp(b));
    assert!(sorted[3] >= 0.075 && sorted[4] >= 0.115, "{sorted:?}");
    let tpot = m.tpot_s.unwrap();
    assert!((tpot - total / 5.0).abs() < 1e-9);
    assert!(m.e2e_s >= ttft + total);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agent_sessions_replay_the_growing_history() {
    let seen: Seen = Arc::default();
    let url = fake_server(seen.clone()).await;
    let cfg = WorkloadConfig {
        sessions: 2,
        shared_prefix_tokens: 200,
        session_context_tokens: 50,
        turns_min: 3,
        turns_max: 3,
        tool_result_tokens_min: 20,
        tool_result_tokens_max: 40,
        max_tokens: 6,
        think_time_ms: 10,
        ..Default::default()
    };
    let wl = Arc::new(generate(&cfg, &ApproxCounter).unwrap());
    let sys = SystemConfig { label: "fake".into(), client: client_cfg(&url), model: None };
    let r = run_system(wl, &sys, Arc::new(ApproxCounter), indicatif::ProgressBar::hidden()).await.unwrap();
    assert_eq!(r.model, "fake-model");
    assert_eq!(r.turns.len(), 6);
    assert_eq!(r.overall.errors, 0);
    // system + (user, assistant) per earlier turn + this turn's user message.
    let mut counts = seen.lock().unwrap().clone();
    counts.sort_unstable();
    assert_eq!(counts, vec![2, 2, 4, 4, 6, 6]);
    for t in &r.turns {
        assert_eq!(t.prompt_tokens, Some(100 * (2 * t.turn)));
        assert_eq!(t.cached_tokens, Some(10 * (2 * t.turn)));
        assert_eq!(t.completion_tokens, 6);
        assert!(t.ttft_s.unwrap() >= 0.145);
    }
    // History grows turn over turn.
    let s0: Vec<_> = r.turns.iter().filter(|t| t.session == 0).map(|t| t.history_tokens).collect();
    assert!(s0.windows(2).all(|w| w[1] > w[0]), "{s0:?}");
    // With fixed replies the history carries the workload's replies, not the server's answers.
    let fixed = Arc::new(generate(&WorkloadConfig { fixed_replies: true, ..cfg.clone() }, &ApproxCounter).unwrap());
    let f = run_system(fixed.clone(), &sys, Arc::new(ApproxCounter), indicatif::ProgressBar::hidden()).await.unwrap();
    let plan = &fixed.sessions[0];
    let mut want = fixed.shared_prefix.tokens + plan.context.tokens;
    for (i, t) in plan.turns.iter().enumerate() {
        want += t.tool_result.tokens + t.user.tokens;
        let got = f.turns.iter().find(|x| x.session == 0 && x.turn == i + 1).unwrap();
        assert_eq!(got.history_tokens, want, "turn {}", i + 1);
        want += t.reply.as_ref().unwrap().tokens;
    }
    let o = &r.overall;
    assert_eq!(o.output_tokens, 36);
    assert_eq!(o.itl_ms.unwrap().n, 30);
    assert!(o.ttft_ms.unwrap().p50 >= 145.0);
    assert_eq!(r.sessions.len(), 2);
    assert!(r.sessions.iter().all(|s| s.turns_done == 3 && s.wall_s > 0.0));
    // The report renders every system, and the charts are written.
    let dir = tempfile::tempdir().unwrap();
    let report = tandem_bench::report::AgentReport { systems: vec![r.clone(), r], ..Default::default() };
    let files = tandem_bench::report::write_agent_report(dir.path(), &report).unwrap();
    assert_eq!(files.len(), 6);
    for f in &files {
        assert!(std::fs::metadata(f).unwrap().len() > 100, "{}", f.display());
    }
    let md = std::fs::read_to_string(dir.path().join("agent.md")).unwrap();
    assert!(md.contains("| fake | 6 | 0 |"), "{md}");
}
