// Q8_0 matmuls on the tensor cores (int8 mma.sync), row-invariant for every call size:
// y [m, n] f32 = x [m, k] . W [n, k]^T with W in GGML Q8_0 rows (blocks of 32 int8 values and
// an f16 scale, 34 bytes).
//
// q8_quantize_rows: x [m, k] f32 -> xq [m, k] int8 and dx [m, k / 32] f32, per 32-value block
//   d = max|x| / 127 and q = round-to-nearest-even(x * 127 / max|x|) (0 for an all-zero block).
//   A row's blocks depend only on that row.
// qdot1_q8_0: the same chain for one row (decode) on the CUDA cores: a warp per output column,
//   its eight groups of four lanes standing for the eight warps of qmma (group p takes the
//   segments p, p + 8, ... in order), a block's integer dot product from four lanes' __dp4a
//   (exact), the same chain_step, then the groups' partials added in group order. Same bits as
//   qmma for every row; far more warps over a matrix than qmma has for one row.
// qmma_q8_0_<NT>: one thread block per 16 output columns x NT rows (NT = 8, 16, 32, 64), eight
//   warps splitting the k blocks. The chain of an output (r, c) is fixed by k alone:
//   - per block b, the exact integer dot product isum_b = sum_i wq[c, b, i] * xq[r, b, i]
//     (one m16n8k32 mma; an integer sum has no order);
//   - the blocks are cut into segments of L = min(8, max(1, nb / 8)) blocks; warp w takes the
//     segments w, w + 8, w + 16, ... in order and keeps one partial, acc = fmaf(isum_b,
//     dw_b * dx_b, acc) block after block;
//   - the eight warps' partials are added in order, warp 0 first.
//   Nothing in the chain depends on m, NT or which rows share a launch, so a row inside a
//   verify chunk, a batch or a prefill chunk has the bits of the same row computed alone.
// Weights: each warp copies its segment's 16 weight rows (L x 34 bytes each) into shared
// memory (16-byte loads where rows and segments are 16-byte aligned, else 2-byte loads), then
// builds the mma fragments from there.
#include "common.cuh"

#define QM_WARPS 8
#define QM_MAXL 8
#define QM_BLOCK_BYTES 34

// A 32-value block's quantisation, one value per lane (the whole warp calls it): this lane's
// int8 value, and the block's scale in *d on every lane. The one definition both paths use.
__device__ __forceinline__ int8_t quant_block(float v, float* d) {
    float amax = fabsf(v);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
    const float id = amax > 0.f ? 127.f / amax : 0.f;
    int q = __float2int_rn(v * id);
    q = max(-127, min(127, q));
    *d = amax / 127.f;
    return (int8_t)q;
}

// One warp per 32-value block.
extern "C" __global__ void q8_quantize_rows(int8_t* __restrict__ xq, float* __restrict__ dx,
                                            const float* __restrict__ x, int m, int k) {
    const int nb = k >> 5;
    const long long blk = (long long)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    const int lane = threadIdx.x & 31;
    if (blk >= (long long)m * nb) return;
    float d;
    xq[blk * 32 + lane] = quant_block(x[blk * 32 + lane], &d);
    if (lane == 0) dx[blk] = d;
}

__device__ __forceinline__ uint32_t ld_u32_2aligned(const uint8_t* p) {
    const uint16_t* h = reinterpret_cast<const uint16_t*>(p);
    return (uint32_t)h[0] | ((uint32_t)h[1] << 16);
}

__device__ __forceinline__ void mma_s8(int (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%10, %10, %10, %10};\n"
        : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1), "r"(0));
}

// The one step of the chain: acc + isum * (dw * dx), rounded as written.
__device__ __forceinline__ float chain_step(float acc, int isum, float dw, float dxv) {
    return fmaf(__int2float_rn(isum), __fmul_rn(dw, dxv), acc);
}

