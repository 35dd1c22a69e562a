// Causal GQA attention over a paged KV pool.
//
// q: [nh, t, hd] f32 (rows past .. past + t - 1 of the sequence), pools [rows, nkv, hd] in T
// (f32, f16, bf16) or [rows, nkv, row_bytes] of ggml q8_0 / q4_0 blocks (kv_quant.cuh),
// blocks: the sequence's block table (position p is pool row blocks[p / bs] * bs + p % bs),
// out: [nh, t, hd] f32. Query row i sees positions 0 ..= past + i, or with a sliding window
// > 0 only the last `window` of them (past + i + 1 - window ..= past + i).
//
// Split-KV: a row's keys are cut into segments of SPLIT positions (fixed boundaries). A thread
// block takes one segment of one KV head for U (query row, query head) units that read it:
// Gb heads of the head's GQA group times U / Gb consecutive rows (Gb = min(group, U), U * NR
// = 32, fixed by hd and the group size, never by t). Each key and value row is read once per
// block for all its units. In a block each warp walks the segment's keys j = start + warp,
// start + warp + W, ... keeping per unit an online softmax (max, normaliser, weighted sum of
// values, lane l owning the NR dims l NR .. l NR + NR - 1, read with one vector load where the
// row allows), then the W warps' states are merged in warp order. A warp reads the rows of P
// keys of its walk at once (their block-table entries first, then every key and value row, all
// loads in flight together; the next batch's rows prefetched into L2 meanwhile), scores them
// unit by unit (the P dot products and their warp sums side by side) and folds them in in
// walk order: a segment's time is a few memory latencies, not one per key, and a lone warp per
// scheduler (decode) no longer waits on one score's shuffles at a time.
// With one segment in the call the block writes the normalised rows; otherwise it writes each
// unit's (max, normaliser, sums) and paged_attention_merge combines a row's segments in order.
// A unit's arithmetic depends only on its own query, its keys and hd (its length fixes its
// segments), never on t, the grid or the other units of its block: a row in a verify chunk or
// a prefill chunk has the bits of the same row decoded alone, and long contexts spread over
// many multiprocessors.
#include "common.cuh"
#include "kv_quant.cuh"

#define WARPS 4  // warps a block (the launchers' THREADS = WARPS * 32)
#define SPLIT 256

// Element d of one head row of a pool, as f32.
// run<NR>(row, d0, hd, out): elements d0 .. d0 + NR - 1 of a row as f32 (0 past hd).
template <typename T>
struct Plain {
    typedef T elem;
    static constexpr int KEYS = 8;  // most keys a warp reads at once
    static __device__ __forceinline__ size_t row_elems(int hd) { return hd; }
    template <int NR>
    static __device__ __forceinline__ void run(const T* row, int d0, int hd, float* out) {
        constexpr int B = NR * (int)sizeof(T);
        constexpr int A = B >= 16 ? 16 : B;
        const T* p = row + d0;
        if ((B == 4 || B == 8 || B % 16 == 0) && d0 + NR <= hd && reinterpret_cast<uintptr_t>(p) % A == 0) {
            alignas(16) T v[NR];
            if constexpr (B % 16 == 0) {
#pragma unroll
                for (int i = 0; i < B / 16; i++) reinterpret_cast<uint4*>(v)[i] = reinterpret_cast<const uint4*>(p)[i];
            } else if constexpr (B == 8) {
                *reinterpret_cast<uint2*>(v) = *reinterpret_cast<const uint2*>(p);
            } else if constexpr (B == 4) {
                *reinterpret_cast<uint32_t*>(v) = *reinterpret_cast<const uint32_t*>(p);
            }
#pragma unroll
            for (int r = 0; r < NR; r++) out[r] = to_f32(v[r]);
        } else {
#pragma unroll
            for (int r = 0; r < NR; r++) out[r] = d0 + r < hd ? to_f32(p[r]) : 0.f;
        }
    }
};
struct Q8 {
    typedef uint8_t elem;
    static constexpr int KEYS = 2;
    static __device__ __forceinline__ size_t row_elems(int hd) { return (size_t)(hd / 32) * Q8_BYTES; }
    template <int NR>
    static __device__ __forceinline__ void run(const uint8_t* row, int d0, int hd, float* out) {
#pragma unroll
        for (int r = 0; r < NR; r++) out[r] = d0 + r < hd ? q8_0_at(row, d0 + r) : 0.f;
    }
};
struct Q4 {
    typedef uint8_t elem;
    static constexpr int KEYS = 2;
    static __device__ __forceinline__ size_t row_elems(int hd) { return (size_t)(hd / 32) * Q4_BYTES; }
    template <int NR>
    static __device__ __forceinline__ void run(const uint8_t* row, int d0, int hd, float* out) {
#pragma unroll
        for (int r = 0; r < NR; r++) out[r] = d0 + r < hd ? q4_0_at(row, d0 + r) : 0.f;
    }
};

