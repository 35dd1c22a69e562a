// Row-invariant matmuls over GGML weight rows (dense f32/f16/bf16 or quantised blocks,
// decoded by qunits.cuh), for every call size: y [m, n] f32 = x [m, k] f32 . W [n, k]^T.
//
// The chain of an output (r, c): lane l owns piece p = l % 4 (values p*8 .. p*8+7) of the
// row's 32-value units u = l / 4, l / 4 + 8, l / 4 + 16, ...; for each unit in turn it decodes
// its eight weights and adds x[r, u*32 + p*8 + i] * w[c, u*32 + p*8 + i] for i = 0..7 in order
// with fused multiply-adds into its partial sum; a fixed butterfly then sums the lanes. So the
// 32 lanes of a warp read eight whole neighbouring units (one contiguous stretch of the row)
// per step, and every (r, c) is the same chain whichever kernel and tile computes it: row r's
// result depends only on x row r and W, never on m, and a row inside a verify chunk or a
// ragged batch has the bits of the same row computed alone. Weights are decoded exactly (the
// CPU's dequantisation bits); activations stay f32 (candle's kernels quantise them to 8 bits).
//
// qmatmul_<t> (calls of 2..15 rows): a warp takes TC columns x TR rows at a time, decoding a
// weight piece once for TR rows and loading an x piece once for TC columns.
// qmatmul1_<t> (one row: decode): a warp takes one column, so that a matrix's columns spread
// over as many warps as possible (two or four columns per warp, sharing the activation loads,
// measured 22% and 43% slower on the H200: fewer warps in flight).
// qmatmul_staged_<t>_<R> (dense rows, 1..8 rows): see below.
// qmatmul_tiled_<t> / qmatmul_tiled2_<t> (16+ rows): the rows' activations for eight units
// at a time staged in shared memory; the two differ only in the register budget (1 or 2
// blocks per SM).
//
// moe_*: the same arithmetic over stacked expert weights [E, n, k]: a slot s (a token's j-th
// chosen expert) reads x row s / x_div and expert ids[s]; slots come in expert-sorted order
// (`order`) so that the blocks running together read the same expert.
#include "qunits.cuh"

#define TR 8
#define TC 4
#define WARPS 4

// Eight activations x[p .. p + 8] (16-byte aligned) into xv, and the chain's step over them:
// t + x0 w0 + x1 w1 + ... in order, one fused multiply-add each.
__device__ __forceinline__ void load_x8(const float* p, float (&xv)[8]) {
    const float4* xp = reinterpret_cast<const float4*>(p);
    const float4 a = __ldg(xp), b = __ldg(xp + 1);
    xv[0] = a.x, xv[1] = a.y, xv[2] = a.z, xv[3] = a.w, xv[4] = b.x, xv[5] = b.y, xv[6] = b.z, xv[7] = b.w;
}
__device__ __forceinline__ float chain8(float t, const float (&xv)[8], const float* wv) {
#pragma unroll
    for (int i = 0; i < 8; i++) t = fmaf(xv[i], wv[i], t);
    return t;
}

// acc[r][c] += x[r] . w[c] over this lane's pieces, for r < rows, c < cols.
template <int WT, int R, int C, int U = 2>
__device__ __forceinline__ void dot_tile(float (&acc)[R][C], const uint8_t* __restrict__ w, long long row_bytes,
                                         int cols, const float* __restrict__ x, int rows, int k, int lane) {
    const int units = k >> 5;
    const int l0 = (lane & 3) * 8;
    // U units in flight per lane (4 measured slower than 2 for one row: 111 against 140 tok/s,
    // 9B Q8_0 on the H200; the registers cost more warps than the loads gain).
#pragma unroll(U)
    for (int u = lane >> 2; u < units; u += 8) {
        float wv[C][8];
#pragma unroll
        for (int c = 0; c < C; c++) {
            if (c < cols) {
                decode8<WT>(w + (size_t)c * row_bytes, u, l0, wv[c]);
            } else {
#pragma unroll
                for (int i = 0; i < 8; i++) wv[c][i] = 0.f;
            }
        }
#pragma unroll
        for (int r = 0; r < R; r++) {
            if (r < rows) {
                float xv[8];
                load_x8(x + (size_t)r * k + u * 32 + l0, xv);
#pragma unroll
                for (int c = 0; c < C; c++) acc[r][c] = chain8(acc[r][c], xv, wv[c]);
            }
        }
    }
    // Dense rows whose length is not a multiple of 32 (quantised rows always are): value
    // units*32 + lane, after the lane's units, in the same place of every (r, c)'s chain.
    const int tail = units * 32 + lane;
    if (tail < k) {
#pragma unroll
        for (int c = 0; c < C; c++) {
            const float wt = c < cols ? decode_at<WT>(w + (size_t)c * row_bytes, tail) : 0.f;
#pragma unroll
            for (int r = 0; r < R; r++) {
                if (r < rows) acc[r][c] = fmaf(__ldg(x + (size_t)r * k + tail), wt, acc[r][c]);
            }
        }
    }
}

