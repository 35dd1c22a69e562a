// Gated DeltaNet kernels with explicit state: one sequence per launch, or (the _batch kernels)
// a batch of decode / verify sequences per launch, each with its own input state.
//
// gdn_conv_silu: causal depthwise conv + SiLU. x [t, ch], state_in [K-1, ch] (oldest first),
//   w [ch, K]; y [t, ch], state_out [K-1, ch]; lanes (when non-null) [t, K-1, ch]: the conv
//   state after each position (speculative verify). A thread per channel and tile of
//   CONV_TILE tokens (grid.y), the window in registers, products summed in tap order like the
//   CPU kernel; an output depends on inputs only (no recurrence), so a tile starts from the
//   inputs before it (or state_in) and every tile's outputs have the bits of one long walk. The
//   last tile writes state_out (a buffer of its own: tiles before it still read state_in).
// gdn_delta: the gated delta rule token by token. q, k [t, nk, dk] (q normalised and scaled),
//   v [t, nv, dv], beta, g [t, nv], state_in [nv, dk, dv]; o [t, nv, dv], state_out; lanes
//   (when non-null) [t, nv, dk, dv]. Per v-head h (k-head h / (nv / nk)):
//   S <- e^g S; delta = beta (v - S^T k); S <- S + k delta^T; o = S^T q.
//   One thread per value column j holds S[:, j] in registers; q and k of the step are staged
//   in shared memory. Sums run over i in order, like the CPU kernel.
// gdn_delta_fused: the whole step after the conv in one launch. u [t, 2 nk dk + nv dv] is the
//   conv output (q, k, v side by side), z [t, nv, dv] the output gate, b / a [t, nv] the raw
//   beta and decay projections; per token it L2-normalises q and k (eps 1e-6 in the square
//   root, q then scaled), takes beta = sigmoid(b) and g = -A softplus(a + dt_bias) (softplus
//   linear above 20), runs the delta rule as gdn_delta does and writes the gated RMSNorm of
//   the output, norm(o) * w * silu(z), per head. One block per v-head holding all dv columns
//   (dv <= 256); the block sums (norms) go through warp_sum and then the warps in order, so a
//   token's arithmetic is the same in every chunk it arrives in.
#include "common.cuh"

#define MAXK 8
#define CONV_TILE 16

// Tokens [i0, i1) of channel c; `last`: this range ends the call, so it writes state_out.
__device__ __forceinline__ void conv_silu(float* __restrict__ y, float* __restrict__ state_out,
                                          float* __restrict__ lanes, const float* __restrict__ x,
                                          const float* __restrict__ state_in, const float* __restrict__ w, int i0,
                                          int i1, bool last, int ch, int K, size_t ldx) {
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= ch) return;
    const int hist = K - 1;
    float win[MAXK], wc[MAXK];
#pragma unroll
    for (int j = 0; j < MAXK; j++) {
        // input i0 - hist + j: from x, or (before the call's first token) from state_in
        const int at = i0 - hist + j;
        win[j] = (j < hist) ? (at >= 0 ? x[(size_t)at * ldx + c] : state_in[(size_t)(at + hist) * ch + c]) : 0.f;
        wc[j] = (j < K) ? w[(size_t)c * K + j] : 0.f;
    }
    for (int i = i0; i < i1; i++) {
        // window = the K - 1 previous inputs, then x_i
        float xi = x[(size_t)i * ldx + c];
        float acc = 0.f;
#pragma unroll
        for (int j = 0; j < MAXK; j++) {
            if (j < hist) acc += wc[j] * win[j];
        }
        acc += wc[hist] * xi;
        // the CPU kernel adds taps in order j = 0 .. K-1 starting from 0: same order as above
        y[(size_t)i * ch + c] = silu_f(acc);
#pragma unroll
        for (int j = 0; j < MAXK - 1; j++) {
            if (j < hist - 1) win[j] = win[j + 1];
        }
        if (hist > 0) win[hist - 1] = xi;
        if (lanes) {
            for (int j = 0; j < hist; j++) lanes[((size_t)i * hist + j) * ch + c] = win[j];
        }
    }
    if (last) {
        for (int j = 0; j < hist; j++) state_out[(size_t)j * ch + c] = win[j];
    }
}

