// The Gated DeltaNet step after the conv for prefill chunks, in the chunked WY/UT form
// (`ops/gdn/chunked.rs` on the CPU is the reference; the maths is in its doc comment): the
// same inputs and outputs as gdn_delta_fused in gdn.cu, three launches per layer and sequence.
//
// gdn_wy_prep: one block per (v-head, chunk of C = 64 tokens), all chunks in parallel. Per
//   token it L2-normalises q and k (q then scaled) and takes beta = sigmoid(b) and the log
//   decay g = -A softplus(a + dt_bias) as the fused kernel does; per chunk the cumulative log
//   decay gam, A = strict_tril(beta_i k_i.k_j e^(gam_i - gam_j)), T = (I + A)^-1 by forward
//   substitution, U = T diag(beta) V, W = T diag(beta e^gam) K and the causal intra-chunk
//   scores P = tril(q_i.k_j e^(gam_i - gam_j)). Scratch (per v-head, token-major): qn, kn
//   [nv, t, dk], w [nv, t, dk], uu [nv, t, dv], gam [nv, t], p [nv, chunks, C, C].
// gdn_wy_state: one block of WY_WARPS warps per (v-head, 32 value columns), chunks in order
//   (a lane per column, the chunk's rows and the state's rows dealt to the warps). The state
//   slice S [dk, 32] lives in shared memory; per chunk V' = U - W S, o = e^gam (Q S) + P V' (before
//   the norm, into o_raw [t, nv, dv]), S <- e^gam_last S + sum_m e^(gam_last - gam_m) k_m V'_m.
// gdn_gated_norm: the gated RMSNorm of the output, norm(o) * w * silu(z), one warp per
//   (token, v-head); z's tokens are ldz floats apart.
// Every sum runs in a fixed order (the CPU kernel's order where it has one), so results are
// the same run to run; a chunk's arithmetic depends on where the call's chunks start, so
// unlike the recurrent kernel the result of t tokens in one call and in two differs in the
// last bits (as on the CPU).
#include "common.cuh"

#define WY_C 64

