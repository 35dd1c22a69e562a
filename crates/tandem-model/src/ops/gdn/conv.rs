//! Causal depthwise convolution with SiLU over the GDN's pre-conv projections, with the
//! explicit conv state a sequence carries between forward passes: the last `K - 1` inputs.
//!
//! `u_t[c] = silu(Σ_j w[c, j] · x_{t-(K-1)+j}[c])`; the last tap multiplies the current token.

use super::norm::silu;

/// `x: [t, channels]` (this chunk's inputs), `state: [K-1, channels]` (oldest first; zeros for a
/// fresh sequence), `weight: [channels, K]`. Returns `[t, channels]` and replaces `state` with
/// the last `K - 1` inputs of `[state ‖ x]`.
pub fn causal_conv_silu(x: &[f32], state: &mut [f32], weight: &[f32], channels: usize, kernel: usize) -> Vec<f32> {
    let t = x.len() / channels;
    let hist = kernel - 1;
    // window row r of [state ‖ x]: r < hist comes from the state, otherwise from x.
    let row = |r: usize| -> &[f32] {
        if r < hist {
            &state[r * channels..(r + 1) * channels]
        } else {
            &x[(r - hist) * channels..(r - hist + 1) * channels]
        }
    };
    let mut out = vec![0f32; t * channels];
    for ti in 0..t {
        let o = &mut out[ti * channels..(ti + 1) * channels];
        for j in 0..kernel {
            let src = row(ti + j);
            for c in 0..channels {
                o[c] += weight[c * kernel + j] * src[c];
            }
        }
        o.iter_mut().for_each(|v| *v = silu(*v));
    }
    // New state: the last hist rows of [state ‖ x].
    let total = hist + t;
    let mut next = vec![0f32; hist * channels];
    for r in 0..hist {
        next[r * channels..(r + 1) * channels].copy_from_slice(row(total - hist + r));
    }
    state.copy_from_slice(&next);
    out
}

/// Plain reference: zero-padded convolution over a whole sequence at once.
pub fn causal_conv_silu_reference(x: &[f32], weight: &[f32], channels: usize, kernel: usize) -> Vec<f32> {
    let t = x.len() / channels;
    let mut out = vec![0f32; t * channels];
    for ti in 0..t {
        for c in 0..channels {
            let mut acc = 0f32;
            for j in 0..kernel {
                let src = ti as isize - (kernel as isize - 1) + j as isize;
                if src >= 0 {
                    acc += weight[c * kernel + j] * x[src as usize * channels + c];
                }
            }
            out[ti * channels + c] = silu(acc);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::super::testdata::Rng;
    use super::*;

    #[test]
    fn state_split_at_any_point_equals_one_shot() {
        let (ch, k, t) = (5, 4, 13);
        let mut rng = Rng(42);
        let x = rng.vec(t * ch);
        let w = rng.vec(ch * k);
        let want = causal_conv_silu_reference(&x, &w, ch, k);
        for splits in [vec![13], vec![1; 13], vec![2, 5, 6], vec![7, 1, 5], vec![3, 10]] {
            let mut state = vec![0f32; (k - 1) * ch];
            let mut got = Vec::new();
            let mut off = 0;
            for s in splits {
                got.extend(causal_conv_silu(&x[off * ch..(off + s) * ch], &mut state, &w, ch, k));
                off += s;
            }
            for (a, b) in got.iter().zip(&want) {
                assert!((a - b).abs() < 1e-6, "{a} vs {b}");
            }
            // The state holds the last K-1 inputs.
            assert_eq!(&state[..], &x[(t - (k - 1)) * ch..]);
        }
    }
}
