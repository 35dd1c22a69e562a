//! Parser tests for every format: whole answers, malformed calls degrading to content, and the
//! output cut at every byte (and fed character by character) giving the same result.

use serde_json::{json, Value};

use super::*;

fn parser(format: ToolFormat) -> ToolParser {
    let tools = json!([{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {
        "city": {"type": "string"}, "days": {"type": "integer"}}}}}]);
    ToolParser::new(format, ToolSchemas::from_tools(Some(&tools)), true).with_sequential_ids()
}

type Parsed = (String, Vec<(String, Value)>);

fn simplify((content, calls): (String, Vec<ToolCall>)) -> Parsed {
    let calls = calls
        .into_iter()
        .map(|c| (c.name, serde_json::from_str(&c.arguments).unwrap_or(Value::String(c.arguments))))
        .collect();
    (content, calls)
}

fn stream(format: ToolFormat, deltas: &[&str]) -> (String, Vec<ToolCall>) {
    let mut p = parser(format);
    let mut events = Vec::new();
    for d in deltas {
        events.extend(p.push(d));
    }
    events.extend(p.finish());
    // Every call starts before its arguments, with consecutive indices.
    let mut next = 0;
    for e in &events {
        match e {
            ToolEvent::Start { index, id, .. } => {
                assert_eq!((*index, id.as_str()), (next, format!("call_{next}").as_str()));
                next += 1;
            }
            ToolEvent::Args { index, .. } => assert!(*index < next),
            ToolEvent::Content(s) => assert!(!s.is_empty()),
        }
    }
    assemble(&events)
}

/// The whole-text parse, checked against every two-piece cut, every three-piece cut on a
/// coarse grid, and a character-by-character feed.
fn check(format: ToolFormat, text: &str) -> Parsed {
    let whole = parser(format).parse_all(text);
    assert_eq!(stream(format, &[text]), whole);
    let bounds: Vec<usize> = (0..=text.len()).filter(|&i| text.is_char_boundary(i)).collect();
    for &i in &bounds {
        assert_eq!(stream(format, &[&text[..i], &text[i..]]), whole, "{format:?} cut at {i}: {text:?}");
    }
    for &i in bounds.iter().step_by(5) {
        for &j in bounds.iter().filter(|&&j| j >= i).step_by(3) {
            assert_eq!(stream(format, &[&text[..i], &text[i..j], &text[j..]]), whole, "{format:?} cuts {i},{j}");
        }
    }
    let chars: Vec<String> = text.chars().map(String::from).collect();
    let refs: Vec<&str> = chars.iter().map(String::as_str).collect();
    assert_eq!(stream(format, &refs), whole, "{format:?} char by char");
    simplify(whole)
}

fn call(name: &str, args: Value) -> (String, Value) {
    (name.to_string(), args)
}

#[test]
fn hermes_calls() {
    let f = ToolFormat::Hermes;
    let text = "Let me check.\n\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"days\": 2}}\n</tool_call>\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Zürich\"}}\n</tool_call>";
    assert_eq!(
        check(f, text),
        (
            "Let me check.".into(),
            vec![
                call("get_weather", json!({"city": "Paris", "days": 2})),
                call("get_weather", json!({"city": "Zürich"}))
            ]
        )
    );
    // Content after the calls, a call cut off at the end of output (no closing tag).
    assert_eq!(
        check(f, "<tool_call>{\"name\":\"a\",\"arguments\":{}}</tool_call>\n\nDone.\n"),
        ("Done.".into(), vec![call("a", json!({}))])
    );
    assert_eq!(
        check(f, "<tool_call>\n{\"name\": \"a\", \"arguments\": {\"x\": 1}}\n"),
        (String::new(), vec![call("a", json!({"x": 1}))])
    );
}

