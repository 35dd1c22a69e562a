// bf16 matmuls on the tensor cores (bf16 mma.sync, f32 accumulators), row-invariant for every
// call size: y [m, n] f32 = x [m, k] f32 . W [n, k]^T with W in bf16 rows (k a multiple of 32,
// rows 16-byte aligned).
//
// bf16_split_rows: x f32 -> hi = bf16(x) and lo = bf16(x - hi), both round-to-nearest-even, so
//   that hi + lo carries x to about 16 significant bits (x - hi is exact in f32). A row's split
//   depends only on that row.
// The chain (tmv_bf16_* for calls of up to 16 rows, tmmk_bf16 / tmmg_bf16 for more: the same bits). The
//   weights are the mma's A operand (16 output columns x 16 k), the activations its B operand
//   (16 k x 8 rows), so a call of up to 8 rows costs one read of the weights and nothing
//   wasted. An output (r, c) is fixed by k alone:
//   - k is cut into steps of 32 values; the first mma of a step takes the values 0 .. 15 of
//     the step, the second 16 .. 31 (the natural order, so that wgmma can read both operands
//     straight from row-major memory and give the same bits: a k16 product's bits depend on
//     which 16 values it sums, not on their slots); lane t (= lane % 4) holds the values
//     4t .. 4t + 3 of each (k-slots 2t, 2t+1, 2t+8, 2t+9; an 8-byte load of the weight row
//     and of the activation row; the tiled kernels read the standard fragments with ldmatrix,
//     values 2t, 2t+1, 2t+8, 2t+9 of each set in those slots: the same sets, so the same bits):
//     A and B use the same slot-to-value map, so the mma's dot product is over the right pairs;
//   - a step is four mmas into the same accumulator, in order: (first half, hi), (first half,
//     lo), (second half, hi), (second half, lo);
//   - the steps are cut into segments of L = min(8, max(1, steps / 8)); partition p (0..7)
//     takes the segments p, p + 8, p + 16, ... in order, with one accumulator from zero;
//   - the eight partitions' accumulators are added in order, partition 0 first.
//   An mma's output element depends only on its own A row and B column (the tensor core sums
//   each element's products alone), so nothing in the chain depends on m, NT or which rows
//   share a launch: a row inside a verify chunk, a batch or a prefill chunk has the bits of the
//   same row computed alone (check-device's `dense_matmul rows` rows assert it).
//   The `_h` kernels (`--bf16-activations bf16`) run the same chain on the hi halves alone: a
//   step is two mmas, (first half, hi), (second half, hi), the activations rounded to bf16 as
//   other bf16 engines carry them; half the products and half the activation traffic, and
//   again the same bits for every call size (every `_h` kernel walks this chain).
#include "common.cuh"
#include "tmma_chain.cuh"

// The split of one value: hi in the low 16 bits, lo in the high 16 (as a pair is packed).
__device__ __forceinline__ uint32_t split1(float v) {
    const __nv_bfloat16 h = __float2bfloat16_rn(v);
    float r = v - __bfloat162float(h);
    if (!isfinite(r)) r = 0.f;  // v infinite or NaN: hi carries it
    return (uint32_t)__bfloat16_as_ushort(h) | ((uint32_t)__bfloat16_as_ushort(__float2bfloat16_rn(r)) << 16);
}

extern "C" __global__ void bf16_split_rows(uint16_t* __restrict__ xh, uint16_t* __restrict__ xl,
                                           const float* __restrict__ x, long long total) {
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= total) return;
    const uint32_t s = split1(x[i]);
    xh[i] = (uint16_t)(s & 0xffffu);
    xl[i] = (uint16_t)(s >> 16);
}