// part (when non-null): [t, nh, nsplit, hd + 2] = (sums[hd], max, normaliser) per segment.
// Block (tile, kv head, segment); tile = row tile * head_tiles + head tile.
// One block's work: tile `tile` of a sequence's t rows, segment sp of its nsplit. q and out
// hold qrows rows per head ([nh, qrows, hd], the sequence's rows at the pointers given), part
// pstride segments per (row, head).
template <typename L, int NR, int U>
__device__ void attend_units(float* __restrict__ out, float* __restrict__ part, const float* __restrict__ q,
                             const typename L::elem* __restrict__ kp, const typename L::elem* __restrict__ vp,
                             const uint32_t* __restrict__ blocks, int nh, int nkv, int t, int hd, int past, int bs,
                             float scale, int window, int tile, int sp, int nsplit, int qrows, int pstride) {
    typedef typename L::elem T;
    const size_t re = L::row_elems(hd);
    const int G = nh / nkv;
    const int Gb = min(G, U), R = U / Gb, head_tiles = (G + Gb - 1) / Gb;
    const int r0 = (tile / head_tiles) * R, hg0 = (tile % head_tiles) * Gb;
    const int kvh = blockIdx.y;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int start = sp * SPLIT;
    // Unit u: query head kvh * G + hg0 + u % Gb, row r0 + u / Gb; len 0 when it is not one.
    auto unit_len = [&](int u) {
        const int hg = hg0 + u % Gb, qi = r0 + u / Gb;
        return u < R * Gb && hg < G && qi < t ? past + qi + 1 : 0;
    };
    // A unit sees keys first[u] .. len[u] - 1 (a sliding window moves first up).
    int len[U], first[U];
    float qr[U][NR], acc[U][NR], m[U], l[U];
    int end_max = start, start_min = start + SPLIT;
#pragma unroll
    for (int u = 0; u < U; u++) {
        len[u] = unit_len(u);
        first[u] = window > 0 ? max(0, len[u] - window) : 0;
        const bool act = len[u] > 0;
        end_max = max(end_max, min(len[u], start + SPLIT));
        if (act) start_min = min(start_min, max(start, first[u]));
        const float* qrow = q + ((size_t)(kvh * G + hg0 + u % Gb) * qrows + r0 + u / Gb) * hd;
#pragma unroll
        for (int r = 0; r < NR; r++) {
            const int d = lane * NR + r;
            qr[u][r] = act && d < hd ? qrow[d] : 0.f;
            acc[u][r] = 0.f;
        }
        m[u] = -INFINITY;
        l[u] = 0.f;
    }
    // Keys before every unit's window are skipped; the warps keep their j mod WARPS lanes.
    constexpr int P = 32 / NR < L::KEYS ? 32 / NR : L::KEYS;
    const int j0 = start + ((start_min - start) / WARPS) * WARPS;
    // Pool rows of the batch of keys from jb (keys past the segment's end read the last one's
    // rows, in bounds, and count for nothing).
    auto rows_of = [&](int jb, uint32_t (&pr)[P]) {
#pragma unroll
        for (int p = 0; p < P; p++) {
            const int jc = min(jb + p * WARPS, end_max - 1);
            pr[p] = blocks[jc / bs] * (uint32_t)bs + (uint32_t)(jc % bs);
        }
    };
    const size_t row_bytes = re * sizeof(T);
    uint32_t prow[P];
    if (j0 + warp < end_max) rows_of(j0 + warp, prow);
    for (int jb = j0 + warp; jb < end_max; jb += WARPS * P) {
        float kr[P][NR], vr[P][NR];
#pragma unroll
        for (int p = 0; p < P; p++) {
            L::template run<NR>(kp + ((size_t)prow[p] * nkv + kvh) * re, lane * NR, hd, kr[p]);
            L::template run<NR>(vp + ((size_t)prow[p] * nkv + kvh) * re, lane * NR, hd, vr[p]);
        }
        // The next batch's rows into L2 while this one is scored (the lanes spread over each
        // row): its loads then wait on L2, not on DRAM. No arithmetic changes.
        if (jb + WARPS * P < end_max) {
            rows_of(jb + WARPS * P, prow);
#pragma unroll
            for (int p = 0; p < P; p++) {
                const size_t off = ((size_t)prow[p] * nkv + kvh) * row_bytes + lane * (row_bytes / 32);
                prefetch_l2(reinterpret_cast<const uint8_t*>(kp) + off);
                prefetch_l2(reinterpret_cast<const uint8_t*>(vp) + off);
            }
        }
        // Unit by unit (each unit's softmax state is its own, so the order across units is
        // free): the P keys' scores first, as P independent dot products and warp sums (their
        // shuffles interleave), then the keys folded in one after another in walk order. A
        // key outside the unit's range is scored and dropped. The same operations on the
        // same values as folding key by key with its score computed in place, so the same bits,
        // but the latency of a score's five shuffles is paid once a batch, not once a key (a
        // lone warp per scheduler in decode spent ~7 cycles an instruction waiting on it).
#pragma unroll
        for (int u = 0; u < U; u++) {
            const int hi = min(end_max, len[u]);
            if (jb >= hi || jb + (P - 1) * WARPS < first[u]) continue;  // no key of this batch (warp-uniform)
            float s[P];
#pragma unroll
            for (int p = 0; p < P; p++) {
                // Dims past hd hold 0 in both q and k (and v): they add nothing.
                float a = 0.f;
#pragma unroll
                for (int r = 0; r < NR; r++) a += qr[u][r] * kr[p][r];
                s[p] = a;
            }
#pragma unroll
            for (int p = 0; p < P; p++) s[p] = warp_sum(s[p]) * scale;
#pragma unroll
            for (int p = 0; p < P; p++) {
                const int j = jb + p * WARPS;
                if (j < hi && j >= first[u]) {
                    const float mn = fmaxf(m[u], s[p]);
                    const float c = expf(m[u] - mn), pe = expf(s[p] - mn);
                    l[u] = l[u] * c + pe;
#pragma unroll
                    for (int r = 0; r < NR; r++) acc[u][r] = acc[u][r] * c + pe * vr[p][r];
                    m[u] = mn;
                }
            }
        }
    }
    __shared__ float sm[U][WARPS], sl[U][WARPS];
    __shared__ float sacc[WARPS][U][32 * NR];
#pragma unroll
    for (int u = 0; u < U; u++) {
        if (lane == 0) {
            sm[u][warp] = m[u];
            sl[u][warp] = l[u];
        }
#pragma unroll
        for (int r = 0; r < NR; r++) sacc[warp][u][lane * NR + r] = acc[u][r];
    }
    __syncthreads();
    for (int u = 0; u < U; u++) {
        if (unit_len(u) == 0) continue;
        const int h = kvh * G + hg0 + u % Gb, qi = r0 + u / Gb;
        float gm = -INFINITY;
        for (int w = 0; w < WARPS; w++) gm = fmaxf(gm, sm[u][w]);
        float gl = 0.f;
        for (int w = 0; w < WARPS; w++) gl += sm[u][w] == -INFINITY ? 0.f : sl[u][w] * expf(sm[u][w] - gm);
        float* prow = nsplit > 1 ? part + (((size_t)qi * nh + h) * pstride + sp) * (hd + 2) : nullptr;
        float* orow = out + ((size_t)h * qrows + qi) * hd;
        for (int d = threadIdx.x; d < hd; d += blockDim.x) {
            float a = 0.f;
            for (int w = 0; w < WARPS; w++) a += sm[u][w] == -INFINITY ? 0.f : sacc[w][u][d] * expf(sm[u][w] - gm);
            if (prow) {
                prow[d] = a;
            } else {
                orow[d] = a / gl;
            }
        }
        if (prow && threadIdx.x == 0) {
            // A segment past this row's length (a longer row set the grid) stays empty.
            prow[hd] = gm;
            prow[hd + 1] = gl;
        }
    }
}

