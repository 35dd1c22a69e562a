use std::io::Cursor;
use candle_core::{Device, Module, Tensor};
use candle_core::quantized::QMatMul;
use tandem_model::loader::gguf::GgufSource;
use tandem_model::loader::{LinearWeight, WeightSource};

#[test]
fn dbg() {
    let p = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../models/smollm2-135m.gguf");
    let src = GgufSource::open(&p, &Device::Cpu).unwrap();
    let bytes = std::fs::read(&p).unwrap();
    for name in ["blk.0.attn_q.weight", "blk.0.attn_k.weight", "blk.0.ffn_down.weight", "blk.0.ffn_up.weight", "blk.5.attn_output.weight"] {
        let info = &src.content.tensor_infos[name];
        let qt = info.read(&mut Cursor::new(&bytes[..]), src.content.tensor_data_offset, &Device::Cpu).unwrap();
        let k = qt.shape().dims2().unwrap().1;
        let LinearWeight::Ggml(ours) = src.qmatmul(name).unwrap() else { panic!() };
        let wd = qt.dequantize(&Device::Cpu).unwrap().flatten_all().unwrap().to_vec1::<f32>().unwrap();
        let cand = QMatMul::from_qtensor(qt).unwrap();
        let od = ours.dequantize();
        let dmax = wd.iter().zip(&od).map(|(a,b)| (a-b).abs()).fold(0f32, f32::max);
        for m in [1usize, 7] {
            let x = Tensor::randn(0f32, 1.0, (m, k), &Device::Cpu).unwrap();
            let a = cand.forward(&x).unwrap().flatten_all().unwrap().to_vec1::<f32>().unwrap();
            let b = ours.forward(&x).unwrap().flatten_all().unwrap().to_vec1::<f32>().unwrap();
            let diff = a.iter().zip(&b).map(|(a,b)| (a-b).abs()).fold(0f32, f32::max);
            let sc = a.iter().map(|a| a.abs()).fold(0f32, f32::max);
            eprintln!("{name} {:?} m={m}: dequant diff {dmax}, out rel {}", ours, diff/sc);
        }
    }
}

#[test]
fn dbg_logits() {
    use tandem_model::batch::{LogitsWanted, SeqChunk};
    use tandem_model::kv::SequenceCache;
    let p = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../models/smollm2-135m.gguf");
    let model = tandem_model::loader::load(&p, &Device::Cpu).unwrap().model;
    let prompt: Vec<u32> = vec![504, 3575, 282, 4649, 314];
    let want: Vec<u32> = vec![7042, 30, 198, 198, 504, 1797, 1918];
    let mut toks = prompt.clone();
    toks.extend_from_slice(&want[..5]);
    let mut cache = SequenceCache::new(&model.cache_spec(), &Device::Cpu);
    let mut chunks = [SeqChunk { tokens: &toks, cache: &mut cache, logits: LogitsWanted::All }];
    let logits = model.forward(&mut chunks).unwrap().pop().flatten().unwrap();
    let v = logits.to_vec2::<f32>().unwrap();
    for (i, row) in v.iter().enumerate().skip(4) {
        let mut idx: Vec<usize> = (0..row.len()).collect();
        idx.sort_by(|&a, &b| row[b].partial_cmp(&row[a]).unwrap());
        eprintln!("pos {}: {:?}", i - 4, idx[..3].iter().map(|&j| (j, row[j])).collect::<Vec<_>>());
    }
}

#[test]
fn dbg_incr() {
    use tandem_model::batch::{LogitsWanted, SeqChunk};
    use tandem_model::kv::SequenceCache;
    let p = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../models/smollm2-135m.gguf");
    let model = tandem_model::loader::load(&p, &Device::Cpu).unwrap().model;
    let prompt: Vec<u32> = vec![504, 3575, 282, 4649, 314];
    let want: Vec<u32> = vec![7042, 30, 198, 198, 504, 1797, 1918];
    let mut cache = SequenceCache::new(&model.cache_spec(), &Device::Cpu);
    let mut input = prompt.clone();
    for i in 0..6 {
        let mut chunks = [SeqChunk { tokens: &input, cache: &mut cache, logits: LogitsWanted::Last }];
        let logits = model.forward(&mut chunks).unwrap().pop().flatten().unwrap();
        let row = logits.flatten_all().unwrap().to_vec1::<f32>().unwrap();
        let mut idx: Vec<usize> = (0..row.len()).collect();
        idx.sort_by(|&a, &b| row[b].partial_cmp(&row[a]).unwrap());
        eprintln!("incr pos {}: {:?}", i, idx[..3].iter().map(|&j| (j, row[j])).collect::<Vec<_>>());
        input = vec![want[i]];
    }
}