#[test]
fn malformed_hermes_is_content() {
    let f = ToolFormat::Hermes;
    // A header that is not a call's stays content; ...
    let bad = "Hi <tool_call>{\"nme\": \"a\", \"arguments\": {}}</tool_call> bye";
    assert_eq!(check(f, bad), (bad.into(), vec![]));
    // ... once the name is out, broken arguments end the call where they break.
    let broken = "Hi <tool_call>{\"name\": \"a\", \"arguments\": {\"x\": 1 oops}</tool_call> bye";
    assert_eq!(check(f, broken), ("Hi bye".into(), vec![call("a", json!("{\"x\": 1 "))]));
    let unclosed = "Hi\n<tool_call>{\"nam";
    assert_eq!(check(f, unclosed), (unclosed.into(), vec![]));
    assert_eq!(check(f, "a < b <tool_ and <tool_call"), ("a < b <tool_ and <tool_call".into(), vec![]));
    // A good call after a bad one still counts.
    let mixed = "<tool_call>nope</tool_call><tool_call>{\"name\":\"b\"}</tool_call>";
    assert_eq!(check(f, mixed), ("<tool_call>nope</tool_call>".into(), vec![call("b", json!({}))]));
    // Plain text passes through exactly, whitespace included.
    assert_eq!(check(f, "\n  plain text\n\n"), ("\n  plain text\n\n".into(), vec![]));
}

#[test]
fn qwen_xml_calls() {
    let f = ToolFormat::QwenXml;
    let text = "Checking.\n<tool_call>\n<function=get_weather>\n<parameter=city>\nSão Paulo\n</parameter>\n<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>";
    assert_eq!(
        check(f, text),
        ("Checking.".into(), vec![call("get_weather", json!({"city": "São Paulo", "days": 3}))])
    );
    // Without the <tool_call> wrapper, and two calls in a row.
    let bare = "<function=get_weather>\n<parameter=city>\nRome\n</parameter>\n</function>\n<function=other>\n<parameter=q>\n{\"a\": 1}\n</parameter>\n</function>";
    assert_eq!(
        check(f, bare),
        (String::new(), vec![call("get_weather", json!({"city": "Rome"})), call("other", json!({"q": {"a": 1}}))])
    );
    let bad = "x <tool_call>\n<function=>\n</function>\n</tool_call> y";
    assert_eq!(check(f, bad), (bad.into(), vec![]));
}

#[test]
fn llama3_calls() {
    let f = ToolFormat::Llama3;
    assert_eq!(
        check(f, "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Oslo\"}}"),
        (String::new(), vec![call("get_weather", json!({"city": "Oslo"}))])
    );
    assert_eq!(
        check(
            f,
            "<|python_tag|>{\"name\": \"a\", \"parameters\": {}}; {\"name\": \"b\", \"parameters\": {\"k\": true}}"
        ),
        (String::new(), vec![call("a", json!({})), call("b", json!({"k": true}))])
    );
    assert_eq!(check(f, "The answer is {x}."), ("The answer is {x}.".into(), vec![]));
    assert_eq!(check(f, "{\"not\": \"a call\"}"), ("{\"not\": \"a call\"}".into(), vec![]));
    assert_eq!(check(f, "  {broken"), ("  {broken".into(), vec![]));
}

/// Name first, then arguments while they are generated, before the call closes.
#[test]
fn calls_stream_incrementally() {
    let mut p = parser(ToolFormat::Hermes);
    assert_eq!(p.push("Sure. <tool_call>\n{\"name\": \"get_weather\", "), vec![ToolEvent::Content("Sure.".into())]);
    assert_eq!(
        p.push("\"arguments\": {\"ci"),
        vec![
            ToolEvent::Start { index: 0, id: "call_0".into(), name: "get_weather".into() },
            ToolEvent::Args { index: 0, fragment: "{\"ci".into() }
        ]
    );
    assert_eq!(p.push("ty\": \"Paris\"}"), vec![ToolEvent::Args { index: 0, fragment: "ty\": \"Paris\"}".into() }]);
    assert_eq!(p.push("}\n</tool_call>"), vec![]);
    assert_eq!(p.finish(), vec![]);

    let mut x = parser(ToolFormat::QwenXml);
    assert_eq!(
        x.push("<tool_call>\n<function=get_weather>\n<parameter=city>\nPar"),
        vec![ToolEvent::Start { index: 0, id: "call_0".into(), name: "get_weather".into() },]
    );
    assert_eq!(
        x.push("is\n</parameter>\n<parameter=days>"),
        vec![ToolEvent::Args { index: 0, fragment: "{\"city\":\"Paris\"".into() }]
    );
    assert_eq!(
        x.push("\n2\n</parameter>\n</function>"),
        vec![ToolEvent::Args { index: 0, fragment: ",\"days\":2}".into() }]
    );
    assert_eq!(x.push("\n</tool_call>"), vec![]);
}