// out row (qi, h) from its segments, in order: sum_s e^(m_s - M) sums_s / sum_s e^(m_s - M) l_s.
// With one segment this is sums / l, the bits a one-segment call writes directly.
__device__ void merge_row(float* __restrict__ out, const float* __restrict__ part, int nh, int qi, int h, int hd,
                          int past, int pstride, int qrows) {
    const int len = past + qi + 1;
    const int used = (len + SPLIT - 1) / SPLIT;
    const float* p = part + ((size_t)qi * nh + h) * pstride * (hd + 2);
    float* orow = out + ((size_t)h * qrows + qi) * hd;
    if (used == 1) {
        for (int d = threadIdx.x; d < hd; d += blockDim.x) orow[d] = p[d] / p[hd + 1];
        return;
    }
    float gm = -INFINITY;
    for (int s = 0; s < used; s++) gm = fmaxf(gm, p[(size_t)s * (hd + 2) + hd]);
    float gl = 0.f;
    for (int s = 0; s < used; s++) {
        const float* ps = p + (size_t)s * (hd + 2);
        gl += ps[hd] == -INFINITY ? 0.f : ps[hd + 1] * expf(ps[hd] - gm);
    }
    for (int d = threadIdx.x; d < hd; d += blockDim.x) {
        float a = 0.f;
        for (int s = 0; s < used; s++) {
            const float* ps = p + (size_t)s * (hd + 2);
            a += ps[hd] == -INFINITY ? 0.f : ps[d] * expf(ps[hd] - gm);
        }
        orow[d] = a / gl;
    }
}

