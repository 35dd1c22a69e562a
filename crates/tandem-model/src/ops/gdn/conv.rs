//! Causal depthwise convolution with SiLU over the GDN's pre-conv projections, with the
//! explicit conv state a sequence carries between forward passes: the last `K - 1` inputs.
//!
//! `u_t[c] = silu(Σ_j w[c, j] · x_{t-(K-1)+j}[c])`; the last tap multiplies the current token.

use super::norm::silu;

/// `x: [t, channels]` (this chunk's inputs), `state: [K-1, channels]` (oldest first; zeros for a
/// fresh sequence), `weight: [channels, K]`. Returns `[t, channels]` and replaces `state` with
/// the last `K - 1` inputs of `[state ‖ x]`.
pub fn causal_conv_silu(x: &[f32], state: &mut [f32], weight: &[f32], channels: usize, kernel: usize) -> Vec<f32> {
    causal_conv_silu_taps(x, state, &conv_taps(weight, channels, kernel), channels, kernel)
}

/// `weight: [channels, K]` as taps `[K, channels]`: tap j's weights of every channel side by
/// side, the layout [`causal_conv_silu_taps`] reads (a layer transposes its weights once).
pub fn conv_taps(weight: &[f32], channels: usize, kernel: usize) -> Vec<f32> {
    let mut taps = vec![0f32; kernel * channels];
    for (c, w) in weight.chunks_exact(kernel).take(channels).enumerate() {
        for (j, &v) in w.iter().enumerate() {
            taps[j * channels + c] = v;
        }
    }
    taps
}

/// [`causal_conv_silu`] with the weights as taps `[K, channels]` ([`conv_taps`]): each tap's
/// pass runs over contiguous channels (vectorised), the same products added in the same order
/// (taps 0..K from zero) as the `[channels, K]` form, so the same bits.
pub fn causal_conv_silu_taps(x: &[f32], state: &mut [f32], taps: &[f32], channels: usize, kernel: usize) -> Vec<f32> {
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
            let w = &taps[j * channels..(j + 1) * channels];
            for ((o, &w), &s) in o.iter_mut().zip(w).zip(src) {
                *o += w * s;
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

    /// The taps form (contiguous, vectorised) against the `[channels, K]` loop it replaced,
    /// channel by channel: the same bits, the state too, across chunk splits.
    #[test]
    fn taps_give_the_bits_of_the_channel_major_loop() {
        let (ch, k, t) = (37, 4, 9);
        let mut rng = Rng(7);
        let x = rng.vec(t * ch);
        let w = rng.vec(ch * k);
        let taps = conv_taps(&w, ch, k);
        let mut want_state = rng.vec((k - 1) * ch);
        let mut state = want_state.clone();
        for (off, n) in [(0, 1), (1, 5), (6, 3)] {
            let xs = &x[off * ch..(off + n) * ch];
            // The channel-major loop, written out.
            let mut window = want_state.clone();
            window.extend_from_slice(xs);
            let mut want = vec![0f32; n * ch];
            for ti in 0..n {
                for j in 0..k {
                    for c in 0..ch {
                        want[ti * ch + c] += w[c * k + j] * window[(ti + j) * ch + c];
                    }
                }
            }
            want.iter_mut().for_each(|v| *v = silu(*v));
            want_state = window[window.len() - (k - 1) * ch..].to_vec();
            let got = causal_conv_silu_taps(xs, &mut state, &taps, ch, k);
            assert_eq!(
                got.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                want.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
            );
            assert_eq!(state, want_state);
        }
    }
}