#[test]
fn parallel_off_keeps_the_first_call() {
    let text = "<tool_call>{\"name\":\"a\"}</tool_call><tool_call>{\"name\":\"b\"}</tool_call>";
    let (_, calls) = ToolParser::new(ToolFormat::Hermes, ToolSchemas::default(), false).parse_all(text);
    assert_eq!(calls.len(), 1);
    assert_eq!(calls[0].name, "a");
    assert!(calls[0].id.starts_with("call_") && calls[0].id.len() == 29);
}

#[test]
fn format_detection() {
    assert_eq!(ToolFormat::detect("{{- '<tool_call>\\n<function=' + name }}"), Some(ToolFormat::QwenXml));
    assert_eq!(ToolFormat::detect("<tool_call>\\n{\"name\": ...}"), Some(ToolFormat::Hermes));
    assert_eq!(ToolFormat::detect("{%- if message.role == 'ipython' %}"), Some(ToolFormat::Llama3));
    assert_eq!(ToolFormat::detect("<|im_start|>"), None);
    assert_eq!(ToolFormat::from_name("qwen3_coder"), Some(ToolFormat::QwenXml));
    assert_eq!(ToolFormat::from_name("nope"), None);
}

#[test]
fn template_arguments_become_objects() {
    let mut m = json!({"role": "assistant", "tool_calls": [
        {"id": "1", "type": "function", "function": {"name": "f", "arguments": "{\"a\": 1}"}},
        {"id": "2", "type": "function", "function": {"name": "g", "arguments": "not json"}}
    ]});
    arguments_as_objects(m.as_object_mut().unwrap());
    assert_eq!(m["tool_calls"][0]["function"]["arguments"], json!({"a": 1}));
    assert_eq!(m["tool_calls"][1]["function"]["arguments"], "not json");
}

#[test]
fn tricky_calls() {
    let f = ToolFormat::Hermes;
    assert_eq!(
        check(f, "<tool_call>{\"name\": \"f\", \"arguments\": \"{\\\"a\\\": 1}\"}</tool_call>"),
        (String::new(), vec![call("f", json!({"a": 1}))])
    );
    assert_eq!(
        check(f, "<tool_call>{\"name\": \"f\", \"arguments\": {\"s\": \"</tool_call> é\"}}</tool_call>"),
        (String::new(), vec![call("f", json!({"s": "</tool_call> é"}))])
    );
    let x = ToolFormat::QwenXml;
    assert_eq!(
        check(x, "<tool_call>\n<function=f>\njunk\n<parameter=q>\na < b\n<parameter=days>\n2\n</parameter>\n</function>\n</tool_call>"),
        (String::new(), vec![call("f", json!({"q": "a < b", "days": "2"}))])
    );
    assert_eq!(
        check(x, "<tool_call>\n<function=f>\n<parameter=city>\nOslo"),
        (String::new(), vec![call("f", json!({"city": "Oslo"}))])
    );
}