extern "C" __global__ void paged_attention_merge(float* __restrict__ out, const float* __restrict__ part, int nh,
                                                 int t, int hd, int past, int nsplit) {
    merge_row(out, part, nh, blockIdx.x, blockIdx.y, hd, past, nsplit, t);
}

// Batched calls (many sequences, one launch): meta holds per sequence (first row in the
// batch, rows t, past, first entry of its block table in `tables`); q, out [nh, total, hd]
// and part [total, nh, pstride, hd + 2] hold all sequences' rows. Grid (tiles of the longest
// sequence, nkv, pstride x sequences); each sequence runs exactly the blocks (tiles,
// segments) it would alone, with its own segment count, so its rows get the same bits.
__device__ __forceinline__ void batch_seq(const int* meta, int s, int* off, int* t, int* past, int* toff) {
    *off = meta[4 * s];
    *t = meta[4 * s + 1];
    *past = meta[4 * s + 2];
    *toff = meta[4 * s + 3];
}

extern "C" __global__ void paged_attention_merge_batch(float* __restrict__ out, const float* __restrict__ part,
                                                       const int* __restrict__ meta, int nh, int hd, int total,
                                                       int pstride) {
    int off, t, past, toff;
    batch_seq(meta, blockIdx.z, &off, &t, &past, &toff);
    const int qi = blockIdx.x;
    if (qi >= t || (past + t + SPLIT - 1) / SPLIT <= 1) return;  // one segment: written directly
    merge_row(out + (size_t)off * hd, part + (size_t)off * nh * pstride * (hd + 2), nh, qi, blockIdx.y, hd, past,
              pstride, total);
}

// Scatters rows: row i of src (row_bytes bytes) to pool row slots[i]. One warp per row.
extern "C" __global__ void kv_scatter_rows(uint8_t* __restrict__ pool, const uint8_t* __restrict__ src,
                                           const uint32_t* __restrict__ slots, int n, long long row_bytes) {
    const int i = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    const int lane = threadIdx.x & 31;
    if (i >= n) return;
    uint8_t* dst = pool + (size_t)slots[i] * row_bytes;
    const uint8_t* from = src + (size_t)i * row_bytes;
    if (row_bytes % 4 == 0) {
        for (long long b = lane; b < row_bytes / 4; b += 32)
            reinterpret_cast<uint32_t*>(dst)[b] = reinterpret_cast<const uint32_t*>(from)[b];
    } else {
        for (long long b = lane; b < row_bytes; b += 32) dst[b] = from[b];
    }
}