// Eight activations (two float4) split into the B fragments' hi and lo halves: the bits
// bf16_split_rows writes, packed as pairs.
__device__ __forceinline__ void split8(const float4& a, const float4& b, uint4& hi, uint4& lo) {
    const float v[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
    uint32_t h[4], l[4];
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const uint32_t s0 = split1(v[2 * i]), s1 = split1(v[2 * i + 1]);
        h[i] = (s0 & 0xffffu) | (s1 << 16);
        l[i] = (s0 >> 16) | (s1 & 0xffff0000u);
    }
    hi = make_uint4(h[0], h[1], h[2], h[3]);
    lo = make_uint4(l[0], l[1], l[2], l[3]);
}

// Eight activations rounded to bf16 (split8's hi: round to nearest even, infinities and NaN
// kept), packed as pairs.
__device__ __forceinline__ uint4 split8h(const float4& a, const float4& b) {
    const float v[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
    uint32_t h[4];
#pragma unroll
    for (int i = 0; i < 4; i++)
        h[i] = (uint32_t)__bfloat16_as_ushort(__float2bfloat16_rn(v[2 * i])) |
               ((uint32_t)__bfloat16_as_ushort(__float2bfloat16_rn(v[2 * i + 1])) << 16);
    return make_uint4(h[0], h[1], h[2], h[3]);
}

// bf16_hi_rows: x f32 -> bf16(x), bf16_split_rows' hi alone (the `_h` GEMMs' operand).
extern "C" __global__ void bf16_hi_rows(uint16_t* __restrict__ xh, const float* __restrict__ x, long long total) {
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= total) return;
    xh[i] = __bfloat16_as_ushort(__float2bfloat16_rn(x[i]));
}

__device__ __forceinline__ void mma_bf16(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                         uint32_t b0, uint32_t b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// Lane t's eight values of a 32-value step at `step` (bf16 pairs): 4t .. 4t + 3 (the first
// mma's) in .x .y, 16 + 4t .. 16 + 4t + 3 (the second's) in .z .w.
__device__ __forceinline__ uint4 tm_lane(const uint8_t* step, int t) {
    const uint2 a = *reinterpret_cast<const uint2*>(step + 8 * t);
    const uint2 b = *reinterpret_cast<const uint2*>(step + 32 + 8 * t);
    return make_uint4(a.x, a.y, b.x, b.y);
}

// The tiled kernels' staged rows (four 16-byte pieces a row): piece pc of row r is kept at
// pc ^ tm_swz(r), so that the eight rows of one 8 x 8 matrix an ldmatrix reads (16 bytes of
// each) fall in 32 distinct banks.
__device__ __forceinline__ int tm_swz(int r) { return (r >> 1) & 3; }

__device__ __forceinline__ void ldsm_x4(uint32_t (&d)[4], const void* p) {
    const unsigned a = (unsigned)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3])
                 : "r"(a));
}

// A step's A fragments of 16 staged weight rows from c0, both mmas' (tm_step's wa / wb: .x .y
// the first's, .z .w the second's), by two ldmatrix: lane t holds values 2t, 2t + 1, 2t + 8,
// 2t + 9 of each set, the standard fragment of the natural order. The GEMVs' lanes hold
// 4t .. 4t + 3 instead; an mma's bits depend on which 16 values it sums, not on their slots
// (lab/wgmma_bits_lab.cu), so both give the chain's bits.
__device__ __forceinline__ void tm_frag_a(const uint4* rows, int c0, int lane, uint4& wa, uint4& wb) {
    const int r = c0 + (lane & 7) + ((lane >> 3) & 1) * 8, p = lane >> 4;
    uint32_t x[4], y[4];
    ldsm_x4(x, rows + r * 4 + (p ^ tm_swz(r)));
    ldsm_x4(y, rows + r * 4 + ((2 + p) ^ tm_swz(r)));
    wa = make_uint4(x[0], x[2], y[0], y[2]);
    wb = make_uint4(x[1], x[3], y[1], y[3]);
}