extern "C" __global__ void gdn_conv_silu(float* __restrict__ y, float* __restrict__ state_out,
                                         float* __restrict__ lanes, const float* __restrict__ x,
                                         const float* __restrict__ state_in, const float* __restrict__ w, int t,
                                         int ch, int K) {
    const int i0 = blockIdx.y * CONV_TILE;
    if (i0 >= t && t > 0) return;
    const int i1 = min(t, i0 + CONV_TILE);
    conv_silu(y, state_out, lanes, x, state_in, w, i0, i1, i1 == t, ch, K, (size_t)ch);
}

// Sequence s of a batch (see the batched kernels at the end): its first token and token count
// from meta's offsets.
__device__ __forceinline__ void batch_tokens(const long long* meta, int s, size_t* t0, int* t) {
    *t0 = (size_t)meta[s];
    *t = (int)(meta[s + 1] - meta[s]);
}

// gdn_conv_silu for B sequences in one launch (grid.y = B): x [total, ch] (rows ldx apart: a
// column view of a fused projection is read in place), y [total, ch] and lanes
// [total, K-1, ch] hold the sequences' tokens one after another, state_out is [B, K-1, ch], and
// meta = [B + 1 token offsets | B conv-state addresses | B delta-state addresses]. With
// state_out null, sequence s writes its next conv state at the address meta[3B + 1 + s] and
// its next delta state at meta[4B + 1 + s] instead (a CUDA graph's step, whose outputs go to
// buffers made for each step); with meta_lanes set too (a graph's verify step), its conv
// lanes go to meta[5B + 1 + s] and its delta lanes to meta[6B + 1 + s] rather than to
// `lanes` (t states one after another from each address).
__device__ __forceinline__ float* batch_lanes(float* lanes, const long long* meta, int meta_lanes, int B, int s,
                                              int which, size_t t0, size_t per_token) {
    if (meta_lanes) return reinterpret_cast<float*>(meta[(5 + which) * B + 1 + s]);
    return lanes ? lanes + t0 * per_token : nullptr;
}

extern "C" __global__ void gdn_conv_silu_batch(float* __restrict__ y, float* __restrict__ state_out,
                                               float* __restrict__ lanes, const float* __restrict__ x,
                                               const long long* __restrict__ meta, const float* __restrict__ w,
                                               int B, int ch, int K, int meta_lanes, int ldx) {
    const int s = blockIdx.y;
    size_t t0;
    int t;
    batch_tokens(meta, s, &t0, &t);
    const size_t hist = (size_t)(K - 1) * ch;
    const float* state_in = reinterpret_cast<const float*>(meta[B + 1 + s]);
    float* out = state_out ? state_out + s * hist : reinterpret_cast<float*>(meta[3 * B + 1 + s]);
    conv_silu(y + t0 * ch, out, batch_lanes(lanes, meta, meta_lanes, B, s, 0, t0, hist), x + t0 * (size_t)ldx,
              state_in, w, 0, t, true, ch, K, (size_t)ldx);
}

