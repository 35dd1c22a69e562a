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