// A step's B fragments of 8 staged activation rows from r0 (tm_step's bh / bl), one ldmatrix.
__device__ __forceinline__ uint4 tm_frag_b(const uint4* rows, int r0, int lane) {
    const int r = r0 + (lane & 7), p = lane >> 3;
    uint32_t x[4];
    ldsm_x4(x, rows + r * 4 + (p ^ tm_swz(r)));
    return make_uint4(x[0], x[1], x[2], x[3]);
}

// One step of the chain: wa / wb this lane's eight weights of columns g and g + 8, bh / bl its
// eight activations (hi, lo) of row g of the B tile. LO false: the hi halves alone (bl unused).
template <bool LO = true>
__device__ __forceinline__ void tm_step(float (&d)[4], const uint4& wa, const uint4& wb, const uint4& bh,
                                        const uint4& bl) {
    mma_bf16(d, wa.x, wb.x, wa.y, wb.y, bh.x, bh.y);
    if constexpr (LO) mma_bf16(d, wa.x, wb.x, wa.y, wb.y, bl.x, bl.y);
    mma_bf16(d, wa.z, wb.z, wa.w, wb.w, bh.z, bh.w);
    if constexpr (LO) mma_bf16(d, wa.z, wb.z, wa.w, wb.w, bl.z, bl.w);
}

// tmv_bf16_<NT>_<S> (calls of up to NT = 8 or 16 rows: decode, verify, small batches): one
// thread block per 16 output columns, warp w the chain's partition w. A warp copies each of
// its segments' 16 weight runs (L steps x 64 bytes of each column) into shared memory with
// cp.async, one column's run per copy instruction (whole cache lines), S segments in flight,
// and builds its A fragments from there (runs 544 bytes apart: the four columns a half-warp
// reads with its 8-byte loads fall in disjoint banks). The activations come as f32 from global memory (for one row
// group a segment's worth ahead, beside the weights) and are split into the B fragments' hi
// and lo halves in registers (split8: bf16_split_rows' bits), so no split pass runs first.
#define TV_COL 544                   // bytes per staged column run: 8 steps x 64 + 32 of padding
#define TV_STAGE (16 * TV_COL)       // 8,704 bytes: one segment of 16 columns