template <int MAXDK>
__device__ void delta_rule(float* __restrict__ o, float* __restrict__ state_out, float* __restrict__ lanes,
                           const float* __restrict__ q, const float* __restrict__ k, const float* __restrict__ v,
                           const float* __restrict__ beta, const float* __restrict__ g,
                           const float* __restrict__ state_in, int t, int nk, int nv, int dk, int dv) {
    const int h = blockIdx.x;
    const int j = blockIdx.y * blockDim.x + threadIdx.x;
    const int kh = h / (nv / nk);
    extern __shared__ float sh[];  // q then k of the current step, dk each
    float s[MAXDK];
    const size_t sbase = (size_t)h * dk * dv;
#pragma unroll
    for (int i = 0; i < MAXDK; i++) s[i] = (i < dk && j < dv) ? state_in[sbase + (size_t)i * dv + j] : 0.f;
    for (int ti = 0; ti < t; ti++) {
        __syncthreads();
        for (int i = threadIdx.x; i < dk; i += blockDim.x) {
            sh[i] = q[((size_t)ti * nk + kh) * dk + i];
            sh[dk + i] = k[((size_t)ti * nk + kh) * dk + i];
        }
        __syncthreads();
        if (j < dv) {
            const float decay = expf(g[(size_t)ti * nv + h]);
            const float b = beta[(size_t)ti * nv + h];
#pragma unroll
            for (int i = 0; i < MAXDK; i++) {
                if (i < dk) s[i] *= decay;
            }
            // CPU: delta = v; delta -= s_i k_i for i in order; delta *= beta
            float delta = v[((size_t)ti * nv + h) * dv + j];
#pragma unroll
            for (int i = 0; i < MAXDK; i++) {
                if (i < dk) delta -= s[i] * sh[dk + i];
            }
            delta *= b;
            float out = 0.f;
#pragma unroll
            for (int i = 0; i < MAXDK; i++) {
                if (i < dk) {
                    s[i] += sh[dk + i] * delta;
                    out += s[i] * sh[i];
                }
            }
            o[((size_t)ti * nv + h) * dv + j] = out;
            if (lanes) {
                float* lp = lanes + (size_t)ti * nv * dk * dv + sbase + j;
#pragma unroll
                for (int i = 0; i < MAXDK; i++) {
                    if (i < dk) lp[(size_t)i * dv] = s[i];
                }
            }
        }
    }
    if (j < dv) {
#pragma unroll
        for (int i = 0; i < MAXDK; i++) {
            if (i < dk) state_out[sbase + (size_t)i * dv + j] = s[i];
        }
    }
}

#define DELTA(name, MAXDK)                                                                                     \
    extern "C" __global__ void name(float* o, float* state_out, float* lanes, const float* q, const float* k,  \
                                    const float* v, const float* beta, const float* g, const float* state_in,  \
                                    int t, int nk, int nv, int dk, int dv) {                                   \
        delta_rule<MAXDK>(o, state_out, lanes, q, k, v, beta, g, state_in, t, nk, nv, dk, dv);                 \
    }

DELTA(gdn_delta_32, 32)
DELTA(gdn_delta_64, 64)
DELTA(gdn_delta_128, 128)
DELTA(gdn_delta_256, 256)

// The sum of v over the block, in a fixed order (lanes by butterfly, then warps in order);
// every thread gets it. red holds one float per warp.
__device__ __forceinline__ float block_sum_fixed(float v, float* red) {
    const int warp = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
    v = warp_sum(v);
    __syncthreads();
    if ((threadIdx.x & 31) == 0) red[warp] = v;
    __syncthreads();
    float s = 0.f;
    for (int w = 0; w < nw; w++) s += red[w];
    return s;
}

// One step's q and k of key head kh, L2-normalised (q also scaled), staged into sh[0..dk) and
// sh[dk..2dk) for the whole block; the norms' sums in block_sum_fixed's fixed order.
__device__ __forceinline__ void stage_qk_normed(float* sh, float* red, const float* __restrict__ ur, int kh,
                                                int kd, int dk, float scale) {
    float qq = 0.f, kk = 0.f;
    for (int i = threadIdx.x; i < dk; i += blockDim.x) {
        const float qv = ur[kh * dk + i], kv = ur[kd + kh * dk + i];
        sh[i] = qv;
        sh[dk + i] = kv;
        qq += qv * qv;
        kk += kv * kv;
    }
    const float iq = 1.f / sqrtf(block_sum_fixed(qq, red) + 1e-6f);
    const float ik = 1.f / sqrtf(block_sum_fixed(kk, red) + 1e-6f);
    for (int i = threadIdx.x; i < dk; i += blockDim.x) {
        sh[i] = sh[i] * iq * scale;
        sh[dk + i] = sh[dk + i] * ik;
    }
    __syncthreads();
}