// Writes a batch's new keys and values into plain pools in one launch (instead of a cast and
// a scatter each): k, v [nkv, total, hd] f32 (row i of head h at (h * total + i) * hd), pool
// row slots[i], head h <- row (i, h) rounded to T to nearest even, the rounding of candle's
// casts (check-device's `attention batch` compares the pools bit for bit). One warp per
// (row, head).
__device__ __forceinline__ float round_to(float x, float*) { return x; }
__device__ __forceinline__ __half round_to(float x, __half*) { return __float2half_rn(x); }
template <typename T>
__device__ void store_rows(T* __restrict__ kpool, T* __restrict__ vpool, const float* __restrict__ k,
                           const float* __restrict__ v, const uint32_t* __restrict__ slots, int total, int nkv,
                           int hd) {
    const int w = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    const int lane = threadIdx.x & 31;
    if (w >= total * nkv) return;
    const int i = w / nkv, h = w % nkv;
    const size_t src = ((size_t)h * total + i) * hd;
    const size_t dst = ((size_t)slots[i] * nkv + h) * hd;
    for (int d = lane; d < hd; d += 32) {
        kpool[dst + d] = round_to(k[src + d], (T*)nullptr);
        vpool[dst + d] = round_to(v[src + d], (T*)nullptr);
    }
}
#define KV_STORE(name, T)                                                                                        \
    extern "C" __global__ void name(T* kpool, T* vpool, const float* k, const float* v, const uint32_t* slots, \
                                    int total, int nkv, int hd) {                                              \
        store_rows<T>(kpool, vpool, k, v, slots, total, nkv, hd);                                              \
    }
KV_STORE(kv_store_rows_f32, float)
KV_STORE(kv_store_rows_f16, __half)

#define PAGED_ONE(name, L, NR, U) PAGED_ONE_B(name, L, NR, U, (WARPS * 32))
// LB: the launch bounds, (WARPS * 32) or (WARPS * 32, blocks an SM).
#define PAGED_ONE_B(name, L, NR, U, LB)                                                                    \
    extern "C" __global__ void __launch_bounds__ LB                                                           \
        name(float* out, float* part, const float* q, const L::elem* kp, const L::elem* vp,                    \
             const uint32_t* blocks, int nh, int nkv, int t, int hd, int past, int bs, float scale,            \
             int window) {                                                                                     \
        attend_units<L, NR, U>(out, part, q, kp, vp, blocks, nh, nkv, t, hd, past, bs, scale, window,         \
                               blockIdx.x, blockIdx.z, gridDim.z, t, gridDim.z);                               \
    }                                                                                                          \
    extern "C" __global__ void __launch_bounds__ LB                                                           \
        name##_batch(float* out, float* part, const float* q, const L::elem* kp, const L::elem* vp,            \
                     const uint32_t* tables, const int* meta, int nh, int nkv, int hd, int bs, int total,      \
                     int pstride, float scale, int window) {                                                   \
        int off, t, past, toff;                                                                                \
        batch_seq(meta, blockIdx.z / pstride, &off, &t, &past, &toff);                                         \
        const int sp = blockIdx.z % pstride, nsplit = (past + t + SPLIT - 1) / SPLIT;                          \
        const int G = nh / nkv, Gb = min(G, U), tiles = (t + U / Gb - 1) / (U / Gb) * ((G + Gb - 1) / Gb);  \
        if ((int)blockIdx.x >= tiles || sp >= nsplit) return;                                                  \
        attend_units<L, NR, U>(out + (size_t)off * hd, part + (size_t)off * nh * pstride * (hd + 2),           \
                               q + (size_t)off * hd, kp, vp, tables + toff, nh, nkv, t, hd, past, bs, scale,  \
                               window, blockIdx.x, sp, nsplit, total, pstride);                                \
    }
// Per format: head dims up to 64 (16 units a block), 128 (8) and 256 (4); and for decode
// (one query row) of GQA groups of up to 4 heads, 128 with 4 units: the same bits per unit
// (a unit's arithmetic never depends on the others of its block) in fewer registers, so
// three blocks an SM where the 8-unit kernel fits two. (Eight warps a block, each walking
// every eighth key, took Llama-3-8B decode 1.09x on an H100 but prefill at depth 0.88x:
// docs/PERFORMANCE.md, 2026-12-06; one chain per head dim, so not both.)
#define PAGED(name, L)                     \
    PAGED_ONE(name##_d64, L, 2, 16)        \
    PAGED_ONE(name##_d128, L, 4, 8)        \
    PAGED_ONE_B(name##_d128u4, L, 4, 4, (WARPS * 32, 3)) \
    PAGED_ONE(name##_d256, L, 8, 4)

PAGED(paged_attention_f32, Plain<float>)
PAGED(paged_attention_f16, Plain<__half>)
PAGED(paged_attention_bf16, Plain<__nv_bfloat16>)
PAGED(paged_attention_q8_0, Q8)
PAGED(paged_attention_q4_0, Q4)

// f16 pools on the tensor cores (head dims 64, 128, 256).
#include "paged_attention_mma.cuh"