#[test]
fn dbg_rows() {
    use tandem_model::batch::{LogitsWanted, SeqChunk};
    use tandem_model::kv::SequenceCache;
    let p = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../models/smollm2-135m.gguf");
    let model = tandem_model::loader::load(&p, &Device::Cpu).unwrap().model;
    let toks: Vec<u32> = vec![504, 3575, 282, 4649, 314, 7042, 30, 198, 198, 504];
    let mut outs = vec![];
    for n in [5usize, 6, 8, 10] {
        let mut cache = SequenceCache::new(&model.cache_spec(), &Device::Cpu);
        let mut chunks = [SeqChunk { tokens: &toks[..n], cache: &mut cache, logits: LogitsWanted::All }];
        let logits = model.forward(&mut chunks).unwrap().pop().flatten().unwrap();
        outs.push(logits.get(4).unwrap().to_vec1::<f32>().unwrap());
    }
    for o in &outs[1..] {
        let d = o.iter().zip(&outs[0]).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
        eprintln!("row 4 max diff vs n=5: {d}");
    }
}

#[test]
fn dbg_margins() {
    use tandem_model::batch::{LogitsWanted, SeqChunk};
    use tandem_model::kv::SequenceCache;
    let p = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../models/smollm2-135m.gguf");
    let model = tandem_model::loader::load(&p, &Device::Cpu).unwrap().model;
    let fx: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/smollm2-llamacpp-greedy.json")).unwrap()).unwrap();
    let ids = |v: &serde_json::Value| v.as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect::<Vec<u32>>();
    let (mut sum, mut cnt, mut bad) = (0f64, 0, 0);
    let ths = [0.05, 0.1, 0.2, 0.3, 0.5];
    let mut fails = [0usize; 5];
    for case in fx["cases"].as_array().unwrap() {
        let prompt = ids(&case["prompt_ids"]);
        let want = ids(&case["greedy_ids"]);
        let margins: Vec<f64> = case["top1_top2_logprob_margin"].as_array().unwrap().iter().map(|m| m.as_f64().unwrap()).collect();
        let mut cache = SequenceCache::new(&model.cache_spec(), &Device::Cpu);
        let mut input = prompt.clone();
        let mut line = String::new();
        for (i, &w) in want.iter().enumerate() {
            let mut chunks = [SeqChunk { tokens: &input, cache: &mut cache, logits: LogitsWanted::Last }];
            let v = model.forward(&mut chunks).unwrap().pop().flatten().unwrap().flatten_all().unwrap().to_vec1::<f32>().unwrap();
            let other = v.iter().enumerate().filter(|(j, _)| *j as u32 != w).map(|(_, x)| *x).fold(f32::NEG_INFINITY, f32::max);
            let ours = (v[w as usize] - other) as f64;
            let d = ours - margins[i];
            sum += d.abs(); cnt += 1;
            if ours < 0.0 && margins[i] >= 0.05 { bad += 1; eprintln!("mismatch at margin {}", margins[i]); }
            let rank = v.iter().filter(|&&x| x > v[w as usize]).count();
            for (t, th) in ths.iter().enumerate() {
                if (margins[i] >= *th && rank > 0) || rank > 1 { fails[t] += 1; if t == 4 { eprintln!("fail@0.5: pos {i} margin {} rank {rank} ours {ours}", margins[i]); } }
            }
            line += &format!("{:+.2} ", d);
            input = vec![w];
        }
        eprintln!("deltas: {line}");
    }
    eprintln!("FAILS per threshold {:?}: {:?}", ths, fails);
    eprintln!("MEAN |delta margin| {:.4} over {cnt}, decisive mismatches {bad}", sum / cnt as f64);
}
