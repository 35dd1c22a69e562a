// Paged attention over f16 pools on the tensor cores (included by paged_attention.cu, which
// defines WARPS, SPLIT and the batch helpers; the launchers pick these kernels for f16 caches
// with head dims 64, 128 and 256).
//
// The grid is the scalar kernels': a block takes one 256-key segment (SPLIT) of one KV head for
// U = 8 (query row, query head) units (the heads of the GQA group first, then rows), and writes
// normalised rows or per-segment partials in the same format, merged by the same kernels. A
// segment is 16 tiles of 16 keys; warp w takes the tiles w, w + 4, w + 8, w + 12 (by position,
// never by which units share the block), copies each tile's key and value rows into shared
// memory (cp.async, two tiles in flight) and per tile:
//   S^T = K Q^T       (16 keys x 8 units; mma m16n8k16, K rows by ldmatrix as A, the units'
//                      queries as B, each query split into f16 hi + lo: ~22 significant bits)
//   online softmax    (per unit: the tile's max, rescale, exp; a unit's sums over its keys in
//                      a fixed butterfly order)
//   O^T += V^T P^T    (dims x 8 units; V rows by ldmatrix.trans as A, the probabilities split
//                      into f16 hi + lo and moved to B fragments by movmatrix)
// then the four warps' states are merged in warp order. For prefill and verify chunks with
// 256-dim heads a block takes UG = 4 such unit groups (16 warps, the `_g4` kernel): the four warps of a key phase
// (one per group) share that phase's tiles in shared memory, so each key row is read once for
// 32 units instead of 8, and every warp does exactly what it would in a one-group block (the
// same bits). Every value a unit's output depends on
// (its query, its keys and values, its position) fixes its arithmetic: a tensor-core product's
// column depends only on that column's operands, keys a unit cannot see enter with weight 0,
// and a tile none of its keys fall in leaves its state exactly as it was. So a row decoded
// alone, in a verify chunk or in a prefill chunk gets the same bits (check-device's
// `paged_attention rows` and `attention batch` rows).
#pragma once

#define MMA_U 8    // units (query row, query head) a block
#define MMA_KT 16  // keys a tile

__device__ __forceinline__ void mma_f16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
// The 8 x 8 matrix of 16-bit values whose row lane / 4, columns 2 (lane % 4) .. + 1 this lane
// holds, transposed across the warp (the lane gets row lane / 4 of the transpose).
__device__ __forceinline__ uint32_t mov_t(uint32_t x) {
    uint32_t y;
    asm volatile("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;\n" : "=r"(y) : "r"(x));
    return y;
}
__device__ __forceinline__ void ldsm_x4_t(uint32_t (&r)[4], uint32_t a) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a)
                 : "memory");
}
__device__ __forceinline__ uint32_t h2_bits(__half2 h) { return *reinterpret_cast<uint32_t*>(&h); }

// Shared memory of attend_mma<HD, UG> in bytes: the units' queries (hi, lo) and two tiles of key
// and value rows a warp, rows padded by 16 bytes (ldmatrix's eight rows in distinct banks).
// `paged_attention::cuda::mma_shared_bytes` computes the same.
template <int HD, int UG>
struct MmaLayout {
    static constexpr int RS = HD + 8;                // halves a row
    static constexpr int STAGE = 2 * MMA_KT * RS;    // halves: a tile's key rows, then its value rows
    static constexpr int Q = UG * 2 * MMA_U * RS;    // halves: per group hi rows, then lo rows
    static constexpr int BYTES = (Q + WARPS * 2 * STAGE) * 2;
};
// The warps of key phase w (one per unit group) wait for each other: bar.sync 1 + w over their
// 32 UG threads; a lone warp needs only __syncwarp.
template <int UG>
__device__ __forceinline__ void phase_sync(int w) {
    if constexpr (UG == 1) {
        __syncwarp();
    } else {
        asm volatile("bar.sync %0, %1;" ::"r"(1 + w), "r"(32 * UG) : "memory");
    }
}