// w: n rows of row_bytes each. Block = WARPS warps = WARPS * C columns.
template <int WT, int R, int C, int U = 2>
__device__ void qmatmul(float* __restrict__ y, const float* __restrict__ x, const uint8_t* __restrict__ w, int m,
                        int n, int k, long long row_bytes) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int col0 = (blockIdx.x * WARPS + warp) * C;
    if (col0 >= n) return;
    const int cols = min(C, n - col0);
    const uint8_t* wr = w + (size_t)col0 * row_bytes;
    for (int r0 = 0; r0 < m; r0 += R) {
        const int rows = min(R, m - r0);
        float acc[R][C];
#pragma unroll
        for (int r = 0; r < R; r++)
#pragma unroll
            for (int c = 0; c < C; c++) acc[r][c] = 0.f;
        dot_tile<WT, R, C, U>(acc, wr, row_bytes, cols, x + (size_t)r0 * k, rows, k, lane);
#pragma unroll
        for (int r = 0; r < R; r++) {
#pragma unroll
            for (int c = 0; c < C; c++) {
                if (r < rows && c < cols) {
                    const float s = warp_sum(acc[r][c]);
                    if (lane == 0) y[(size_t)(r0 + r) * n + col0 + c] = s;
                }
            }
        }
    }
}

// The same products for calls of many rows (prefill), faster: a block of TT_W warps takes TT_R
// rows x TT_W * TT_C columns, and the rows' activations for the step's eight units are staged
// in shared memory (each value read from global memory once per block instead of once per
// warp, the loads contiguous). Every (r, c) is still lane l's chain over its pieces in order,
// then the same butterfly: the bits of qmatmul's (and so of a row computed alone).
#define TT_R 16
#define TT_C 4
#define TT_W 8
#define XPAD 36  // floats per staged unit: 32 values + 4 of padding (conflict-free 16-byte reads)