// Partition p of the chain for 16 columns from col0 and up to NJ * 8 rows from row0, by one
// warp with S stages of TV_STAGE bytes at `stages`: acc from zero over the segments p, p + 8, ...
template <int NJ, int S, bool LO>
__device__ __forceinline__ void tv_partition(float (&acc)[NJ][4], const float4* __restrict__ x,
                                             const uint8_t* __restrict__ w, uint8_t* stages, int p, int m, int n,
                                             int k, int col0, int row0, int lane) {
    const int g = lane >> 2, t = lane & 3;
    const TmChain ch(k);
    const int steps = ch.steps, L = ch.L, nseg = ch.nseg;
    const int k4 = k >> 2;  // float4 per activation row
    const long long row_bytes = (long long)k * 2;
    // Segment number q of the partition (segments p, p + 8, ...) into stage q % S.
    auto load = [&](int q) {
        const int seg = p + q * TM_WARPS;
        const int s0 = seg * L, ns = min(L, steps - s0);
        const int per = ns * 4;  // 16-byte pieces per column run
        uint8_t* st = stages + (q % S) * TV_STAGE;
        for (int i = lane; i < 16 * per; i += 32) {
            const int c = i / per, pc = i - c * per;
            const int col = min(col0 + c, n - 1);  // columns past n: never written
            cp_async16(st + c * TV_COL + pc * 16, w + (size_t)col * row_bytes + (size_t)s0 * 64 + pc * 16);
        }
    };
    const int mine = nseg > p ? (nseg - p + TM_WARPS - 1) / TM_WARPS : 0;
#pragma unroll
    for (int q = 0; q < S; q++) {
        if (q < mine) load(q);
        cp_async_commit();
    }
    // The weights are in flight; the activations may come from the kernel before this one.
    pdl_wait();
#pragma unroll
    for (int j = 0; j < NJ; j++) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.f;
    for (int q = 0; q < mine; q++) {
        const int s0 = (p + q * TM_WARPS) * L;
        const int ns = min(L, steps - s0);
        // One row group (up to 8 rows): this lane's activations of the whole segment are
        // loaded before the wait on the weights, so both are in flight together.
        float4 xa[NJ == 1 ? TM_MAXL : 1][2];
        if constexpr (NJ == 1) {
            const int rr = row0 + g;
#pragma unroll
            for (int i = 0; i < TM_MAXL; i++) {
                xa[i][0] = xa[i][1] = make_float4(0.f, 0.f, 0.f, 0.f);
                if (i < ns && rr < m) {
                    const float4* xp = x + (size_t)rr * k4 + (size_t)(s0 + i) * 8 + t;
                    xa[i][0] = __ldg(xp);
                    xa[i][1] = __ldg(xp + 4);
                }
            }
        }
        cp_async_wait<S - 1>();
        __syncwarp();
        const uint8_t* st = stages + (q % S) * TV_STAGE;
#pragma unroll
        for (int i = 0; i < TM_MAXL; i++) {
            if (i < ns) {
                const uint4 wa = tm_lane(st + g * TV_COL + i * 64, t);
                const uint4 wb = tm_lane(st + (g + 8) * TV_COL + i * 64, t);
#pragma unroll
                for (int j = 0; j < NJ; j++) {
                    if (row0 + j * 8 < m) {
                        const int rr = row0 + j * 8 + g;
                        float4 a = make_float4(0.f, 0.f, 0.f, 0.f), b = a;
                        if constexpr (NJ == 1) {
                            a = xa[i][0], b = xa[i][1];
                        } else if (rr < m) {
                            const float4* xp = x + (size_t)rr * k4 + (size_t)(s0 + i) * 8 + t;
                            a = __ldg(xp);
                            b = __ldg(xp + 4);
                        }
                        if constexpr (LO) {
                            uint4 bh, bl;
                            split8(a, b, bh, bl);
                            tm_step<true>(acc[j], wa, wb, bh, bl);
                        } else {
                            const uint4 bh = split8h(a, b);
                            tm_step<false>(acc[j], wa, wb, bh, bh);
                        }
                    }
                }
            }
        }
        __syncwarp();  // every lane has read this stage: it may be refilled
        if (q + S < mine) load(q + S);
        cp_async_commit();
    }
    cp_async_wait<0>();
}

template <int NJ, int S, bool LO>
__device__ void tmv_bf16(float* __restrict__ y, const float4* __restrict__ x, const uint8_t* __restrict__ w, int m,
                         int n, int k) {
    constexpr int NT = NJ * 8;
    extern __shared__ __align__(16) uint8_t tv_smem[];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int g = lane >> 2, t = lane & 3;
    const int col0 = blockIdx.x * 16;
    const int row0 = blockIdx.y * NT;
    pdl_trigger();
    float acc[NJ][4];
    tv_partition<NJ, S, LO>(acc, x, w, tv_smem + (size_t)warp * S * TV_STAGE, warp, m, n, k, col0, row0, lane);
    // The warps' partials, added in warp order (the stages are free once every warp is here).
    __syncthreads();
    float* red = reinterpret_cast<float*>(tv_smem);  // [warp][16 columns][NT + 1]
#pragma unroll
    for (int j = 0; j < NJ; j++) {
        const int r0 = j * 8 + t * 2;
        red[(warp * 16 + g) * (NT + 1) + r0] = acc[j][0];
        red[(warp * 16 + g) * (NT + 1) + r0 + 1] = acc[j][1];
        red[(warp * 16 + g + 8) * (NT + 1) + r0] = acc[j][2];
        red[(warp * 16 + g + 8) * (NT + 1) + r0 + 1] = acc[j][3];
    }
    __syncthreads();
    for (int i = threadIdx.x; i < 16 * NT; i += blockDim.x) {
        const int c = i & 15, r = i >> 4;
        float v = red[c * (NT + 1) + r];
#pragma unroll
        for (int ww = 1; ww < TM_WARPS; ww++) v += red[(ww * 16 + c) * (NT + 1) + r];
        const int row = row0 + r, col = col0 + c;
        if (row < m && col < n) y[(size_t)row * n + col] = v;
    }
}

