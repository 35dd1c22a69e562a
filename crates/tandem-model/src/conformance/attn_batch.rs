//! The batched attention check: one [`crate::kv::attend_batch`] over sequences of different
//! depths and chunk lengths (one past a split-KV segment boundary) against the same sequences
//! one at a time ([`LayerKv::attend`]) on a second store holding the same KV: the outputs and
//! the written pools must agree bit for bit. Where nothing batches (the CPU, Metal), one row
//! says so.

use candle_core::{Device, Tensor};

use super::{bits_err, timed, Check, Judge, Rng};
use crate::error::Result;
use crate::kv::{attend_batch, KvDtype, LayerCacheSpec, LayerKv, PagedKvStore};

const BS: usize = 16;

pub fn run(dev: &Device) -> Vec<Check> {
    let mut out = Vec::new();
    for (dtype, nh, nkv, hd, window) in [
        (KvDtype::F16, 16, 4, 256, 0),
        (KvDtype::Q8_0, 8, 2, 128, 0),
        (KvDtype::F32, 4, 4, 64, 0),
        (KvDtype::F16, 4, 1, 256, 20),
    ] {
        let win = if window > 0 { format!(" window {window}") } else { String::new() };
        let shape = format!("h{nh}/{nkv} d{hd} past [0, 37, 300, 5] t [1, 4, 1, 9]{win}");
        match case(dev, dtype, nh, nkv, hd, window) {
            Ok(c) => out.push(Check { shape: shape.clone(), ..c }),
            Err(e) => out.push(Check::error("attention batch", shape, &dtype.to_string(), e)),
        }
    }
    out
}

fn case(dev: &Device, dtype: KvDtype, nh: usize, nkv: usize, hd: usize, window: usize) -> Result<Check> {
    let fmt = dtype.to_string();
    let spec = [match window {
        0 => LayerCacheSpec::Attention { kv_heads: nkv, head_dim: hd },
        w => LayerCacheSpec::SlidingWindow { kv_heads: nkv, head_dim: hd, window: w },
    }];
    let pasts = [0usize, 37, 300, 5];
    let lens = [1usize, 4, 1, 9];
    // Disjoint block tables, 24 blocks each.
    let tables: Vec<Vec<u32>> = (0..4u32).map(|s| (0..24).map(|b| s * 24 + b).collect()).collect();
    let stores = [PagedKvStore::new(&spec, 96, BS, dtype, dev)?, PagedKvStore::new(&spec, 96, BS, dtype, dev)?];
    let mut rng = Rng(hd as u64 * 7 + nh as u64);
    let rand = |rng: &mut Rng, shape: (usize, usize, usize)| {
        Tensor::from_vec(rng.vec(shape.0 * shape.1 * shape.2), shape, &Device::Cpu).and_then(|t| t.to_device(dev))
    };
    // The same context in both stores.
    for (s, &past) in pasts.iter().enumerate() {
        if past > 0 {
            let (k, v) = (rand(&mut rng, (nkv, past, hd))?, rand(&mut rng, (nkv, past, hd))?);
            for store in &stores {
                store.write(0, &tables[s], 0, &k, &v)?;
            }
        }
    }
    let total: usize = lens.iter().sum();
    let q = rand(&mut rng, (nh, total, hd))?;
    let k = rand(&mut rng, (nkv, total, hd))?;
    let v = rand(&mut rng, (nkv, total, hd))?;
    let scale = 1.0 / (hd as f64).sqrt();
    let kvs: Vec<LayerKv<'_>> =
        (0..4).map(|s| LayerKv::Paged { store: &stores[1], layer: 0, blocks: &tables[s], past: pasts[s] }).collect();
    let refs: Vec<&LayerKv<'_>> = kvs.iter().collect();
    let (batched, ms) = timed(dev, || attend_batch(&refs, &lens, &q, &k, &v, scale))?;
    let Some(batched) = batched else {
        return Ok(Check::new("attention batch: not batched here", String::new(), &fmt, 0.0, Judge::Info, 0.0));
    };
    let mut err = 0f32;
    let mut off = 0;
    for s in 0..4 {
        let t = lens[s];
        let rows = |x: &Tensor| x.narrow(1, off, t).and_then(|x| x.contiguous());
        let mut kv = LayerKv::Paged { store: &stores[0], layer: 0, blocks: &tables[s], past: pasts[s] };
        let alone = kv.attend(&rows(&q)?, &rows(&k)?, &rows(&v)?, scale)?;
        err = err.max(bits_err(&batched.narrow(1, off, t)?, &alone)?);
        let (ka, va) = stores[0].read(0, &tables[s], pasts[s] + t)?;
        let (kb, vb) = stores[1].read(0, &tables[s], pasts[s] + t)?;
        err = err.max(bits_err(&ka, &kb)?).max(bits_err(&va, &vb)?);
        off += t;
    }
    Ok(Check::new("attention batch", String::new(), &fmt, err, Judge::Exact, ms))
}