extern "C" __global__ void __launch_bounds__(256)
    gdn_wy_prep(float* __restrict__ qn, float* __restrict__ kn, float* __restrict__ w, float* __restrict__ uu,
                float* __restrict__ gam, float* __restrict__ p, const float* __restrict__ u,
                const float* __restrict__ b_raw, const float* __restrict__ a_raw, const float* __restrict__ dt_bias,
                const float* __restrict__ neg_a, int t, int nk, int nv, int dk, int dv, float scale) {
    const int h = blockIdx.x, c = blockIdx.y;
    const int kh = h / (nv / nk);
    const int t0 = c * WY_C;
    const int C = min(WY_C, t - t0);
    const int kd = nk * dk;
    const size_t ch = (size_t)2 * kd + (size_t)nv * dv;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, nwarps = blockDim.x >> 5;
    __shared__ float sg[WY_C], sb[WY_C], sgam[WY_C];
    __shared__ float sa[WY_C][WY_C + 1];
    // T, and before it the 32-wide slices of K and Q that step 2 reads
    __shared__ float region[2 * WY_C * 33];
    float(*st)[WY_C + 1] = reinterpret_cast<float(*)[WY_C + 1]>(region);
    float(*ks)[33] = reinterpret_cast<float(*)[33]>(region);
    float(*qs)[33] = reinterpret_cast<float(*)[33]>(region + WY_C * 33);
    float* qh = qn + ((size_t)h * t + t0) * dk;
    float* kh_ = kn + ((size_t)h * t + t0) * dk;
    // 1. normalised q, k and the gates, a warp per token
    for (int i = warp; i < C; i += nwarps) {
        const float* ur = u + (size_t)(t0 + i) * ch;
        float qq = 0.f, kk = 0.f;
        for (int m = lane; m < dk; m += 32) {
            const float qv = ur[kh * dk + m], kv = ur[kd + kh * dk + m];
            qq += qv * qv;
            kk += kv * kv;
        }
        const float iq = 1.f / sqrtf(warp_sum(qq) + 1e-6f);
        const float ik = 1.f / sqrtf(warp_sum(kk) + 1e-6f);
        for (int m = lane; m < dk; m += 32) {
            qh[(size_t)i * dk + m] = ur[kh * dk + m] * iq * scale;
            kh_[(size_t)i * dk + m] = ur[kd + kh * dk + m] * ik;
        }
        if (lane == 0) {
            const size_t gi = (size_t)(t0 + i) * nv + h;
            sb[i] = 1.f / (1.f + expf(-b_raw[gi]));
            const float x = a_raw[gi] + dt_bias[h];
            sg[i] = neg_a[h] * (x > 20.f ? x : log1pf(expf(x)));
        }
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        float acc = 0.f;
        for (int i = 0; i < C; i++) {
            acc += sg[i];
            sgam[i] = acc;
        }
    }
    __syncthreads();
    for (int i = threadIdx.x; i < C; i += blockDim.x) gam[(size_t)h * t + t0 + i] = sgam[i];
    // 2. A (strictly lower) and P (lower with the diagonal): thread (i = tid / 4) sums the
    //    pairs (i, j = tid % 4 + 4x) over K and Q staged 32 dims at a time, dims in order
    float* ph = p + ((size_t)h * gridDim.y + c) * WY_C * WY_C;
    {
        const int i = threadIdx.x >> 2, j0 = threadIdx.x & 3;
        float kk[16], qk[16];
#pragma unroll
        for (int x = 0; x < 16; x++) kk[x] = qk[x] = 0.f;
        for (int m0 = 0; m0 < dk; m0 += 32) {
            __syncthreads();
            for (int idx = threadIdx.x; idx < WY_C * 32; idx += blockDim.x) {
                const int r = idx >> 5, m = idx & 31;
                const bool ok = r < C && m0 + m < dk;
                ks[r][m] = ok ? kh_[(size_t)r * dk + m0 + m] : 0.f;
                qs[r][m] = ok ? qh[(size_t)r * dk + m0 + m] : 0.f;
            }
            __syncthreads();
            const int mm = min(32, dk - m0);
            for (int m = 0; m < mm; m++) {
                const float ki = ks[i][m], qi = qs[i][m];
#pragma unroll
                for (int x = 0; x < 16; x++) {
                    const float kj = ks[j0 + 4 * x][m];
                    kk[x] += ki * kj;
                    qk[x] += qi * kj;
                }
            }
        }
        __syncthreads();
#pragma unroll
        for (int x = 0; x < 16; x++) {
            const int j = j0 + 4 * x;
            float aij = 0.f, pij = 0.f;
            if (i < C && j <= i) {
                const float e = expf(sgam[i] - sgam[j]);
                if (j < i) aij = sb[i] * kk[x] * e;
                pij = qk[x] * e;
            }
            sa[i][j] = aij;
            ph[i * WY_C + j] = pij;
        }
    }
    __syncthreads();
    // 3. T = (I + A)^-1, row by row: T_ij = -sum_{m=j}^{i-1} A_im T_mj
    for (int i = 0; i < C; i++) {
        for (int j = threadIdx.x; j < WY_C; j += blockDim.x) {
            float v = 0.f;
            if (j == i) {
                v = 1.f;
            } else if (j < i) {
                float sum = 0.f;
                for (int m = j; m < i; m++) sum += sa[i][m] * st[m][j];
                v = -sum;
            }
            st[i][j] = v;
        }
        __syncthreads();
    }
    // 4. U = T diag(beta) V and W = T diag(beta e^gam) K, a thread per (row, column)
    float* wh = w + ((size_t)h * t + t0) * dk;
    float* uh = uu + ((size_t)h * t + t0) * dv;
    for (int idx = threadIdx.x; idx < C * dv; idx += blockDim.x) {
        const int i = idx / dv, col = idx % dv;
        float acc = 0.f;
        for (int j = 0; j <= i; j++) {
            const float tij = st[i][j] * sb[j];
            acc += tij * u[(size_t)(t0 + j) * ch + 2 * kd + (size_t)h * dv + col];
        }
        uh[(size_t)i * dv + col] = acc;
    }
    for (int idx = threadIdx.x; idx < C * dk; idx += blockDim.x) {
        const int i = idx / dk, col = idx % dk;
        float acc = 0.f;
        for (int j = 0; j <= i; j++) {
            const float twj = st[i][j] * sb[j] * expf(sgam[j]);
            acc += twj * kh_[(size_t)j * dk + col];
        }
        wh[(size_t)i * dk + col] = acc;
    }
}