// Dynamic shared memory: TM_WARPS * S * TV_STAGE bytes (69,632 for S = 1, 139,264 for S = 2).
// SUF empty: the hi + lo chain (LO true); `_h`: the hi halves alone.
#define TMV(NT, S, SUF, LO)                                                                                   \
    extern "C" __global__ void __launch_bounds__(TM_WARPS * 32)                                              \
        tmv_bf16_##NT##_##S##SUF(float* y, const float4* x, const uint8_t* w, int m, int n, int k) {         \
        tmv_bf16<NT / 8, S, LO>(y, x, w, m, n, k);                                                           \
    }

TMV(8, 1, , true)
TMV(16, 1, , true)
TMV(8, 2, , true)
TMV(16, 2, , true)
TMV(8, 1, _h, false)
TMV(16, 1, _h, false)
TMV(8, 2, _h, false)
TMV(16, 2, _h, false)

// tmmg_bf16 (calls of many rows: prefill, batches past 128 rows or on wide matrices; tmmk_bf16
// below takes the others; on Hopper tmma_wg.cu's tmmw_bf16 takes tmmg's calls): the same chain on a block tile of
// 128 rows x 64 columns, the weights and both activation halves of a step staged in shared
// memory by cp.async (two stages), eight warps of 32 rows x 32 columns each. A warp walks the
// steps partition by partition (partition p: segments p, p + 8, ..., each in order) with one
// accumulator from zero per partition, and adds the partitions' accumulators in order into its
// total (the eight partitions always, empty ones as +0): the GEMV's warps and their sum in warp
// order, so the same bits.
#define TG_BM 128
#define TG_BN 64
#define TG_PIECES 4  // 16-byte pieces of a 32-value bf16 step

// A 16-byte copy that zero-fills when `valid` is false (the source is then not read).
__device__ __forceinline__ void cp_async16_zfill(void* smem, const void* gmem, bool valid) {
    const unsigned s = (unsigned)__cvta_generic_to_shared(smem);
    const int n = valid ? 16 : 0;
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(gmem), "r"(n) : "memory");
}

// One step of a tmmg warp (32 rows x 32 columns) from staged weights ws, hi hs and lo ls
// (LO false: hs alone).
template <bool LO>
__device__ __forceinline__ void tg_step(float (&acc)[2][4][4], const uint4* ws, const uint4* hs, const uint4* ls,
                                        int wn, int wm, int lane) {
    uint4 wa[2], wb[2];
#pragma unroll
    for (int a = 0; a < 2; a++) tm_frag_a(ws, wn * 32 + a * 16, lane, wa[a], wb[a]);
#pragma unroll
    for (int j = 0; j < 4; j++) {
        const int r0 = wm * 32 + j * 8;
        const uint4 bh = tm_frag_b(hs, r0, lane), bl = LO ? tm_frag_b(ls, r0, lane) : bh;
#pragma unroll
        for (int a = 0; a < 2; a++) tm_step<LO>(acc[a][j], wa[a], wb[a], bh, bl);
    }
}

// Partition p's accumulator into the total (p = 0: the total is it; empty partitions add
// +0 too), then from zero.
__device__ __forceinline__ void tg_fold(float (&acc)[2][4][4], float (&tot)[2][4][4], int p) {
#pragma unroll
    for (int a = 0; a < 2; a++)
#pragma unroll
        for (int j = 0; j < 4; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                tot[a][j][e] = p == 0 ? acc[a][j][e] : tot[a][j][e] + acc[a][j][e];
                acc[a][j][e] = 0.f;
            }
}