/// Random texts built from tags and JSON pieces: every random cut streams to the whole parse.
/// `TOOLS_SEED` and `TOOLS_TEXTS` widen the search when run by hand.
#[test]
fn random_texts_stream_like_whole() {
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};
    const PIECES: &[&str] = &[
        "<tool_call>",
        "</tool_call>",
        "<function=",
        "f>",
        "</function>",
        "<parameter=",
        "a>",
        "</parameter>",
        "{\"name\": \"f\", ",
        "\"arguments\": ",
        "{",
        "}",
        "\"x\"",
        ": ",
        "1",
        ",",
        "\n",
        " ",
        "é",
        "<",
        "text",
        "\"",
        "[",
        "]",
        "<|python_tag|>",
        "\\",
    ];
    let seed: u64 = std::env::var("TOOLS_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or(7);
    let n: usize = std::env::var("TOOLS_TEXTS").ok().and_then(|s| s.parse().ok()).unwrap_or(400);
    let mut rng = StdRng::seed_from_u64(seed);
    for _ in 0..n {
        let text: String = (0..rng.random_range(0..30)).map(|_| PIECES[rng.random_range(0..PIECES.len())]).collect();
        for f in [ToolFormat::Hermes, ToolFormat::QwenXml, ToolFormat::Llama3] {
            let whole = parser(f).parse_all(&text);
            let bounds: Vec<usize> = (0..=text.len()).filter(|&i| text.is_char_boundary(i)).collect();
            for _ in 0..8 {
                let mut cuts: Vec<usize> =
                    (0..rng.random_range(1..5)).map(|_| bounds[rng.random_range(0..bounds.len())]).collect();
                cuts.sort();
                let mut pieces = Vec::new();
                let mut last = 0;
                for c in cuts {
                    pieces.push(&text[last..c]);
                    last = c;
                }
                pieces.push(&text[last..]);
                assert_eq!(stream(f, &pieces), whole, "{f:?} {text:?} cut into {pieces:?}");
            }
        }
    }
}

#[test]
fn plain_json_answers_are_calls_of_offered_tools() {
    let call = json!({"city": "Paris"});
    for format in [ToolFormat::Hermes, ToolFormat::QwenXml] {
        for text in [
            r#"{"name": "get_weather", "arguments": {"city": "Paris"}}"#,
            "\n{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}\n",
            "```json\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n```",
            "```\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n```\n",
            r#"[{"name": "get_weather", "arguments": {"city": "Paris"}}]"#,
        ] {
            assert_eq!(
                check(format, text),
                (String::new(), vec![("get_weather".into(), call.clone())]),
                "{format:?} {text:?}"
            );
        }
        // Two calls in one answer.
        let two = "{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\", \"days\": 3}}";
        let (content, calls) = check(format, two);
        assert_eq!(content, "");
        assert_eq!(calls[1], ("get_weather".into(), json!({"city": "Oslo", "days": 3})));
    }
}

#[test]
fn plain_json_that_is_not_a_call_stays_content() {
    for format in [ToolFormat::Hermes, ToolFormat::QwenXml] {
        for text in [
            r#"{"name": "Paris", "country": "France"}"#,
            r#"{"name": "get_weather", "arguments": {"city": 3}}"#,
            "```json\n{\"weather\": \"sunny\"}\n```",
            "```python\nprint({\"name\": \"get_weather\"})\n```",
            "[link](http://example.com)",
            "`code` and text",
        ] {
            assert_eq!(check(format, text), (text.to_string(), vec![]), "{format:?} {text:?}");
        }
    }
    // No tools offered: JSON is content.
    let p = ToolParser::new(ToolFormat::Hermes, ToolSchemas::default(), true);
    let text = r#"{"name": "get_weather", "arguments": {"city": "Paris"}}"#;
    assert_eq!(p.parse_all(text), (text.to_string(), vec![]));
}

#[test]
fn a_code_answer_streams_before_its_end() {
    // Only a ```json (or bare ```) fence is held back; another language streams as it comes.
    let mut p = parser(ToolFormat::Hermes);
    assert!(p.push("```py").is_empty(), "the fence's language is not known yet");
    let events = p.push("thon\nprint(1)\n");
    assert_eq!(events, vec![ToolEvent::Content("```python\nprint(1)".into())]);
}
