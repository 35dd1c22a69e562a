use serde_json::json;
use tandem_model::chat_template::{ChatTemplate, RenderOptions};
#[test]
fn bench() {
    let src = std::fs::read_to_string("/tmp/tpl_qwen25.jinja").unwrap();
    let t = ChatTemplate::new(&src, None, Some("<|im_end|>".into())).unwrap();
    for n in [50usize, 200, 500] {
        let m: Vec<_> = (0..n).map(|i| json!({"role": if i % 2 == 0 {"user"} else {"assistant"}, "content": "x".repeat(2000)})).collect();
        let t0 = std::time::Instant::now();
        let r = t.render(&m, &RenderOptions { add_generation_prompt: true, ..Default::default() }).unwrap();
        eprintln!("n={n} len={} took {:?}", r.text.len(), t0.elapsed());
    }
}