// A warp's outputs (WA groups of 16 columns x WJ groups of 8 rows) into y.
template <int WA, int WJ>
__device__ __forceinline__ void tg_store(float* __restrict__ y, const float (&tot)[WA][WJ][4], int row0, int col0,
                                         int wn, int wm, int g, int t, int m, int n) {
#pragma unroll
    for (int a = 0; a < WA; a++) {
#pragma unroll
        for (int j = 0; j < WJ; j++) {
            const int c = col0 + wn * WA * 16 + a * 16 + g;
            const int r = row0 + wm * WJ * 8 + j * 8 + 2 * t;
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int col = c + (e >> 1) * 8, row = r + (e & 1);
                if (row < m && col < n) y[(size_t)row * n + col] = tot[a][j][e];
            }
        }
    }
}

template <bool LO>
__device__ __forceinline__ void tmmg(float* __restrict__ y, const uint4* __restrict__ xh,
                                     const uint4* __restrict__ xl, const uint4* __restrict__ w, int m, int n, int k) {
    __shared__ __align__(16) uint4 ws[2][TG_BN * TG_PIECES];
    __shared__ __align__(16) uint4 hs[2][TG_BM * TG_PIECES];
    __shared__ __align__(16) uint4 ls[2][LO ? TG_BM * TG_PIECES : 1];
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int g = lane >> 2, t = lane & 3;
    const int wn = warp & 1, wm = warp >> 1;
    const int row0 = blockIdx.x * TG_BM, col0 = blockIdx.y * TG_BN;
    const bool live = row0 + wm * 32 < m;
    const TmChain ch(k);
    const int steps = ch.steps, L = ch.L, nseg = ch.nseg, k8 = k >> 3;

    auto load = [&](int s, int st) {
        {  // weights: one piece a thread
            const int c = tid >> 2, pc = tid & 3;
            const int col = col0 + c;
            const bool ok = col < n;
            cp_async16_zfill(&ws[st][c * 4 + (pc ^ tm_swz(c))], w + (size_t)(ok ? col : 0) * k8 + (size_t)s * 4 + pc,
                             ok);
        }
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const int idx = tid + h * 256;
            const int r = idx >> 2, pc = idx & 3;
            const int row = row0 + r;
            const bool ok = row < m;
            const size_t off = (size_t)(ok ? row : 0) * k8 + (size_t)s * 4 + pc;
            const int at = r * 4 + (pc ^ tm_swz(r));
            cp_async16_zfill(&hs[st][at], xh + off, ok);
            if constexpr (LO) cp_async16_zfill(&ls[st][at], xl + off, ok);
        }
    };

    float acc[2][4][4], tot[2][4][4];
#pragma unroll
    for (int a = 0; a < 2; a++)
#pragma unroll
        for (int j = 0; j < 4; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) acc[a][j][e] = 0.f, tot[a][j][e] = 0.f;

    TgSteps li;
    li.start(L, nseg, steps);
    if (!li.done()) {
        load(li.step(), 0);
        li.next();
    }
    cp_async_commit();
    int st = 0;
    for (int p = 0; p < TM_WARPS; p++) {
        for (int seg = p; seg < nseg; seg += TM_WARPS) {
            const int ns = min(L, steps - seg * L);
            for (int i = 0; i < ns; i++) {
                if (!li.done()) {
                    load(li.step(), st ^ 1);
                    li.next();
                }
                cp_async_commit();
                cp_async_wait<1>();
                __syncthreads();
                // A warp whose 32 rows all lie past m (a batch of fewer than 128 rows)
                // skips its products: only rows >= m, never stored, would change.
                if (live) tg_step<LO>(acc, ws[st], hs[st], ls[st], wn, wm, lane);
                __syncthreads();
                st ^= 1;
            }
        }
        tg_fold(acc, tot, p);
    }
    tg_store(y, tot, row0, col0, wn, wm, g, t, m, n);
}