// Value head h's gates at step ti: beta = sigmoid(b), decay = exp(-A softplus(a + dt_bias)).
__device__ __forceinline__ void step_gates(const float* __restrict__ b_raw, const float* __restrict__ a_raw,
                                           const float* __restrict__ dt_bias, const float* __restrict__ neg_a,
                                           int ti, int ldb, int lda, int h, float* beta, float* decay) {
    *beta = 1.f / (1.f + expf(-b_raw[(size_t)ti * ldb + h]));
    const float x = a_raw[(size_t)ti * lda + h] + dt_bias[h];
    *decay = expf(neg_a[h] * (x > 20.f ? x : log1pf(expf(x))));
}

template <int MAXDK>
__device__ void delta_fused(float* __restrict__ o, float* __restrict__ state_out, float* __restrict__ lanes,
                            const float* __restrict__ u, const float* __restrict__ z, const float* __restrict__ b_raw,
                            const float* __restrict__ a_raw, const float* __restrict__ dt_bias,
                            const float* __restrict__ neg_a, const float* __restrict__ norm_w,
                            const float* __restrict__ state_in, int t, int nk, int nv, int dk, int dv, float scale,
                            float eps) {
    const int h = blockIdx.x;
    const int j = threadIdx.x;
    const int kh = h / (nv / nk);
    const int kd = nk * dk;
    const size_t ch = (size_t)2 * kd + (size_t)nv * dv;
    extern __shared__ float sh[];  // q, k of the step (dk each), then one float per warp
    float* red = sh + 2 * dk;
    float s[MAXDK];
    const size_t sbase = (size_t)h * dk * dv;
#pragma unroll
    for (int i = 0; i < MAXDK; i++) s[i] = (i < dk && j < dv) ? state_in[sbase + (size_t)i * dv + j] : 0.f;
    const float nw = norm_w[min(j, dv - 1)];
    for (int ti = 0; ti < t; ti++) {
        const float* ur = u + (size_t)ti * ch;
        __syncthreads();
        stage_qk_normed(sh, red, ur, kh, kd, dk, scale);
        float beta, decay;
        step_gates(b_raw, a_raw, dt_bias, neg_a, ti, nv, nv, h, &beta, &decay);
        float out = 0.f;
        if (j < dv) {
#pragma unroll
            for (int i = 0; i < MAXDK; i++) {
                if (i < dk) s[i] *= decay;
            }
            float delta = ur[2 * kd + (size_t)h * dv + j];
#pragma unroll
            for (int i = 0; i < MAXDK; i++) {
                if (i < dk) delta -= s[i] * sh[dk + i];
            }
            delta *= beta;
#pragma unroll
            for (int i = 0; i < MAXDK; i++) {
                if (i < dk) {
                    s[i] += sh[dk + i] * delta;
                    out += s[i] * sh[i];
                }
            }
            if (lanes) {
                float* lp = lanes + (size_t)ti * nv * dk * dv + sbase + j;
#pragma unroll
                for (int i = 0; i < MAXDK; i++) {
                    if (i < dk) lp[(size_t)i * dv] = s[i];
                }
            }
        }
        const float inv = 1.f / sqrtf(block_sum_fixed(j < dv ? out * out : 0.f, red) / (float)dv + eps);
        if (j < dv) {
            const size_t oi = ((size_t)ti * nv + h) * dv + j;
            o[oi] = out * inv * nw * silu_f(z[oi]);
        }
    }
    if (j < dv) {
#pragma unroll
        for (int i = 0; i < MAXDK; i++) {
            if (i < dk) state_out[sbase + (size_t)i * dv + j] = s[i];
        }
    }
}

#define DELTA_FUSED(name, MAXDK)                                                                                 \
    extern "C" __global__ void __launch_bounds__(256)                                                            \
        name(float* o, float* state_out, float* lanes, const float* u, const float* z, const float* b_raw,       \
             const float* a_raw, const float* dt_bias, const float* neg_a, const float* norm_w,                  \
             const float* state_in, int t, int nk, int nv, int dk, int dv, float scale, float eps) {             \
        delta_fused<MAXDK>(o, state_out, lanes, u, z, b_raw, a_raw, dt_bias, neg_a, norm_w, state_in, t, nk, nv, \
                           dk, dv, scale, eps);                                                                  \
    }