template <int HD, int UG>
__device__ void attend_mma(float* __restrict__ out, float* __restrict__ part, const float* __restrict__ q,
                           const __half* __restrict__ kp, const __half* __restrict__ vp,
                           const uint32_t* __restrict__ blocks, int nh, int nkv, int t, int past, int bs, float scale,
                           int window, int tile, int sp, int nsplit, int qrows, int pstride) {
    typedef MmaLayout<HD, UG> Lay;
    constexpr int U = MMA_U, RS = Lay::RS, PR = HD / 8;  // PR: 16-byte pieces a row
    extern __shared__ __align__(16) uint8_t pa_smem[];
    __half* qs0 = reinterpret_cast<__half*>(pa_smem);  // [UG][2][U][RS]
    __half* st = qs0 + Lay::Q;                          // [WARPS][2][STAGE]
    const int G = nh / nkv;
    const int Gb = min(G, U), R = U / Gb, head_tiles = (G + Gb - 1) / Gb;
    const int r0 = (tile / head_tiles) * R * UG, hg0 = (tile % head_tiles) * Gb;
    const int kvh = blockIdx.y;
    // Warp wi: key phase warp = wi / UG of unit group ug = wi % UG (rows r0 + ug R ..).
    const int wi = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int warp = wi / UG, ug = wi % UG;
    __half* qs = qs0 + ug * 2 * U * RS;
    const int g = lane >> 2, tq = lane & 3;
    const int start = sp * SPLIT;
    // Unit u of group gr: head hg0 + u % Gb, row r0 + gr R + u / Gb; len 0 when it is not one.
    auto unit_len_of = [&](int gr, int u) {
        const int hg = hg0 + u % Gb, qi = r0 + gr * R + u / Gb;
        return u < R * Gb && hg < G && qi < t ? past + qi + 1 : 0;
    };
    auto unit_len = [&](int u) { return unit_len_of(ug, u); };
    // The keys any unit of the block sees in this segment: [start_min, end_max).
    int end_max = start, start_min = start + SPLIT;
#pragma unroll
    for (int uu = 0; uu < UG * U; uu++) {
        const int len = unit_len_of(uu / U, uu % U);
        if (len > 0) {
            end_max = max(end_max, min(len, start + SPLIT));
            start_min = min(start_min, max(start, window > 0 ? max(0, len - window) : 0));
        }
    }
    // This lane's two units (the S^T / O^T columns 2 tq, 2 tq + 1): keys [lo, hi).
    int klo[2], khi[2];
#pragma unroll
    for (int c = 0; c < 2; c++) {
        khi[c] = unit_len(2 * tq + c);
        klo[c] = window > 0 ? max(0, khi[c] - window) : 0;
    }
    for (int i = threadIdx.x; i < UG * U * HD; i += blockDim.x) {
        const int gr = i / (U * HD), u = (i / HD) % U, d = i % HD;
        float x = 0.f;
        if (unit_len_of(gr, u) > 0) x = q[((size_t)(kvh * G + hg0 + u % Gb) * qrows + r0 + gr * R + u / Gb) * HD + d];
        const __half h = __float2half_rn(x);
        __half* qg = qs0 + gr * 2 * U * RS;
        qg[u * RS + d] = h;
        qg[(U + u) * RS + d] = __float2half_rn(x - __half2float(h));
    }
    __syncthreads();

    float o[HD / 16][4];
#pragma unroll
    for (int mt = 0; mt < HD / 16; mt++) o[mt][0] = o[mt][1] = o[mt][2] = o[mt][3] = 0.f;
    float m2[2] = {-INFINITY, -INFINITY}, l2[2] = {0.f, 0.f};
    __half* mine = st + warp * 2 * Lay::STAGE;
    // Tile jj of the segment into stage s, by the UG warps of this phase together: rows clamped
    // into [start_min, end_max) (always written rows; the keys outside a unit's range count for
    // nothing).
    auto load = [&](int jj, int s) {
        const int kb = start + jj * MMA_KT;
        uint32_t row = 0;
        if (lane < MMA_KT) {
            const int key = min(max(kb + lane, start_min), end_max - 1);
            row = blocks[key / bs] * (uint32_t)bs + (uint32_t)(key % bs);
        }
        __half* dst = mine + s * Lay::STAGE;
        for (int i = ug * 32 + lane; i < 2 * MMA_KT * PR; i += 32 * UG) {
            const int which = i / (MMA_KT * PR), r = (i / PR) % MMA_KT, c = i % PR;
            const uint32_t pr = __shfl_sync(0xffffffffu, row, r);
            const __half* src = (which ? vp : kp) + ((size_t)pr * nkv + kvh) * HD + c * 8;
            cp_async16(dst + (which * MMA_KT + r) * RS + c * 8, src);
        }
    };
    const int jt0 = (start_min - start) / MMA_KT;
    const int jt1 = end_max > start_min ? (end_max - start + MMA_KT - 1) / MMA_KT : jt0;
    int j = jt0 + ((warp - jt0 % WARPS) + WARPS) % WARPS;  // the first of this warp's tiles
    if (j < jt1) load(j, 0);
    cp_async_commit();
    const uint32_t qaddr = smem_addr(qs + ((lane >> 4) * U + (lane & 7)) * RS + ((lane >> 3) & 1) * 8);
    for (int s = 0; j < jt1; j += WARPS, s ^= 1) {
        if (j + WARPS < jt1) load(j + WARPS, s ^ 1);
        cp_async_commit();
        cp_async_wait<1>();
        phase_sync<UG>(warp);
        const __half* ks = mine + s * Lay::STAGE;
        const __half* vs = ks + MMA_KT * RS;
        // S^T: rows keys g / g + 8 of the tile, columns units 2 tq, 2 tq + 1.
        float sc[4] = {0.f, 0.f, 0.f, 0.f};
        const uint32_t kaddr = smem_addr(ks + ((lane & 7) + ((lane >> 3) & 1) * 8) * RS + (lane >> 4) * 8);
#pragma unroll
        for (int kk = 0; kk < HD / 16; kk++) {
            uint32_t a[4], b[4];
            ldsm_x4(a, kaddr + kk * 32);
            ldsm_x4(b, qaddr + kk * 32);  // hi (dims kk*16.., +8), lo (the same)
            mma_f16(sc, a, b[0], b[1]);
            mma_f16(sc, a, b[2], b[3]);
        }
        const int kb = start + j * MMA_KT;
        float x[4];
        bool ok[4];
#pragma unroll
        for (int e = 0; e < 4; e++) {
            const int key = kb + g + (e >> 1) * 8, c = e & 1;
            ok[e] = key >= klo[c] && key < khi[c];
            x[e] = ok[e] ? sc[e] * scale : -INFINITY;
        }
        float mn[2], cc[2];
#pragma unroll
        for (int c = 0; c < 2; c++) {
            float mx = fmaxf(x[c], x[c + 2]);
#pragma unroll
            for (int off = 4; off < 32; off <<= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, off));
            mn[c] = fmaxf(m2[c], mx);
            cc[c] = mn[c] == -INFINITY ? 1.f : expf(m2[c] - mn[c]);
        }
        float p[4];
#pragma unroll
        for (int e = 0; e < 4; e++) p[e] = ok[e] ? expf(x[e] - mn[e & 1]) : 0.f;
#pragma unroll
        for (int c = 0; c < 2; c++) {
            float ps = p[c] + p[c + 2];
#pragma unroll
            for (int off = 4; off < 32; off <<= 1) ps += __shfl_xor_sync(0xffffffffu, ps, off);
            l2[c] = l2[c] * cc[c] + ps;
            m2[c] = mn[c];
        }
#pragma unroll
        for (int mt = 0; mt < HD / 16; mt++) {
            o[mt][0] *= cc[0];
            o[mt][1] *= cc[1];
            o[mt][2] *= cc[0];
            o[mt][3] *= cc[1];
        }
        // P^T (keys x units) as f16 hi + lo, moved to the B fragments of O^T += V^T P^T.
        const __half2 h01 = __floats2half2_rn(p[0], p[1]), h23 = __floats2half2_rn(p[2], p[3]);
        const __half2 l01 = __floats2half2_rn(p[0] - __low2float(h01), p[1] - __high2float(h01));
        const __half2 l23 = __floats2half2_rn(p[2] - __low2float(h23), p[3] - __high2float(h23));
        const uint32_t bh0 = mov_t(h2_bits(h01)), bh1 = mov_t(h2_bits(h23));
        const uint32_t bl0 = mov_t(h2_bits(l01)), bl1 = mov_t(h2_bits(l23));
        const uint32_t vaddr = smem_addr(vs + ((lane & 7) + (lane >> 4) * 8) * RS + ((lane >> 3) & 1) * 8);
#pragma unroll
        for (int mt = 0; mt < HD / 16; mt++) {
            uint32_t a[4];
            ldsm_x4_t(a, vaddr + mt * 32);
            mma_f16(o[mt], a, bh0, bh1);
            mma_f16(o[mt], a, bl0, bl1);
        }
        phase_sync<UG>(warp);  // every lane of the phase has read this stage: it may be refilled
    }
    cp_async_wait<0>();
    __syncthreads();  // the stages are free: the warps' states go there
    // Group ug's states at [ug][WARPS][U][HD] (and [ug][WARPS][U] for m and l).
    float* sacc = reinterpret_cast<float*>(st) + ug * WARPS * U * HD;
    float* smx = reinterpret_cast<float*>(st) + UG * WARPS * U * HD + ug * WARPS * U;
    float* slx = smx + UG * WARPS * U;
    if (g == 0) {
#pragma unroll
        for (int c = 0; c < 2; c++) {
            smx[warp * U + 2 * tq + c] = m2[c];
            slx[warp * U + 2 * tq + c] = l2[c];
        }
    }