extern "C" __global__ void __launch_bounds__(256, 1)
    tmmg_bf16(float* __restrict__ y, const uint4* __restrict__ xh, const uint4* __restrict__ xl,
              const uint4* __restrict__ w, int m, int n, int k) {
    tmmg<true>(y, xh, xl, w, m, n, k);
}

// The hi halves alone (bf16_hi_rows' operand).
extern "C" __global__ void __launch_bounds__(256, 1)
    tmmg_bf16_h(float* __restrict__ y, const uint4* __restrict__ xh, const uint4* __restrict__ w, int m, int n,
                int k) {
    tmmg<false>(y, xh, xh, w, m, n, k);
}

// tmm_tile<ST, WA, WJ, WM, WN, SPLIT>: tmmg_bf16's chain on other tiles: a block of WM x WN
// warps, warp (wm, wn) taking WJ groups of 8 rows and WA groups of 16 columns (block tile
// WM WJ 8 rows x WN WA 16 columns); ST stages of one 32-value step (weights, hi, lo) in
// flight, one barrier a step: wait for step i, barrier, refill the stage step i - 1 used, run
// step i. Every output sees the same mma sequence with the same operands as in tmmg_bf16.
// SPLIT: block z runs partition z alone and leaves its accumulator in y + z m n (empty
// partitions leave +0); tmmk_sum then adds the eight in order, as tmmg_bf16's fold does, so
// the bits are the same. A batch of 17-128 rows fills the GPU this way: at 64 rows
// tmmg_bf16's 128-row tile idles half its warps and a 4,096-column matrix makes 64 blocks.
// Dynamic shared memory: ST (WN WA 16 + 2 WM WJ 8) 64 bytes.
template <int ST, int WA, int WJ, int WM, int WN, bool SPLIT, bool LO = true>
__device__ void tmm_tile(float* __restrict__ y, const uint4* __restrict__ xh, const uint4* __restrict__ xl,
                         const uint4* __restrict__ w, int m, int n, int k) {
    constexpr int BR = WM * WJ * 8, BC = WN * WA * 16;
    constexpr int SW = BC * TG_PIECES, SX = BR * TG_PIECES, STAGE = SW + (LO ? 2 : 1) * SX;  // uint4 a stage
    extern __shared__ __align__(16) uint4 tt_smem[];
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int g = lane >> 2, t = lane & 3;
    const int wn = warp % WN, wm = warp / WN;
    const int row0 = blockIdx.x * BR, col0 = blockIdx.y * BC;
    const bool live = row0 + wm * WJ * 8 < m;
    const TmChain ch(k);
    const int steps = ch.steps, L = ch.L, nseg = ch.nseg, k8 = k >> 3;
    const int p0 = SPLIT ? blockIdx.z : 0, pe = SPLIT ? p0 + 1 : TM_WARPS;
    if (SPLIT) y += (size_t)p0 * m * n;

    auto load = [&](int s, int st) {
        uint4* ws = tt_smem + st * STAGE;
        uint4* hs = ws + SW;
        uint4* ls = hs + SX;
        for (int idx = tid; idx < SW; idx += WM * WN * 32) {
            const int c = idx >> 2, pc = idx & 3, col = col0 + c;
            const bool ok = col < n;
            cp_async16_zfill(&ws[c * 4 + (pc ^ tm_swz(c))], w + (size_t)(ok ? col : 0) * k8 + (size_t)s * 4 + pc, ok);
        }
        for (int idx = tid; idx < SX; idx += WM * WN * 32) {
            const int r = idx >> 2, pc = idx & 3, row = row0 + r;
            const bool ok = row < m;
            const size_t off = (size_t)(ok ? row : 0) * k8 + (size_t)s * 4 + pc;
            const int at = r * 4 + (pc ^ tm_swz(r));
            cp_async16_zfill(&hs[at], xh + off, ok);
            if constexpr (LO) cp_async16_zfill(&ls[at], xl + off, ok);
        }
    };

    float acc[WA][WJ][4], tot[WA][WJ][4];
#pragma unroll
    for (int a = 0; a < WA; a++)
#pragma unroll
        for (int j = 0; j < WJ; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) acc[a][j][e] = 0.f, tot[a][j][e] = 0.f;

    TgSteps li;
    li.start_at(L, nseg, steps, p0, pe);
#pragma unroll
    for (int d = 0; d < ST - 1; d++) {
        if (!li.done()) {
            load(li.step(), d);
            li.next();
        }
        cp_async_commit();
    }
    int st = 0;
    for (int p = p0; p < pe; p++) {
        for (int seg = p; seg < nseg; seg += TM_WARPS) {
            const int ns = min(L, steps - seg * L);
            for (int i = 0; i < ns; i++) {
                cp_async_wait<ST - 2>();
                __syncthreads();
                if (!li.done()) {
                    load(li.step(), (st + ST - 1) % ST);
                    li.next();
                }
                cp_async_commit();
                if (live) {
                    const uint4* ws = tt_smem + st * STAGE;
                    const uint4* hs = ws + SW;
                    const uint4* ls = hs + SX;
                    uint4 wa[WA], wb[WA];
#pragma unroll
                    for (int a = 0; a < WA; a++) tm_frag_a(ws, wn * WA * 16 + a * 16, lane, wa[a], wb[a]);
#pragma unroll
                    for (int j = 0; j < WJ; j++) {
                        const int r0 = wm * WJ * 8 + j * 8;
                        const uint4 bh = tm_frag_b(hs, r0, lane), bl = LO ? tm_frag_b(ls, r0, lane) : bh;
#pragma unroll
                        for (int a = 0; a < WA; a++) tm_step<LO>(acc[a][j], wa[a], wb[a], bh, bl);
                    }
                }
                st = (st + 1) % ST;
            }
        }
#pragma unroll
        for (int a = 0; a < WA; a++)
#pragma unroll
            for (int j = 0; j < WJ; j++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    tot[a][j][e] = p == p0 ? acc[a][j][e] : tot[a][j][e] + acc[a][j][e];
                    acc[a][j][e] = 0.f;
                }
    }
    cp_async_wait<0>();
    tg_store<WA, WJ>(y, tot, row0, col0, wn, wm, g, t, m, n);
}