template <int WT>
__device__ void qmatmul_tiled(float* __restrict__ y, const float* __restrict__ x, const uint8_t* __restrict__ w,
                              int m, int n, int k, long long row_bytes) {
    __shared__ __align__(16) float xs[TT_R][8 * XPAD];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int col0 = (blockIdx.x * TT_W + warp) * TT_C;
    const int r0 = blockIdx.y * TT_R;
    const int rows = min(TT_R, m - r0);
    const int cols = max(0, min(TT_C, n - col0));  // warps past the last column still load x
    const uint8_t* wr = w + (size_t)min(col0, n - 1) * row_bytes;
    const float* xr = x + (size_t)r0 * k;
    const int units = k >> 5;
    const int slot = lane >> 2, l0 = (lane & 3) * 8;
    float acc[TT_R][TT_C];
#pragma unroll
    for (int r = 0; r < TT_R; r++)
#pragma unroll
        for (int c = 0; c < TT_C; c++) acc[r][c] = 0.f;
#pragma unroll 1
    for (int s = 0; s < units; s += 8) {
        __syncthreads();
        // 8 units x 8 float4 per row, read in order.
        for (int idx = threadIdx.x; idx < TT_R * 64; idx += blockDim.x) {
            const int r = idx >> 6, uu = (idx >> 3) & 7, part = idx & 7;
            float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
            if (r < rows && s + uu < units)
                v = __ldg(reinterpret_cast<const float4*>(xr + (size_t)r * k + (s + uu) * 32) + part);
            *reinterpret_cast<float4*>(&xs[r][uu * XPAD + part * 4]) = v;
        }
        __syncthreads();
        const int u = s + slot;
        if (u < units && cols > 0) {
            float wv[TT_C][8];
#pragma unroll
            for (int c = 0; c < TT_C; c++) {
                if (c < cols) {
                    decode8<WT>(wr + (size_t)c * row_bytes, u, l0, wv[c]);
                } else {
#pragma unroll
                    for (int i = 0; i < 8; i++) wv[c][i] = 0.f;
                }
            }
#pragma unroll
            for (int r = 0; r < TT_R; r++) {
                if (r < rows) {
                    const float4 a = *reinterpret_cast<const float4*>(&xs[r][slot * XPAD + l0]);
                    const float4 b = *reinterpret_cast<const float4*>(&xs[r][slot * XPAD + l0 + 4]);
                    const float xv[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
#pragma unroll
                    for (int c = 0; c < TT_C; c++) {
                        float t = acc[r][c];
#pragma unroll
                        for (int i = 0; i < 8; i++) t = fmaf(xv[i], wv[c][i], t);
                        acc[r][c] = t;
                    }
                }
            }
        }
    }
    if (cols == 0) return;
    // Dense rows whose length is not a multiple of 32: as in dot_tile.
    const int tail = units * 32 + lane;
    if (tail < k) {
#pragma unroll
        for (int c = 0; c < TT_C; c++) {
            const float wt = c < cols ? decode_at<WT>(wr + (size_t)c * row_bytes, tail) : 0.f;
#pragma unroll
            for (int r = 0; r < TT_R; r++) {
                if (r < rows) acc[r][c] = fmaf(__ldg(xr + (size_t)r * k + tail), wt, acc[r][c]);
            }
        }
    }
#pragma unroll
    for (int r = 0; r < TT_R; r++) {
#pragma unroll
        for (int c = 0; c < TT_C; c++) {
            if (r < rows && c < cols) {
                const float s = warp_sum(acc[r][c]);
                if (lane == 0) y[(size_t)(r0 + r) * n + col0 + c] = s;
            }
        }
    }
}

// qmatmul_staged_<t>_<R> (dense f32 / f16 / bf16 rows, calls of 1..R rows: decode, verify,
// small batches): a warp per output column, the same chain as qmatmul<WT, 1, 1> for each row,
// with the weight row copied into shared memory by cp.async, QS_STEPS warp steps (8 units
// each) per stage and QS_STAGES stages in flight per warp, so that a warp keeps kilobytes of
// reads outstanding without holding them in registers. Each lane then reads its eight values
// of the step from shared memory (lane l: bytes l * 8 * es of the step: conflict-free) and
// runs the chain exactly as dot_tile does. Rows of a multiple of 32 values only.
#define QS_WARPS 4
#define QS_STEPS 4
#define QS_STAGES 2


template <int WT>
__device__ __forceinline__ void staged8(const uint8_t* p, float* w) {
    if constexpr (WT == WT_F32) {
        const float4 a = *reinterpret_cast<const float4*>(p), b = *reinterpret_cast<const float4*>(p + 16);
        w[0] = a.x, w[1] = a.y, w[2] = a.z, w[3] = a.w, w[4] = b.x, w[5] = b.y, w[6] = b.z, w[7] = b.w;
    } else {
        const uint4 v4 = *reinterpret_cast<const uint4*>(p);
        const unsigned int v[4] = {v4.x, v4.y, v4.z, v4.w};
#pragma unroll
        for (int i = 0; i < 4; i++) {
            if constexpr (WT == WT_BF16) {
                w[2 * i] = __uint_as_float(v[i] << 16);
                w[2 * i + 1] = __uint_as_float(v[i] & 0xFFFF0000u);
            } else {
                w[2 * i] = __half2float(__ushort_as_half((unsigned short)(v[i] & 0xFFFFu)));
                w[2 * i + 1] = __half2float(__ushort_as_half((unsigned short)(v[i] >> 16)));
            }
        }
    }
}

template <int WT, int R>
__device__ void qmatmul_staged(float* __restrict__ y, const float* __restrict__ x, const uint8_t* __restrict__ w,
                               int m, int n, int k) {
    constexpr int EB = WT == WT_F32 ? 4 : 2;
    constexpr int STEP_BYTES = 256 * EB;
    constexpr int STAGE_BYTES = QS_STEPS * STEP_BYTES;
    __shared__ __align__(16) uint8_t stage[QS_WARPS][QS_STAGES][STAGE_BYTES];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int col = blockIdx.x * QS_WARPS + warp;
    if (col >= n) return;  // the whole warp
    const int units = k >> 5;
    const long long row_bytes = (long long)k * EB;
    const int chunks = (int)((row_bytes + STAGE_BYTES - 1) / STAGE_BYTES);
    const uint8_t* row = w + (size_t)col * row_bytes;
    const int rows = min(m, R);
    const int l0 = (lane & 3) * 8;
    auto load = [&](int c) {
        uint8_t* st = stage[warp][c % QS_STAGES];
        const int bytes = (int)min((long long)STAGE_BYTES, row_bytes - (long long)c * STAGE_BYTES);
        warp_cp_async(st, row + (size_t)c * STAGE_BYTES, bytes, lane);
    };
#pragma unroll
    for (int c = 0; c < QS_STAGES; c++) {
        if (c < chunks) load(c);
        cp_async_commit();
    }
    float acc[R];
#pragma unroll
    for (int i = 0; i < R; i++) acc[i] = 0.f;
    for (int c = 0; c < chunks; c++) {
        cp_async_wait<QS_STAGES - 1>();
        __syncwarp();
        const uint8_t* st = stage[warp][c % QS_STAGES];
#pragma unroll
        for (int s = 0; s < QS_STEPS; s++) {
            const int u = (c * QS_STEPS + s) * 8 + (lane >> 2);
            if (u < units) {
                float wv[8];
                staged8<WT>(st + s * STEP_BYTES + lane * 8 * EB, wv);
#pragma unroll
                for (int i = 0; i < R; i++) {
                    if (i < rows) {
                        float xv[8];
                        load_x8(x + (size_t)i * k + u * 32 + l0, xv);
                        acc[i] = chain8(acc[i], xv, wv);
                    }
                }
            }
        }
        __syncwarp();  // every lane has read this stage: it may be refilled
        if (c + QS_STAGES < chunks) load(c + QS_STAGES);
        cp_async_commit();
    }
#pragma unroll
    for (int i = 0; i < R; i++) {
        const float t = warp_sum(acc[i]);
        if (lane == 0 && i < rows) y[(size_t)i * n + col] = t;
    }
}

#define QSTAGED(suffix, WT, R)                                                                                 \
    extern "C" __global__ void __launch_bounds__(QS_WARPS * 32)                                               \
        qmatmul_staged_##suffix##_##R(float* y, const float* x, const uint8_t* w, int m, int n, int k) {       \
        qmatmul_staged<WT, R>(y, x, w, m, n, k);                                                              \
    }