#define WY_COLS 32
#define WY_WARPS 16            // a chunk's rows per warp: WY_C / WY_WARPS
#define WY_RPW (WY_C / WY_WARPS)

// Dynamic shared memory: S [dk][WY_COLS], V' [WY_C][WY_COLS] (40 KB at dk = 256); STAGED
// adds the chunk's W, Q and K rows [WY_C][dk] each (120 KB in all at dk = 128), copied in
// once per chunk (coalesced) instead of every lane's loop reading them from global memory:
// the same values in the same order, so the same bits.
template <bool STAGED>
__device__ __forceinline__ void wy_state_body(float* __restrict__ o_raw, float* __restrict__ state_out,
                                              const float* __restrict__ qn, const float* __restrict__ kn,
                                              const float* __restrict__ w, const float* __restrict__ uu,
                                              const float* __restrict__ gam, const float* __restrict__ p,
                                              const float* __restrict__ state_in, int t, int nv, int dk, int dv) {
    const int h = blockIdx.x;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, nwarps = blockDim.x >> 5;
    const int col = blockIdx.y * WY_COLS + lane;
    const bool live = col < dv;
    extern __shared__ float sh[];
    float* S = sh;                      // [dk][WY_COLS]
    float* vp = sh + dk * WY_COLS;      // [WY_C][WY_COLS]
    __shared__ float ek[WY_C];
    const size_t sbase = (size_t)h * dk * dv;
    for (int i = warp; i < dk; i += nwarps) S[i * WY_COLS + lane] = live ? state_in[sbase + (size_t)i * dv + col] : 0.f;
    __syncthreads();
    const int nchunks = (t + WY_C - 1) / WY_C;
    const float* gh = gam + (size_t)h * t;
    for (int c = 0; c < nchunks; c++) {
        const int t0 = c * WY_C;
        const int C = min(WY_C, t - t0);
        const float* qc = qn + ((size_t)h * t + t0) * dk;
        const float* kc = kn + ((size_t)h * t + t0) * dk;
        const float* wc = w + ((size_t)h * t + t0) * dk;
        if constexpr (STAGED) {
            // The chunk's rows, [C][dk] each, into shared memory (dk a multiple of 4, rows
            // contiguous and 16-byte aligned); the loops below index them as they would W, Q
            // and K in global memory. The barrier after step c of the last chunk (or after the
            // state's load) ordered every read of the previous chunk's rows before this.
            float* sw = vp + WY_C * WY_COLS;
            float* sq = sw + WY_C * dk;
            float* sk = sq + WY_C * dk;
            const int n4 = C * dk / 4;
            for (int i = threadIdx.x; i < n4; i += blockDim.x) {
                reinterpret_cast<float4*>(sw)[i] = reinterpret_cast<const float4*>(wc)[i];
                reinterpret_cast<float4*>(sq)[i] = reinterpret_cast<const float4*>(qc)[i];
                reinterpret_cast<float4*>(sk)[i] = reinterpret_cast<const float4*>(kc)[i];
            }
            __syncthreads();
            wc = sw;
            qc = sq;
            kc = sk;
        }
        const float* uc = uu + ((size_t)h * t + t0) * dv;
        const float* pc = p + ((size_t)h * nchunks + c) * WY_C * WY_C;
        const float last = gh[t0 + C - 1];
        // e^(gam_last - gam_m), read in step c (after the barrier below)
        for (int m = threadIdx.x; m < C; m += blockDim.x) ek[m] = expf(last - gh[t0 + m]);
        // a. V' = U - W S and o = e^gam Q S for this warp's rows, four at a time
        float o_acc[WY_RPW];
#pragma unroll
        for (int q = 0; q < WY_RPW; q += 4) {
            float v[4], oo[4], e[4];
#pragma unroll
            for (int x = 0; x < 4; x++) {
                const int r = warp + WY_WARPS * (q + x);
                v[x] = (r < C && live) ? uc[(size_t)r * dv + col] : 0.f;
                oo[x] = 0.f;
                e[x] = r < C ? expf(gh[t0 + r]) : 0.f;
            }
            for (int i = 0; i < dk; i++) {
                const float s = S[i * WY_COLS + lane];
#pragma unroll
                for (int x = 0; x < 4; x++) {
                    const int r = min(warp + WY_WARPS * (q + x), C - 1);
                    v[x] -= wc[(size_t)r * dk + i] * s;
                    oo[x] += (e[x] * qc[(size_t)r * dk + i]) * s;
                }
            }
#pragma unroll
            for (int x = 0; x < 4; x++) {
                const int r = warp + WY_WARPS * (q + x);
                if (r < C) vp[r * WY_COLS + lane] = v[x];
                o_acc[q + x] = oo[x];
            }
        }
        __syncthreads();
        // b. o += P V' (causal), then out
#pragma unroll
        for (int q = 0; q < WY_RPW; q++) {
            const int r = warp + WY_WARPS * q;
            if (r < C) {
                float acc = o_acc[q];
                for (int m = 0; m <= r; m++) acc += pc[r * WY_C + m] * vp[m * WY_COLS + lane];
                if (live) o_raw[((size_t)(t0 + r) * nv + h) * dv + col] = acc;
            }
        }
        // c. S <- e^gam_last S + sum_m e^(gam_last - gam_m) k_m V'_m
        const float el = expf(last);
        for (int i = warp; i < dk; i += nwarps) {
            float s = S[i * WY_COLS + lane] * el;
            for (int m = 0; m < C; m++) {
                const float km = ek[m] * kc[(size_t)m * dk + i];
                s += km * vp[m * WY_COLS + lane];
            }
            S[i * WY_COLS + lane] = s;
        }
        __syncthreads();
    }
    if (live) {
        for (int i = warp; i < dk; i += nwarps) state_out[sbase + (size_t)i * dv + col] = S[i * WY_COLS + lane];
    }
}