template <int NT>
__device__ void qmma_q8_0(float* __restrict__ y, const int8_t* __restrict__ xq, const float* __restrict__ dx,
                          const uint8_t* __restrict__ w, int m, int n, int k, long long rb) {
    constexpr int NJ = NT / 8;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int g = lane >> 2, tig = lane & 3;
    const int row0 = blockIdx.x * NT;
    const int col0 = blockIdx.y * 16;
    const int nb = k >> 5;
    const int L = min(QM_MAXL, max(1, nb / QM_WARPS));
    const int nseg = (nb + L - 1) / L;
    const int seg_stride = L * QM_BLOCK_BYTES;  // bytes of one staged weight row
    __shared__ __align__(16) uint8_t stage[QM_WARPS][16 * QM_MAXL * QM_BLOCK_BYTES];
    uint8_t* st = stage[warp];
    float acc[NJ][4];
#pragma unroll
    for (int j = 0; j < NJ; j++) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.f;
    const bool vec16 = (rb % 16 == 0) && (seg_stride % 16 == 0) && ((reinterpret_cast<uintptr_t>(w) & 15) == 0);
    for (int s = warp; s < nseg; s += QM_WARPS) {
        const int b0 = s * L;
        const int nbs = min(L, nb - b0);
        const int bytes = nbs * QM_BLOCK_BYTES;
        __syncwarp();
        if (vec16 && bytes % 16 == 0) {
            const int per_row = bytes >> 4;
            for (int i = lane; i < 16 * per_row; i += 32) {
                const int r = i / per_row, c = i - r * per_row;
                const int col = col0 + r;
                uint4 v = make_uint4(0, 0, 0, 0);
                if (col < n) v = __ldg(reinterpret_cast<const uint4*>(w + (size_t)col * rb + (size_t)b0 * QM_BLOCK_BYTES) + c);
                *reinterpret_cast<uint4*>(st + r * seg_stride + c * 16) = v;
            }
        } else {
            const int per_row = bytes >> 1;
            for (int i = lane; i < 16 * per_row; i += 32) {
                const int r = i / per_row, c = i - r * per_row;
                const int col = col0 + r;
                uint16_t v = 0;
                if (col < n) v = reinterpret_cast<const uint16_t*>(w + (size_t)col * rb + (size_t)b0 * QM_BLOCK_BYTES)[c];
                reinterpret_cast<uint16_t*>(st + r * seg_stride)[c] = v;
            }
        }
        __syncwarp();
        for (int bi = 0; bi < nbs; bi++) {
            const uint8_t* blk_lo = st + g * seg_stride + bi * QM_BLOCK_BYTES;
            const uint8_t* blk_hi = blk_lo + 8 * seg_stride;
            uint32_t a[4];
            a[0] = ld_u32_2aligned(blk_lo + 2 + tig * 4);
            a[1] = ld_u32_2aligned(blk_hi + 2 + tig * 4);
            a[2] = ld_u32_2aligned(blk_lo + 18 + tig * 4);
            a[3] = ld_u32_2aligned(blk_hi + 18 + tig * 4);
            const float dw0 = __half2float(*reinterpret_cast<const __half*>(blk_lo));
            const float dw1 = __half2float(*reinterpret_cast<const __half*>(blk_hi));
            const int b = b0 + bi;
#pragma unroll
            for (int j = 0; j < NJ; j++) {
                const int rb_ = row0 + j * 8;
                if (rb_ < m) {
                const int rr = rb_ + g;  // this lane's row of the B fragment
                uint32_t x0 = 0, x1 = 0;
                if (rr < m) {
                    const int8_t* xp = xq + (size_t)rr * k + b * 32 + tig * 4;
                    x0 = *reinterpret_cast<const uint32_t*>(xp);
                    x1 = *reinterpret_cast<const uint32_t*>(xp + 16);
                }
                int d[4];
                mma_s8(d, a, x0, x1);
                const int r0 = rb_ + tig * 2, r1 = r0 + 1;
                const float dx0 = r0 < m ? dx[(size_t)r0 * nb + b] : 0.f;
                const float dx1 = r1 < m ? dx[(size_t)r1 * nb + b] : 0.f;
                acc[j][0] = chain_step(acc[j][0], d[0], dw0, dx0);
                acc[j][1] = chain_step(acc[j][1], d[1], dw0, dx1);
                acc[j][2] = chain_step(acc[j][2], d[2], dw1, dx0);
                acc[j][3] = chain_step(acc[j][3], d[3], dw1, dx1);
                }
            }
        }
    }
    // The warps' partials, added in warp order (the staging area is free now).
    __syncthreads();
    float* red = reinterpret_cast<float*>(&stage[0][0]);  // [warp][16 cols][NT rows]
#pragma unroll
    for (int j = 0; j < NJ; j++) {
        const int r0 = j * 8 + tig * 2;
        red[(warp * 16 + g) * NT + r0] = acc[j][0];
        red[(warp * 16 + g) * NT + r0 + 1] = acc[j][1];
        red[(warp * 16 + g + 8) * NT + r0] = acc[j][2];
        red[(warp * 16 + g + 8) * NT + r0 + 1] = acc[j][3];
    }
    __syncthreads();
    for (int i = threadIdx.x; i < 16 * NT; i += blockDim.x) {
        const int c = i & 15, r = i >> 4;
        float v = red[c * NT + r];
#pragma unroll
        for (int ww = 1; ww < QM_WARPS; ww++) v += red[(ww * 16 + c) * NT + r];
        const int row = row0 + r, col = col0 + c;
        if (row < m && col < n) y[(size_t)row * n + col] = v;
    }
}