#define QSTAGED_ALL(suffix, WT) QSTAGED(suffix, WT, 1) QSTAGED(suffix, WT, 2) QSTAGED(suffix, WT, 4) QSTAGED(suffix, WT, 8)
QSTAGED_ALL(f32, WT_F32)
QSTAGED_ALL(f16, WT_F16)
QSTAGED_ALL(bf16, WT_BF16)

// Slot order[blockIdx.y]; y [S, n]. One column per warp.
template <int WT>
__device__ void moe_matmul(float* __restrict__ y, const float* __restrict__ x, const uint8_t* __restrict__ w,
                           const int* __restrict__ order, const int* __restrict__ ids, int n, int k,
                           long long row_bytes, long long expert_bytes, int x_div) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int col = blockIdx.x * WARPS + warp;
    if (col >= n) return;
    const int s = order[blockIdx.y];
    const uint8_t* wr = w + (size_t)ids[s] * expert_bytes + (size_t)col * row_bytes;
    float acc[1][1] = {{0.f}};
    dot_tile<WT, 1, 1>(acc, wr, row_bytes, 1, x + (size_t)(s / x_div) * k, 1, k, lane);
    const float t = warp_sum(acc[0][0]);
    if (lane == 0) y[(size_t)s * n + col] = t;
}

