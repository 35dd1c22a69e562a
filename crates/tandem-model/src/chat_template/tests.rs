//! Unit tests of chat template rendering: HF template features, sandbox limits, boundaries.

use super::*;
use serde_json::json;

/// Qwen2.5-Instruct's template (tools, `tojson`, tool calls and responses).
const QWEN25: &str = r#"{%- if tools %}
    {{- '<|im_start|>system\n' }}
    {%- if messages[0]['role'] == 'system' %}
        {{- messages[0]['content'] }}
    {%- else %}
        {{- 'You are Qwen, created by Alibaba Cloud. You are a helpful assistant.' }}
    {%- endif %}
    {{- "\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>" }}
    {%- for tool in tools %}
        {{- "\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n" }}
{%- else %}
    {%- if messages[0]['role'] == 'system' %}
        {{- '<|im_start|>system\n' + messages[0]['content'] + '<|im_end|>\n' }}
    {%- else %}
        {{- '<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n' }}
    {%- endif %}
{%- endif %}
{%- for message in messages %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) or (message.role == "assistant" and not message.tool_calls) %}
        {{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>' + '\n' }}
    {%- elif message.role == "assistant" %}
        {{- '<|im_start|>' + message.role }}
        {%- if message.content %}
            {{- '\n' + message.content }}
        {%- endif %}
        {%- for tool_call in message.tool_calls %}
            {%- if tool_call.function is defined %}
                {%- set tool_call = tool_call.function %}
            {%- endif %}
            {{- '\n<tool_call>\n{"name": "' }}
            {{- tool_call.name }}
            {{- '", "arguments": ' }}
            {{- tool_call.arguments | tojson }}
            {{- '}\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\n' }}
    {%- elif message.role == "tool" %}
        {%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\n<tool_response>\n' }}
        {{- message.content }}
        {{- '\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
{%- endif %}
"#;

/// Python-isms from Qwen3-style templates: namespace, reversed slices, str methods, loop
/// controls, `is string`, `strftime_now`, extra globals.
const QWEN3_FEATURES: &str = r#"{%- set ns = namespace(last_query_index=messages|length - 1, found=false) %}
{%- for message in messages[::-1] %}
    {%- set index = (messages|length - 1) - loop.index0 %}
    {%- if not ns.found and message.role == "user" and message.content is string and not message.content.startswith('<tool_response>') %}
        {%- set ns.found = true %}
        {%- set ns.last_query_index = index %}
        {%- break %}
    {%- endif %}
{%- endfor %}
{%- for message in messages %}
    {%- set content = message.content if message.content is string else '' %}
    {%- if message.role == "assistant" and '</think>' in content %}
        {%- set reasoning = content.split('</think>')[0].rstrip('\n').split('<think>')[-1].lstrip('\n') %}
        {%- set content = content.split('</think>')[-1].lstrip('\n') %}
        {%- if loop.index0 > ns.last_query_index %}
            {{- '<|im_start|>assistant\n<think>\n' + reasoning.strip() + '\n</think>\n\n' + content + '<|im_end|>\n' }}
        {%- else %}
            {{- '<|im_start|>assistant\n' + content + '<|im_end|>\n' }}
        {%- endif %}
    {%- else %}
        {{- '<|im_start|>' + message.role + '\n' + content.strip() + '<|im_end|>\n' }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
    {%- if enable_thinking is defined and enable_thinking is false %}
        {{- '<think>\n\n</think>\n\n' }}
    {%- endif %}
{%- endif %}
{{- '' if strftime_now('%Y')|length == 4 else raise_exception('bad year') }}
"#;

fn msgs() -> Vec<serde_json::Value> {
    vec![
        json!({"role": "system", "content": "You are a helpful assistant."}),
        json!({"role": "user", "content": "What is 2+2?"}),
    ]
}

fn gen() -> RenderOptions {
    RenderOptions { add_generation_prompt: true, ..Default::default() }
}

/// Gemma's built-in template: turns named user / model, the system prompt folded into the
/// first user turn, contents trimmed, BOS first.
#[test]
fn gemma_template_renders_gemma_turns() {
    let t = ChatTemplate::new(GEMMA_TEMPLATE, Some("<bos>".into()), Some("<eos>".into())).unwrap();
    let mut m = msgs();
    m.push(json!({"role": "assistant", "content": [{"type": "text", "text": " 4 "}]}));
    m.push(json!({"role": "user", "content": "And 3+3?"}));
    let r = t.render(&m, &gen()).unwrap();
    assert_eq!(
        r.text,
        "<bos><start_of_turn>user\nYou are a helpful assistant.\n\nWhat is 2+2?<end_of_turn>\n\
         <start_of_turn>model\n4<end_of_turn>\n<start_of_turn>user\nAnd 3+3?<end_of_turn>\n<start_of_turn>model\n"
    );
    let plain = t.render(&[json!({"role": "user", "content": "Hi"})], &RenderOptions::default()).unwrap();
    assert_eq!(plain.text, "<bos><start_of_turn>user\nHi<end_of_turn>\n");
}

#[test]
fn chatml_renders_and_marks_message_ends() {
    let t = ChatTemplate::new(CHATML_TEMPLATE, None, None).unwrap();
    let mut m = msgs();
    m.push(json!({"role": "assistant", "content": [{"type": "text", "text": "4"}]}));
    let r = t.render(&m, &gen()).unwrap();
    assert_eq!(
        r.text,
        "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n4<|im_end|>\n<|im_start|>assistant\n"
    );
    let ends: Vec<&str> = r.message_ends.iter().map(|&e| &r.text[..e]).collect();
    assert!(ends[0].ends_with("assistant.<|im_end|>\n"));
    assert!(ends[1].ends_with("2+2?<|im_end|>\n"));
    assert!(ends[2].ends_with("4<|im_end|>\n"));
    assert_eq!(r.message_ends[2] + "<|im_start|>assistant\n".len(), r.text.len());

    let no_gen = t.render(&m, &RenderOptions::default()).unwrap();
    assert_eq!(no_gen.message_ends.last(), Some(&no_gen.text.len()));
}

#[test]
fn qwen25_tools_and_tool_calls_render_like_transformers() {
    let t = ChatTemplate::new(QWEN25, None, Some("<|im_end|>".into())).unwrap();
    let tools = json!([{"type": "function", "function": {"name": "get_weather",
        "description": "Weather in a city", "parameters": {"type": "object",
        "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]);
    let m = vec![
        json!({"role": "user", "content": "Weather in Paris?"}),
        json!({"role": "assistant", "content": "", "tool_calls": [{"type": "function",
            "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]}),
        json!({"role": "tool", "content": "{\"temp\": 21}"}),
    ];
    let opts = RenderOptions { tools: Some(tools), ..gen() };
    let r = t.render(&m, &opts).unwrap();
    assert!(r.text.contains(
        "<tools>\n{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"description\": \"Weather in a city\", \"parameters\": {\"type\": \"object\", \"properties\": {\"city\": {\"type\": \"string\"}}, \"required\": [\"city\"]}}}\n</tools>"
    ), "{}", r.text);
    assert!(r.text.contains(
        "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call><|im_end|>\n"
    ));
    assert!(r.text.ends_with(
        "<|im_start|>user\n<tool_response>\n{\"temp\": 21}\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
    ));
    assert_eq!(r.message_ends.len(), 3);
    assert!(r.message_ends.windows(2).all(|w| w[0] <= w[1]));

    // Without tools the other branch runs.
    let r = t.render(&msgs(), &gen()).unwrap();
    assert!(r.text.starts_with("<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"));
}

#[test]
fn python_features_and_extra_globals() {
    let t = ChatTemplate::new(QWEN3_FEATURES, None, None).unwrap();
    let m = vec![
        json!({"role": "user", "content": "  hi  "}),
        json!({"role": "assistant", "content": "<think>\nplan\n</think>\n\nhello"}),
        json!({"role": "user", "content": "again"}),
        json!({"role": "assistant", "content": "<think>\nmore\n</think>\n\nsure"}),
    ];
    let mut extra = serde_json::Map::new();
    extra.insert("enable_thinking".into(), json!(false));
    let r = t.render(&m, &RenderOptions { extra, ..gen() }).unwrap();
    assert_eq!(
        r.text,
        "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\nhello<|im_end|>\n<|im_start|>user\nagain<|im_end|>\n<|im_start|>assistant\n<think>\nmore\n</think>\n\nsure<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
    );
}

#[test]
fn special_tokens_are_globals() {
    let t = ChatTemplate::new(
        "{{ bos_token }}{{ messages[0].content }}{{ eos_token }}",
        Some("<s>".into()),
        Some("</s>".into()),
    )
    .unwrap();
    assert_eq!(t.render(&msgs()[..1], &RenderOptions::default()).unwrap().text, "<s>You are a helpful assistant.</s>");
    assert_eq!(t.source(), "{{ bos_token }}{{ messages[0].content }}{{ eos_token }}");
}

#[test]
fn malformed_templates_are_rejected() {
    for src in ["{% for x in %}", "{{ foo( }}", "{% frobnicate %}", "{% if x %}never closed"] {
        assert!(matches!(ChatTemplate::new(src, None, None), Err(ModelError::Template(_))), "{src}");
    }
}

#[test]
fn runaway_templates_fail_instead_of_hanging() {
    let start = std::time::Instant::now();
    let spin = "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}";
    let t = ChatTemplate::new(spin, None, None).unwrap();
    assert!(matches!(t.render(&msgs(), &gen()), Err(ModelError::Template(_))));
    assert!(start.elapsed() < std::time::Duration::from_secs(30));

    let big = format!("{{% for i in range(100000) %}}{}{{% endfor %}}", "x".repeat(1000));
    let t = ChatTemplate::new(&big, None, None).unwrap();
    match t.render(&msgs(), &gen()) {
        Err(ModelError::Template(m)) => assert!(m.contains("exceeds"), "{m}"),
        other => panic!("expected an output-size error, got {other:?}"),
    }

    let recurse = "{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}";
    let t = ChatTemplate::new(recurse, None, None).unwrap();
    assert!(t.render(&msgs(), &gen()).is_err());
}

#[test]
fn raise_exception_and_odd_messages_are_errors_not_panics() {
    let t = ChatTemplate::new("{{ raise_exception('only user/assistant roles') }}", None, None).unwrap();
    match t.render(&msgs(), &gen()) {
        Err(ModelError::Template(m)) => assert!(m.contains("only user/assistant roles"), "{m}"),
        other => panic!("expected an error, got {other:?}"),
    }
    let t = ChatTemplate::new(CHATML_TEMPLATE, None, None).unwrap();
    let odd = vec![json!(42), json!({"content": null}), json!({"role": "user"}), json!([1, 2])];
    for m in odd {
        let _ = t.render(std::slice::from_ref(&m), &gen());
    }
    assert_eq!(t.render(&[], &gen()).unwrap().text, "<|im_start|>assistant\n");
}

#[test]
fn failing_prefixes_fall_back_to_previous_boundary() {
    // Refuses any conversation whose last message is not from the user.
    let src = "{% if messages[-1].role != 'user' %}{{ raise_exception('no user query') }}{% endif %}\
{% for m in messages %}[{{ m.role }}:{{ m.content }}]{% endfor %}";
    let t = ChatTemplate::new(src, None, None).unwrap();
    let r = t.render(&msgs(), &RenderOptions::default()).unwrap();
    assert_eq!(r.text, "[system:You are a helpful assistant.][user:What is 2+2?]");
    assert_eq!(r.message_ends, vec![0, r.text.len()]);
}

#[test]
fn only_the_last_messages_get_boundaries_so_rendering_stays_linear() {
    let t = ChatTemplate::new(CHATML_TEMPLATE, None, None).unwrap();
    let n = 2000;
    let many: Vec<_> =
        (0..n).map(|i| json!({"role": if i % 2 == 0 { "user" } else { "assistant" }, "content": "a"})).collect();
    let r = t.render(&many, &RenderOptions::default()).unwrap();
    // One full render plus BOUNDARY_MESSAGES prefix renders, not one per message.
    let ends = &r.message_ends;
    assert_eq!(ends.len(), n);
    assert!(ends[..n - BOUNDARY_MESSAGES].iter().all(|&e| e == 0));
    let tail = &ends[n - BOUNDARY_MESSAGES..];
    assert!(tail.windows(2).all(|w| w[0] < w[1]), "{tail:?}");
    assert_eq!(*tail.last().unwrap(), r.text.len());
    for &e in tail {
        assert!(r.text[..e].ends_with("<|im_end|>\n"), "boundary {e} is not a message end");
    }
}

#[test]
fn overlapping_tag_delimiters_are_errors_not_panics() {
    // Found by the model_files fuzz target: `{%}` made the generation-tag stripper slice
    // backwards.
    for src in ["{%}", "a{%}b{% endif %}", "{%}%}", "{% generation %}x{%- endgeneration -%}{%}"] {
        let _ = ChatTemplate::new(src, None, None);
    }
    assert_eq!(builtins::strip_generation_tags("{% generation %}x{% endgeneration %}"), "x");
    assert_eq!(builtins::strip_generation_tags("{%}"), "{%}");
}