DELTA_FUSED(gdn_delta_fused_32, 32)
DELTA_FUSED(gdn_delta_fused_64, 64)
DELTA_FUSED(gdn_delta_fused_128, 128)
DELTA_FUSED(gdn_delta_fused_256, 256)

// gdn_delta_cols: the same step over many more SMs, for decode and verify (one block per
// value head left 100 of the H200's 132 SMs idle and took 25 us a layer). A block takes 32
// state columns of one value head (grid nv x dv/32), four threads per column, thread p holding
// rows p, p + 4, ...: the column's sums S^T k and S^T q are each thread's rows in order, then
// the four partials by a fixed butterfly (every thread of the four gets the same bits). The
// output is written before its norm (o_raw); gdn_gated_norm (gdn_chunked.cu) applies norm(o)
// * w * silu(z). q / k norms as in gdn_delta_fused (each block recomputes its head's).
template <int MAXDK>
__device__ void delta_cols(float* __restrict__ o_raw, float* __restrict__ state_out, float* __restrict__ lanes,
                           const float* __restrict__ u, const float* __restrict__ b_raw,
                           const float* __restrict__ a_raw, const float* __restrict__ dt_bias,
                           const float* __restrict__ neg_a, const float* __restrict__ state_in, int t, int nk, int nv,
                           int dk, int dv, float scale, int ldb, int lda) {
    constexpr int R = MAXDK / 4;
    const int h = blockIdx.x;
    const int p = threadIdx.x & 3;
    const int j = blockIdx.y * 32 + (threadIdx.x >> 2);
    const bool live = j < dv;
    const int kh = h / (nv / nk);
    const int kd = nk * dk;
    const size_t ch = (size_t)2 * kd + (size_t)nv * dv;
    extern __shared__ float sh[];  // q, k of the step (dk each), then one float per warp
    float* red = sh + 2 * dk;
    float s[R];
    const size_t sbase = (size_t)h * dk * dv;
#pragma unroll
    for (int m = 0; m < R; m++) {
        const int i = p + 4 * m;
        s[m] = (i < dk && live) ? state_in[sbase + (size_t)i * dv + j] : 0.f;
    }
    for (int ti = 0; ti < t; ti++) {
        const float* ur = u + (size_t)ti * ch;
        __syncthreads();
        stage_qk_normed(sh, red, ur, kh, kd, dk, scale);
        float beta, decay;
        step_gates(b_raw, a_raw, dt_bias, neg_a, ti, ldb, lda, h, &beta, &decay);
        float sk = 0.f;
#pragma unroll
        for (int m = 0; m < R; m++) {
            const int i = p + 4 * m;
            if (i < dk) {
                s[m] *= decay;
                sk = fmaf(s[m], sh[dk + i], sk);
            }
        }
        sk += __shfl_xor_sync(0xffffffffu, sk, 1);
        sk += __shfl_xor_sync(0xffffffffu, sk, 2);
        const float delta = live ? (ur[2 * kd + (size_t)h * dv + j] - sk) * beta : 0.f;
        float out = 0.f;
#pragma unroll
        for (int m = 0; m < R; m++) {
            const int i = p + 4 * m;
            if (i < dk) {
                s[m] = fmaf(sh[dk + i], delta, s[m]);
                out = fmaf(s[m], sh[i], out);
            }
        }
        out += __shfl_xor_sync(0xffffffffu, out, 1);
        out += __shfl_xor_sync(0xffffffffu, out, 2);
        if (live) {
            if (lanes) {
                float* lp = lanes + (size_t)ti * nv * dk * dv + sbase + j;
#pragma unroll
                for (int m = 0; m < R; m++) {
                    const int i = p + 4 * m;
                    if (i < dk) lp[(size_t)i * dv] = s[m];
                }
            }
            if (p == 0) o_raw[((size_t)ti * nv + h) * dv + j] = out;
        }
    }
    if (live) {
#pragma unroll
        for (int m = 0; m < R; m++) {
            const int i = p + 4 * m;
            if (i < dk) state_out[sbase + (size_t)i * dv + j] = s[m];
        }
    }
}