// h [S, n] = silu(x . Wg^T) * (x . Wu^T) per slot: the gate and up projections of the chosen
// experts in one pass (wg, wu: the two stacks, or one fused stack at two offsets).
template <int WT>
__device__ void moe_gate_up(float* __restrict__ h, const float* __restrict__ x, const uint8_t* __restrict__ wg,
                            const uint8_t* __restrict__ wu, const int* __restrict__ order, const int* __restrict__ ids,
                            int n, int k, long long row_bytes, long long expert_bytes, int x_div) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int col = blockIdx.x * WARPS + warp;
    if (col >= n) return;
    const int s = order[blockIdx.y];
    const size_t off = (size_t)ids[s] * expert_bytes + (size_t)col * row_bytes;
    const float* xr = x + (size_t)(s / x_div) * k;
    float g[1][1] = {{0.f}}, u[1][1] = {{0.f}};
    dot_tile<WT, 1, 1>(g, wg + off, row_bytes, 1, xr, 1, k, lane);
    dot_tile<WT, 1, 1>(u, wu + off, row_bytes, 1, xr, 1, k, lane);
    const float gs = warp_sum(g[0][0]), us = warp_sum(u[0][0]);
    if (lane == 0) h[(size_t)s * n + col] = silu_f(gs) * us;
}

#define QMATMUL(suffix, WT)                                                                                      \
    extern "C" __global__ void __launch_bounds__(WARPS * 32)                                                     \
        qmatmul_##suffix(float* y, const float* x, const uint8_t* w, int m, int n, int k, long long row_bytes) { \
        qmatmul<WT, TR, TC>(y, x, w, m, n, k, row_bytes);                                                        \
    }                                                                                                            \
    extern "C" __global__ void __launch_bounds__(WARPS * 32)                                                     \
        qmatmul1_##suffix(float* y, const float* x, const uint8_t* w, int m, int n, int k, long long row_bytes) { \
        qmatmul<WT, 1, 1>(y, x, w, m, n, k, row_bytes);                                                          \
    }                                                                                                            \
    extern "C" __global__ void __launch_bounds__(TT_W * 32, 1)                                                    \
        qmatmul_tiled_##suffix(float* y, const float* x, const uint8_t* w, int m, int n, int k,                  \
                               long long row_bytes) {                                                            \
        qmatmul_tiled<WT>(y, x, w, m, n, k, row_bytes);                                                          \
    }                                                                                                            \
    extern "C" __global__ void __launch_bounds__(TT_W * 32, 2)                                                    \
        qmatmul_tiled2_##suffix(float* y, const float* x, const uint8_t* w, int m, int n, int k,                 \
                                long long row_bytes) {                                                           \
        qmatmul_tiled<WT>(y, x, w, m, n, k, row_bytes);                                                          \
    }                                                                                                            \
    extern "C" __global__ void __launch_bounds__(WARPS * 32)                                                     \
        moe_matmul_##suffix(float* y, const float* x, const uint8_t* w, const int* order, const int* ids, int n, \
                            int k, long long row_bytes, long long expert_bytes, int x_div) {                     \
        moe_matmul<WT>(y, x, w, order, ids, n, k, row_bytes, expert_bytes, x_div);                              \
    }                                                                                                            \
    extern "C" __global__ void __launch_bounds__(WARPS * 32)                                                     \
        moe_gate_up_##suffix(float* h, const float* x, const uint8_t* wg, const uint8_t* wu, const int* order,   \
                             const int* ids, int n, int k, long long row_bytes, long long expert_bytes,          \
                             int x_div) {                                                                        \
        moe_gate_up<WT>(h, x, wg, wu, order, ids, n, k, row_bytes, expert_bytes, x_div);                        \
    }

QMATMUL(f32, WT_F32)
QMATMUL(f16, WT_F16)
QMATMUL(bf16, WT_BF16)
QMATMUL(q4_0, WT_Q4_0)
QMATMUL(q4_1, WT_Q4_1)
QMATMUL(q5_0, WT_Q5_0)
QMATMUL(q5_1, WT_Q5_1)
QMATMUL(q8_0, WT_Q8_0)
QMATMUL(q4_k, WT_Q4_K)
QMATMUL(q5_k, WT_Q5_K)
QMATMUL(q6_k, WT_Q6_K)
QMATMUL(q2_k, WT_Q2_K)
QMATMUL(q3_k, WT_Q3_K)