#pragma unroll
    for (int mt = 0; mt < HD / 16; mt++) {
        float* a0 = sacc + (size_t)(warp * U + 2 * tq) * HD + mt * 16 + g;
        a0[0] = o[mt][0];
        a0[HD] = o[mt][1];
        a0[8] = o[mt][2];
        a0[HD + 8] = o[mt][3];
    }
    __syncthreads();
    for (int uu = 0; uu < UG * U; uu++) {
        const int gr = uu / U, u = uu % U;
        if (unit_len_of(gr, u) == 0) continue;
        const int h = kvh * G + hg0 + u % Gb, qi = r0 + gr * R + u / Gb;
        const float* sacc = reinterpret_cast<const float*>(st) + gr * WARPS * U * HD;
        const float* smx = reinterpret_cast<const float*>(st) + UG * WARPS * U * HD + gr * WARPS * U;
        const float* slx = smx + UG * WARPS * U;
        float gm = -INFINITY;
        for (int w = 0; w < WARPS; w++) gm = fmaxf(gm, smx[w * U + u]);
        float gl = 0.f;
        for (int w = 0; w < WARPS; w++) {
            const float mw = smx[w * U + u];
            gl += mw == -INFINITY ? 0.f : slx[w * U + u] * expf(mw - gm);
        }
        float* prow = nsplit > 1 ? part + (((size_t)qi * nh + h) * pstride + sp) * (HD + 2) : nullptr;
        float* orow = out + ((size_t)h * qrows + qi) * HD;
        for (int d = threadIdx.x; d < HD; d += blockDim.x) {
            float a = 0.f;
            for (int w = 0; w < WARPS; w++) {
                const float mw = smx[w * U + u];
                a += mw == -INFINITY ? 0.f : sacc[(size_t)(w * U + u) * HD + d] * expf(mw - gm);
            }
            if (prow) {
                prow[d] = a;
            } else {
                orow[d] = a / gl;
            }
        }
        if (prow && threadIdx.x == 0) {
            prow[HD] = gm;
            prow[HD + 1] = gl;
        }
    }
}