#define QMMA(NT)                                                                                              \
    extern "C" __global__ void __launch_bounds__(256, 2)                                                     \
        qmma_q8_0_##NT(float* y, const int8_t* xq, const float* dx, const uint8_t* w, int m, int n, int k,    \
                       long long rb) {                                                                       \
        qmma_q8_0<NT>(y, xq, dx, w, m, n, k, rb);                                            \
    }

QMMA(8)
QMMA(16)
QMMA(32)
QMMA(64)

// Eight bytes at p (2-byte aligned) as two words, with aligned 32-bit loads.
__device__ __forceinline__ void load8_2aligned(const uint8_t* p, uint32_t* lo, uint32_t* hi) {
    if ((reinterpret_cast<uintptr_t>(p) & 3) == 0) {
        const uint32_t* q = reinterpret_cast<const uint32_t*>(p);
        *lo = q[0];
        *hi = q[1];
    } else {
        // Words at p - 2 and p + 2, then the last two bytes alone (no read past p + 8).
        const uint32_t* q = reinterpret_cast<const uint32_t*>(p - 2);
        const uint32_t a = q[0], b = q[1];
        const uint32_t c = *reinterpret_cast<const uint16_t*>(p + 6);
        *lo = __funnelshift_r(a, b, 16);
        *hi = (b >> 16) | (c << 16);
    }
}

// Steps whose loads qdot1 issues together.
#define QD_U 4

extern "C" __global__ void __launch_bounds__(256)
    qdot1_q8_0(float* __restrict__ y, const int8_t* __restrict__ xq, const float* __restrict__ dx,
               const uint8_t* __restrict__ w, int n, int k, long long rb) {
    const int lane = threadIdx.x & 31;
    const int col = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (col >= n) return;  // the whole warp
    const int part = lane >> 2, q4 = lane & 3;
    const int nb = k >> 5;
    const int L = min(QM_MAXL, max(1, nb / QM_WARPS));
    const int nseg = (nb + L - 1) / L;
    const int rounds = (nseg + QM_WARPS - 1) / QM_WARPS;
    const uint8_t* row = w + (size_t)col * rb;
    float acc = 0.f;
    // Every lane runs every step (the shuffles need the whole warp); a group past its blocks
    // adds nothing. The loads of QD_U steps are issued before any of them is used, so a lane
    // has QD_U blocks' worth of reads in flight; the chain steps then run in the same order.
    const int steps = rounds * L;
    for (int it0 = 0; it0 < steps; it0 += QD_U) {
        uint32_t w0[QD_U], w1[QD_U], x0[QD_U], x1[QD_U];
        float dw[QD_U], dxv[QD_U];
        bool live[QD_U];
#pragma unroll
        for (int u = 0; u < QD_U; u++) {
            const int it = it0 + u;
            const int s = part + QM_WARPS * (it / L);
            const int b = s * L + it % L;
            live[u] = it < steps && s < nseg && it % L < min(L, nb - s * L);
            w0[u] = w1[u] = x0[u] = x1[u] = 0;
            dw[u] = dxv[u] = 0.f;
            if (live[u]) {
                const uint8_t* blk = row + (size_t)b * QM_BLOCK_BYTES;
                load8_2aligned(blk + 2 + q4 * 8, &w0[u], &w1[u]);
                const uint2 xv = __ldg(reinterpret_cast<const uint2*>(xq + (size_t)b * 32 + q4 * 8));
                x0[u] = xv.x;
                x1[u] = xv.y;
                dw[u] = __half2float(*reinterpret_cast<const __half*>(blk));
                dxv[u] = __ldg(dx + b);
            }
        }
#pragma unroll
        for (int u = 0; u < QD_U; u++) {
            int isum = __dp4a((int)w0[u], (int)x0[u], 0);
            isum = __dp4a((int)w1[u], (int)x1[u], isum);
            isum += __shfl_xor_sync(0xffffffffu, isum, 1);
            isum += __shfl_xor_sync(0xffffffffu, isum, 2);
            if (live[u]) acc = chain_step(acc, isum, dw[u], dxv[u]);
        }
    }
    float tot = __shfl_sync(0xffffffffu, acc, 0);
#pragma unroll
    for (int p = 1; p < QM_WARPS; p++) tot += __shfl_sync(0xffffffffu, acc, 4 * p);
    if (lane == 0) y[col] = tot;
}