// tmmk_bf16 (calls of 17-128 rows on matrices of up to TANDEM_BF16_SPLIT_COLS columns): a
// block of 64 rows x 64 columns (eight warps of 16 x 32) runs one partition of the chain
// (grid z = 8) into part [8][m][n]; tmmk_sum adds them. 36,864 bytes of dynamic shared memory.
extern "C" __global__ void __launch_bounds__(256, 2)
    tmmk_bf16(float* __restrict__ part, const uint4* __restrict__ xh, const uint4* __restrict__ xl,
              const uint4* __restrict__ w, int m, int n, int k) {
    tmm_tile<3, 2, 2, 4, 2, true>(part, xh, xl, w, m, n, k);
}

// The hi halves alone: 24,576 bytes of dynamic shared memory.
extern "C" __global__ void __launch_bounds__(256, 2)
    tmmk_bf16_h(float* __restrict__ part, const uint4* __restrict__ xh, const uint4* __restrict__ w, int m, int n,
                int k) {
    tmm_tile<3, 2, 2, 4, 2, true, false>(part, xh, xh, w, m, n, k);
}

// y = the eight partitions' accumulators added in order (partition 0 first; tmmg_bf16's fold).
extern "C" __global__ void tmmk_sum(float* __restrict__ y, const float* __restrict__ part, long long mn) {
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= mn) return;
    float v = part[i];
#pragma unroll
    for (int p = 1; p < TM_WARPS; p++) v = v + part[(size_t)p * mn + i];
    y[i] = v;
}
