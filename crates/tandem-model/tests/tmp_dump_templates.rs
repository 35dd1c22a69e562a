use serde_json::json;
use tandem_model::chat_template::{ChatTemplate, RenderOptions};
#[test]
fn dump() {
    let src = std::fs::read_to_string("/tmp/tpl_qwen25.jinja").unwrap();
    let t = ChatTemplate::new(&src, None, Some("<|im_end|>".into())).unwrap();
    let tools = json!([{"type": "function", "function": {"name": "get_weather",
        "description": "Weather in a city — ünï", "parameters": {"type": "object",
        "properties": {"city": {"type": "string"}, "n": {"type": "number", "default": 1.5}}, "required": ["city"]}}}]);
    let m = vec![
        json!({"role": "system", "content": "sys"}),
        json!({"role": "user", "content": "Weather in Paris?"}),
        json!({"role": "assistant", "content": "", "tool_calls": [{"type": "function",
            "function": {"name": "get_weather", "arguments": {"city": "Paris", "z": [1, {"q": null}]}}}]}),
        json!({"role": "tool", "content": "{\"temp\": 21}"}),
        json!({"role": "tool", "content": "second"}),
    ];
    let opts = RenderOptions { tools: Some(tools), add_generation_prompt: true, ..Default::default() };
    let r = t.render(&m, &opts).unwrap();
    std::fs::write("/tmp/rust_qwen25.txt", &r.text).unwrap();
    let r = t.render(&m[1..2], &RenderOptions { add_generation_prompt: true, ..Default::default() }).unwrap();
    std::fs::write("/tmp/rust_qwen25b.txt", &r.text).unwrap();
}