// paged_attention_f16mma_d<HD> (one sequence) and its _batch form, with the scalar kernels'
// arguments (hd must be HD) and grids (tiles of UG x 8 units: R rows of a group times UG), 128
// UG threads; dynamic shared memory MmaLayout<HD, UG>::BYTES. The _g4 kernels (UG = 4) give
// every row the bits of the one-group kernels.
#define PAGED_MMA(name, HD, UG)                                                                               \
    extern "C" __global__ void __launch_bounds__(WARPS * 32 * UG)                                             \
        name(float* out, float* part, const float* q, const __half* kp, const __half* vp,                     \
             const uint32_t* blocks, int nh, int nkv, int t, int hd, int past, int bs, float scale,           \
             int window) {                                                                                    \
        attend_mma<HD, UG>(out, part, q, kp, vp, blocks, nh, nkv, t, past, bs, scale, window, blockIdx.x,      \
                           blockIdx.z, gridDim.z, t, gridDim.z);                                              \
    }                                                                                                         \
    extern "C" __global__ void __launch_bounds__(WARPS * 32 * UG)                                             \
        name##_batch(float* out, float* part, const float* q, const __half* kp, const __half* vp,             \
                     const uint32_t* tables, const int* meta, int nh, int nkv, int hd, int bs, int total,     \
                     int pstride, float scale, int window) {                                                  \
        int off, t, past, toff;                                                                               \
        batch_seq(meta, blockIdx.z / pstride, &off, &t, &past, &toff);                                        \
        const int sp = blockIdx.z % pstride, nsplit = (past + t + SPLIT - 1) / SPLIT;                         \
        const int G = nh / nkv, Gb = min(G, MMA_U), rows = MMA_U / Gb * UG;                                   \
        const int tiles = (t + rows - 1) / rows * ((G + Gb - 1) / Gb);                                        \
        if ((int)blockIdx.x >= tiles || sp >= nsplit) return;                                                 \
        attend_mma<HD, UG>(out + (size_t)off * HD, part + (size_t)off * nh * pstride * (HD + 2),              \
                           q + (size_t)off * HD, kp, vp, tables + toff, nh, nkv, t, past, bs, scale, window,  \
                           blockIdx.x, sp, nsplit, total, pstride);                                           \
    }
PAGED_MMA(paged_attention_f16mma_d64, 64, 1)
PAGED_MMA(paged_attention_f16mma_d128, 128, 1)
PAGED_MMA(paged_attention_f16mma_d256, 256, 1)
// Four groups for 256-dim heads only: there one group's 143.6 KB of shared memory leaves a
// single four-warp block an SM, and four groups (16 warps, 169 KB) prefilled the 9B shape 1.19x
// at 4K of context and 1.46x at 16K on an H100; with 128-dim heads (three one-group blocks an
// SM already) they measured 0.80-0.84x (PERFORMANCE.md, 2026-12-06).
PAGED_MMA(paged_attention_f16mma_g4_d256, 256, 4)