#define WY_STATE(name, STAGED)                                                                                  \
    extern "C" __global__ void __launch_bounds__(WY_WARPS * 32)                                                 \
        name(float* __restrict__ o_raw, float* __restrict__ state_out, const float* __restrict__ qn,            \
             const float* __restrict__ kn, const float* __restrict__ w, const float* __restrict__ uu,           \
             const float* __restrict__ gam, const float* __restrict__ p, const float* __restrict__ state_in,    \
             int t, int nv, int dk, int dv) {                                                                   \
        wy_state_body<STAGED>(o_raw, state_out, qn, kn, w, uu, gam, p, state_in, t, nv, dk, dv);               \
    }
WY_STATE(gdn_wy_state, false)
WY_STATE(gdn_wy_state_staged, true)

extern "C" __global__ void __launch_bounds__(256)
    gdn_gated_norm(float* __restrict__ y, const float* __restrict__ o, const float* __restrict__ z,
                   const float* __restrict__ norm_w, int rows, int dv, float eps, int nv, int ldz) {
    const int row = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    const int lane = threadIdx.x & 31;
    if (row >= rows) return;
    const float* orow = o + (size_t)row * dv;
    float ss = 0.f;
    for (int j = lane; j < dv; j += 32) ss += orow[j] * orow[j];
    const float inv = 1.f / sqrtf(warp_sum(ss) / (float)dv + eps);
    // z's row `row` = (token, v-head): tokens ldz apart (a column view read in place).
    const float* zrow = z + (size_t)(row / nv) * ldz + (size_t)(row % nv) * dv;
    for (int j = lane; j < dv; j += 32) y[(size_t)row * dv + j] = orow[j] * inv * norm_w[j] * silu_f(zrow[j]);
}
