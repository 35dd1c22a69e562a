// Q8_0 matmuls on the tensor cores (int8 mma.sync), row-invariant for every call size:
// y [m, n] f32 = x [m, k] . W [n, k]^T with W in GGML Q8_0 rows (blocks of 32 int8 values and
// an f16 scale, 34 bytes).
//
// q8_quantize_rows: x [m, k] f32 -> xq [m, k] int8 and dx [m, k / 32] f32, per 32-value block
//   d = max|x| / 127 and q = round-to-nearest-even(x * 127 / max|x|) (0 for an all-zero block).
//   A row's blocks depend only on that row. q8_quantize_rows_gated quantises silu(g) * u
//   (a gated MLP's down projection) the same way.
// qmv_q8_0_<R>: the same chain for calls of up to R rows (decode, verify, small batches) on the
//   CUDA cores, a warp per output column with the weights staged by cp.async (below). Same
//   bits as qmma for every row; far more warps over a matrix than qmma has for a few rows.
// qmvm_q8_0 (2..8 rows; below): qmma's 8-row tile with its weights streamed by cp.async.
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
#include "q8act.cuh"

#define QM_WARPS 8
#define QM_MAXL 8
#define QM_BLOCK_BYTES 34

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

// q8_quantize_rows of silu(g) * u (gated_act: a gated MLP's down projection), the same codes
// and scales as silu_mul_rows followed by q8_quantize_rows.
extern "C" __global__ void q8_quantize_rows_gated(int8_t* __restrict__ xq, float* __restrict__ dx,
                                                  const float* __restrict__ g, long long ldg,
                                                  const float* __restrict__ u, long long ldu, int m, int k) {
    const int nb = k >> 5;
    const long long blk = (long long)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    const int lane = threadIdx.x & 31;
    if (blk >= (long long)m * nb) return;
    const long long r = blk / nb, c = (blk - r * nb) * 32 + lane;
    float d;
    xq[blk * 32 + lane] = quant_block(gated_act(g, ldg, u, ldu, r, c), &d);
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


// The mma's A fragment (weight columns g and g + 8, this lane's k slots) of block bi of a staged
// segment (16 columns `stride` bytes apart, 34-byte blocks), and the two columns' scales.
__device__ __forceinline__ void staged_a(const uint8_t* st, int stride, int bi, int g, int tig, uint32_t (&a)[4],
                                         float& dw0, float& dw1) {
    const uint8_t* blk_lo = st + g * stride + bi * QM_BLOCK_BYTES;
    const uint8_t* blk_hi = blk_lo + 8 * stride;
    a[0] = ld_u32_2aligned(blk_lo + 2 + tig * 4);
    a[1] = ld_u32_2aligned(blk_hi + 2 + tig * 4);
    a[2] = ld_u32_2aligned(blk_lo + 18 + tig * 4);
    a[3] = ld_u32_2aligned(blk_hi + 18 + tig * 4);
    dw0 = __half2float(*reinterpret_cast<const __half*>(blk_lo));
    dw1 = __half2float(*reinterpret_cast<const __half*>(blk_hi));
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
            uint32_t a[4];
            float dw0, dw1;
            staged_a(st, seg_stride, bi, g, tig, a, dw0, dw1);
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

// qmv_q8_0_<R>: calls of 1..R rows (decode, verify, small batches) on the CUDA cores with
// qmma's chain: a warp per output column; lane group p (lanes 4p..4p+3) is qmma's warp p and
// takes the segments p, p + 8, ... in order. The weights come into shared memory by rounds of
// eight segments (8 L blocks: 272 L contiguous bytes of the row, 16-byte aligned when k is a
// multiple of 256), copied with cp.async 16 bytes per lane, QV_STAGES rounds in flight per
// warp, so a warp keeps several kilobytes of reads outstanding and every global load is a
// whole contiguous stretch. Lane q of a group takes the blocks q and q + 4 of its segment: an
// exact integer dot product from __dp4a, the block's scale product dw * dx; the group's lanes
// pass these to each other (width-4 shuffles) so that each lane runs the chain over the
// segment's blocks in order. Then the groups' partials are added in group order: qmma's bits.
#define QV_WARPS 4
#define QV_STAGES 2
#define QV_ROUND (QM_WARPS * QM_MAXL * QM_BLOCK_BYTES)  // 2176 bytes: eight segments of eight blocks
#define QV_PAD 16                                      // words read past a block's last byte


// A staged block at byte `off` of shared memory: its 32 int8 values as eight words (from
// nine aligned word reads and funnel shifts: blocks start at even offsets) and its scale.
__device__ __forceinline__ float staged_block(const uint8_t* st, int off, uint32_t (&qs)[8]) {
    const uint32_t* words = reinterpret_cast<const uint32_t*>(st);
    const int wi = (off + 2) >> 2, sh = ((off + 2) & 3) * 8;
    uint32_t a = words[wi];
#pragma unroll
    for (int j = 0; j < 8; j++) {
        const uint32_t b = words[wi + j + 1];
        qs[j] = __funnelshift_r(a, b, sh);
        a = b;
    }
    const uint32_t hw = words[off >> 2] >> ((off & 2) * 8);
    return __half2float(__ushort_as_half((unsigned short)(hw & 0xffffu)));
}

template <int R>
__device__ void qmv_q8_0(float* __restrict__ y, const int8_t* __restrict__ xq, const float* __restrict__ dx,
                         const uint8_t* __restrict__ w, int m, int n, int k, long long rb) {
    __shared__ __align__(16) uint8_t stage[QV_WARPS][QV_STAGES][QV_ROUND + QV_PAD];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int col = blockIdx.x * QV_WARPS + warp;
    if (col >= n) return;  // the whole warp
    const int p = lane >> 2, q = lane & 3;
    const int nb = k >> 5;
    const int L = min(QM_MAXL, max(1, nb / QM_WARPS));
    const int nseg = nb / L;  // the caller ensures nb % 8 == 0, so L divides nb
    const int rounds = (nseg + QM_WARPS - 1) / QM_WARPS;
    const int seg_bytes = L * QM_BLOCK_BYTES;
    const uint8_t* row = w + (size_t)col * rb;
    const int rows = min(m, R);

    auto load = [&](int r) {
        uint8_t* st = stage[warp][r % QV_STAGES];
        const int segs = min(QM_WARPS, nseg - r * QM_WARPS);
        warp_cp_async(st, row + (size_t)r * QM_WARPS * seg_bytes, segs * seg_bytes, lane);
    };
#pragma unroll
    for (int r = 0; r < QV_STAGES; r++) {
        if (r < rounds) load(r);
        cp_async_commit();
    }
    float acc[R];
#pragma unroll
    for (int i = 0; i < R; i++) acc[i] = 0.f;
    for (int r = 0; r < rounds; r++) {
        const int s = r * QM_WARPS + p;
        const bool live = s < nseg;
        // This lane's activation blocks: for one or two rows loaded before the wait (global,
        // independent of the staged weights), for more rows next to their use (registers).
        constexpr bool PRE = R <= 2;
        uint4 xa[PRE ? R : 1][2][2];
        float dxv[PRE ? R : 1][2];
        auto load_x = [&](int i, int t, uint4(&xo)[2], float& dxo) {
            const int bi = q + 4 * t;
            const int b = s * L + bi;
            if (live && bi < L && i < rows) {
                const uint4* xp = reinterpret_cast<const uint4*>(xq + (size_t)i * k + (size_t)b * 32);
                xo[0] = __ldg(xp);
                xo[1] = __ldg(xp + 1);
                dxo = __ldg(dx + (size_t)i * nb + b);
            } else {
                xo[0] = xo[1] = make_uint4(0, 0, 0, 0);
                dxo = 0.f;
            }
        };
        if constexpr (PRE) {
#pragma unroll
            for (int t = 0; t < 2; t++)
#pragma unroll
                for (int i = 0; i < R; i++) load_x(i, t, xa[i][t], dxv[i][t]);
        }
        cp_async_wait<QV_STAGES - 1>();
        __syncwarp();
        const uint8_t* st = stage[warp][r % QV_STAGES];
        int isum[R][2];
        float scl[R][2];
#pragma unroll
        for (int t = 0; t < 2; t++) {
            const int bi = q + 4 * t;
            uint32_t qs[8];
            float dw = 0.f;
            if (live && bi < L) {
                dw = staged_block(st, p * seg_bytes + bi * QM_BLOCK_BYTES, qs);
            } else {
#pragma unroll
                for (int j = 0; j < 8; j++) qs[j] = 0;
            }
#pragma unroll
            for (int i = 0; i < R; i++) {
                uint4 xl[2];
                float dl;
                if constexpr (PRE) {
                    xl[0] = xa[i][t][0], xl[1] = xa[i][t][1], dl = dxv[i][t];
                } else {
                    load_x(i, t, xl, dl);
                }
                const uint32_t xw[8] = {xl[0].x, xl[0].y, xl[0].z, xl[0].w, xl[1].x, xl[1].y, xl[1].z, xl[1].w};
                int d = 0;
#pragma unroll
                for (int j = 0; j < 8; j++) d = __dp4a((int)qs[j], (int)xw[j], d);
                isum[i][t] = d;
                scl[i][t] = chain_scale(dw, dl);
            }
        }
        __syncwarp();  // every lane has read this stage: it may be refilled
        if (r + QV_STAGES < rounds) load(r + QV_STAGES);
        cp_async_commit();
        // The segment's chain, block by block in order (block bi is lane bi % 4's t = bi / 4).
#pragma unroll
        for (int bi = 0; bi < QM_MAXL; bi++) {
            if (bi < L) {
#pragma unroll
                for (int i = 0; i < R; i++) {
                    const int v = __shfl_sync(0xffffffffu, isum[i][bi >> 2], bi & 3, 4);
                    const float sc = __shfl_sync(0xffffffffu, scl[i][bi >> 2], bi & 3, 4);
                    if (live && i < rows) acc[i] = chain_fma(acc[i], v, sc);
                }
            }
        }
    }
#pragma unroll
    for (int i = 0; i < R; i++) {
        float tot = __shfl_sync(0xffffffffu, acc[i], 0);
#pragma unroll
        for (int g = 1; g < QM_WARPS; g++) tot += __shfl_sync(0xffffffffu, acc[i], 4 * g);
        if (lane == 0 && i < rows) y[(size_t)i * n + col] = tot;
    }
}

#define QMV(R)                                                                                                  \
    extern "C" __global__ void __launch_bounds__(QV_WARPS * 32)                                                \
        qmv_q8_0_##R(float* y, const int8_t* xq, const float* dx, const uint8_t* w, int m, int n, int k,        \
                     long long rb) {                                                                           \
        qmv_q8_0<R>(y, xq, dx, w, m, n, k, rb);                                                                \
    }

QMV(1)
QMV(2)
QMV(4)
QMV(8)

// qmvm_q8_0: calls of 2..8 rows (verify steps, small batches) on the tensor cores with qmma's
// chain, its weights streamed the way qmv's are: a block per 16 output columns, eight warps,
// warp p being qmma's warp p (segments p, p + 8, ... in order). A warp copies each of its
// segments (the 16 columns' L = 8 blocks: 272 contiguous bytes a column) into its own
// shared-memory stage by cp.async, QS_STAGES segments in flight, so the reads of a segment
// overlap the mma of the one before (qmma copies a segment with plain loads, then computes: a
// round trip per copy step); the rows' codes and scales of the segment come from global
// memory (L1: every block reads the same few rows) before the wait. One m16n8k32 mma a block
// gives the 16 columns x 8 rows' integer dot products; each lane runs the chain of its four
// outputs; then the warps' partials are added in warp order (qmma's bits). Rows past m read
// row m - 1 (a B column only reaches its own outputs, which are dropped). Takes k a multiple
// of 256 and at least 2048 (L = 8), W 16-byte aligned.
// Measured on an H100 (9B Q8_0, 2026-12-06): a K = 4 verify step 1.26 decode steps against
// 1.57 on qmma_q8_0_8; staging the rows' codes beside the weights (two blocks an SM rather
// than three) read 1.30.
#ifndef QS_STAGES
#define QS_STAGES 2
#endif
#define QS_W (16 * QM_MAXL * QM_BLOCK_BYTES)  // 4352: a stage, 16 columns' segments
#define QS_SMEM (QM_WARPS * QS_STAGES * QS_W)  // the dynamic shared memory a block takes

extern "C" __global__ void __launch_bounds__(QM_WARPS * 32, 3)
    qmvm_q8_0(float* __restrict__ y, const int8_t* __restrict__ xq, const float* __restrict__ dx,
              const uint8_t* __restrict__ w, int m, int n, int k, long long rb) {
    extern __shared__ __align__(16) uint8_t qs_smem[];
    {
        unsigned dyn;
        asm("mov.u32 %0, %%dynamic_smem_size;" : "=r"(dyn));
        if (m < 1 || m > 8 || (k & 255) || k < 2048 || dyn < (unsigned)QS_SMEM) __trap();  // launched wrongly
    }
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int g = lane >> 2, tig = lane & 3;
    const int col0 = blockIdx.x * 16;
    const int nb = k >> 5, nseg = nb / QM_MAXL;
    const int mine = (nseg - warp + QM_WARPS - 1) / QM_WARPS;  // this warp's segments
    constexpr int SEG = QM_MAXL * QM_BLOCK_BYTES;               // 272 bytes
    auto stage = [&](int j) { return qs_smem + (warp * QS_STAGES + j % QS_STAGES) * QS_W; };
    // 16 columns x 17 pieces of a segment (a column past n copies column n - 1: its outputs
    // are dropped).
    auto load = [&](int j) {
        const int s = warp + j * QM_WARPS;
        uint8_t* st = stage(j);
        for (int i = lane; i < 16 * 17; i += 32) {
            const int c = i / 17, p = i - c * 17;
            const int col = min(col0 + c, n - 1);
            cp_async16(st + c * SEG + p * 16, w + (size_t)col * rb + (size_t)s * SEG + p * 16);
        }
    };
#pragma unroll
    for (int j = 0; j < QS_STAGES; j++) {
        if (j < mine) load(j);
        cp_async_commit();
    }
    float acc[4] = {0.f, 0.f, 0.f, 0.f};
    const int xr = min(g, m - 1), r0 = min(2 * tig, m - 1), r1 = min(2 * tig + 1, m - 1);
    for (int j = 0; j < mine; j++) {
        const int s = warp + j * QM_WARPS;
        // This segment's codes of the lane's B row and scales of its two output rows.
        uint32_t xv[QM_MAXL][2];
        float dv[QM_MAXL][2];
        const uint32_t* xp = reinterpret_cast<const uint32_t*>(xq + (size_t)xr * k + (size_t)s * 256 + tig * 4);
#pragma unroll
        for (int bi = 0; bi < QM_MAXL; bi++) {
            xv[bi][0] = __ldg(xp + bi * 8);
            xv[bi][1] = __ldg(xp + bi * 8 + 4);
            dv[bi][0] = __ldg(dx + (size_t)r0 * nb + s * QM_MAXL + bi);
            dv[bi][1] = __ldg(dx + (size_t)r1 * nb + s * QM_MAXL + bi);
        }
        cp_async_wait<QS_STAGES - 1>();
        __syncwarp();
        const uint8_t* st = stage(j);
#pragma unroll
        for (int bi = 0; bi < QM_MAXL; bi++) {
            uint32_t a[4];
            float dw0, dw1;
            staged_a(st, SEG, bi, g, tig, a, dw0, dw1);
            int d[4];
            mma_s8(d, a, xv[bi][0], xv[bi][1]);
            acc[0] = chain_step(acc[0], d[0], dw0, dv[bi][0]);
            acc[1] = chain_step(acc[1], d[1], dw0, dv[bi][1]);
            acc[2] = chain_step(acc[2], d[2], dw1, dv[bi][0]);
            acc[3] = chain_step(acc[3], d[3], dw1, dv[bi][1]);
        }
        __syncwarp();  // every lane has read this stage: it may be refilled
        if (j + QS_STAGES < mine) load(j + QS_STAGES);
        cp_async_commit();
    }
    // The warps' partials, added in warp order (qmma's reduction; the stages are free now).
    cp_async_wait<0>();
    __syncthreads();
    float* red = reinterpret_cast<float*>(qs_smem);  // [warp][16 cols][8 rows]
    red[(warp * 16 + g) * 8 + 2 * tig] = acc[0];
    red[(warp * 16 + g) * 8 + 2 * tig + 1] = acc[1];
    red[(warp * 16 + g + 8) * 8 + 2 * tig] = acc[2];
    red[(warp * 16 + g + 8) * 8 + 2 * tig + 1] = acc[3];
    __syncthreads();
    if (threadIdx.x < 128) {
        const int c = threadIdx.x & 15, r = threadIdx.x >> 4;
        float v = red[c * 8 + r];
#pragma unroll
        for (int ww = 1; ww < QM_WARPS; ww++) v += red[(ww * 16 + c) * 8 + r];
        const int col = col0 + c;
        if (r < m && col < n) y[(size_t)r * n + col] = v;
    }
}