#define DELTA_COLS(name, MAXDK)                                                                               \
    extern "C" __global__ void __launch_bounds__(128)                                                         \
        name(float* o_raw, float* state_out, float* lanes, const float* u, const float* b_raw,                \
             const float* a_raw, const float* dt_bias, const float* neg_a, const float* state_in, int t, int nk, \
             int nv, int dk, int dv, float scale) {                                                           \
        delta_cols<MAXDK>(o_raw, state_out, lanes, u, b_raw, a_raw, dt_bias, neg_a, state_in, t, nk, nv, dk, dv, \
                          scale, nv, nv);                                                                     \
    }

DELTA_COLS(gdn_delta_cols_32, 32)
DELTA_COLS(gdn_delta_cols_64, 64)
DELTA_COLS(gdn_delta_cols_128, 128)
DELTA_COLS(gdn_delta_cols_256, 256)

// gdn_delta_cols for B sequences in one launch (grid.z = B), as gdn_conv_silu_batch lays them
// out: u [total, ch], b_raw / a_raw [total, nv] (rows ldb / lda apart), o_raw [total, nv, dv], lanes [total, nv, dk,
// dv], state_out [B, nv, dk, dv]; sequence s reads its state from meta[2B + 1 + s]. Each
// sequence's arithmetic is gdn_delta_cols' exactly, so a batch gives the bits of its parts.
template <int MAXDK>
__device__ void delta_cols_batch(float* o_raw, float* state_out, float* lanes, const float* u, const float* b_raw,
                                 const float* a_raw, const float* dt_bias, const float* neg_a,
                                 const long long* meta, int B, int nk, int nv, int dk, int dv, float scale,
                                 int meta_lanes, int ldb, int lda) {
    const int s = blockIdx.z;
    size_t t0;
    int t;
    batch_tokens(meta, s, &t0, &t);
    const size_t ch = (size_t)2 * nk * dk + (size_t)nv * dv;
    const size_t sl = (size_t)nv * dk * dv;
    const float* state_in = reinterpret_cast<const float*>(meta[2 * B + 1 + s]);
    float* out = state_out ? state_out + s * sl : reinterpret_cast<float*>(meta[4 * B + 1 + s]);
    delta_cols<MAXDK>(o_raw + t0 * nv * dv, out, batch_lanes(lanes, meta, meta_lanes, B, s, 1, t0, sl), u + t0 * ch,
                      b_raw + t0 * (size_t)ldb, a_raw + t0 * (size_t)lda, dt_bias, neg_a, state_in, t, nk, nv, dk, dv,
                      scale, ldb, lda);
}

#define DELTA_COLS_BATCH(name, MAXDK)                                                                            \
    extern "C" __global__ void __launch_bounds__(128)                                                            \
        name(float* o_raw, float* state_out, float* lanes, const float* u, const float* b_raw,                   \
             const float* a_raw, const float* dt_bias, const float* neg_a, const long long* meta, int B, int nk, \
             int nv, int dk, int dv, float scale, int meta_lanes, int ldb, int lda) {                            \
        delta_cols_batch<MAXDK>(o_raw, state_out, lanes, u, b_raw, a_raw, dt_bias, neg_a, meta, B, nk, nv, dk,   \
                                dv, scale, meta_lanes, ldb, lda);                                                \
    }

DELTA_COLS_BATCH(gdn_delta_cols_batch_32, 32)
DELTA_COLS_BATCH(gdn_delta_cols_batch_64, 64)
DELTA_COLS_BATCH(gdn_delta_cols_batch_128, 128)
DELTA_COLS_BATCH(gdn_delta_cols_batch_256, 256)
