// Causal GQA attention over a paged KV pool, one thread block per (query row, query head).
//
// q: [nh, t, hd] f32 (rows past .. past + t - 1 of the sequence), pools [rows, nkv, hd] in T
// (f32, f16, bf16) or [rows, nkv, row_bytes] of ggml q8_0 / q4_0 blocks (kv_quant.cuh),
// blocks: the sequence's block table (position p is pool row blocks[p / bs] * bs + p % bs),
// out: [nh, t, hd] f32. Query row i sees positions 0 ..= past + i.
//
// Split-KV: a row's keys are cut into segments of SPLIT positions (fixed boundaries), one
// thread block per (query row, query head, segment). In a block each warp walks the segment's
// keys j = start + warp, start + warp + W, ... with an online softmax (max, normaliser,
// weighted sum of values, lanes owning dims lane + 32 r), then the W warps' states are merged
// in warp order. With one segment in the call the block writes the normalised row; otherwise
// it writes its segment's (max, normaliser, sums) and paged_attention_merge combines a row's
// segments in order. A row's arithmetic depends only on its own query, its keys and hd (its
// length fixes its segments), never on t or the grid: a row in a verify chunk has the bits of
// the same row decoded alone, and long contexts spread over many multiprocessors.
#include "common.cuh"
#include "kv_quant.cuh"

#define WARPS 4
#define MAXR 8  // head dims up to 256
#define SPLIT 256

// Element d of one head row of a pool, as f32.
template <typename T>
struct Plain {
    typedef T elem;
    static __device__ __forceinline__ size_t row_elems(int hd) { return hd; }
    static __device__ __forceinline__ float at(const T* row, int d) { return to_f32(row[d]); }
};
struct Q8 {
    typedef uint8_t elem;
    static __device__ __forceinline__ size_t row_elems(int hd) { return (size_t)(hd / 32) * Q8_BYTES; }
    static __device__ __forceinline__ float at(const uint8_t* row, int d) { return q8_0_at(row, d); }
};
struct Q4 {
    typedef uint8_t elem;
    static __device__ __forceinline__ size_t row_elems(int hd) { return (size_t)(hd / 32) * Q4_BYTES; }
    static __device__ __forceinline__ float at(const uint8_t* row, int d) { return q4_0_at(row, d); }
};

// part (when non-null): [t, nh, nsplit, hd + 2] = (sums[hd], max, normaliser) per segment.
template <typename L>
__device__ void attend_row(float* __restrict__ out, float* __restrict__ part, const float* __restrict__ q,
                           const typename L::elem* __restrict__ kp, const typename L::elem* __restrict__ vp,
                           const uint32_t* __restrict__ blocks, int nh, int nkv, int t, int hd, int past, int bs,
                           float scale) {
    typedef typename L::elem T;
    const size_t re = L::row_elems(hd);
    const int qi = blockIdx.x, h = blockIdx.y, sp = blockIdx.z, nsplit = gridDim.z;
    const int kvh = h / (nh / nkv);
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int len = past + qi + 1;
    const int start = sp * SPLIT, end = min(len, start + SPLIT);
    float* prow = part ? part + (((size_t)qi * nh + h) * nsplit + sp) * (hd + 2) : nullptr;
    if (start >= len) {
        // A segment past this row's length (a longer row set the grid): empty.
        if (prow && threadIdx.x == 0) {
            prow[hd] = -INFINITY;
            prow[hd + 1] = 0.f;
        }
        return;
    }
    const float* qrow = q + ((size_t)h * t + qi) * hd;
    float qr[MAXR], acc[MAXR];
#pragma unroll
    for (int r = 0; r < MAXR; r++) {
        int d = lane + 32 * r;
        qr[r] = d < hd ? qrow[d] : 0.f;
        acc[r] = 0.f;
    }
    float m = -INFINITY, l = 0.f;
    for (int j = start + warp; j < end; j += WARPS) {
        size_t row = (size_t)blocks[j / bs] * bs + j % bs;
        const T* krow = kp + (row * nkv + kvh) * re;
        const T* vrow = vp + (row * nkv + kvh) * re;
        float s = 0.f;
#pragma unroll
        for (int r = 0; r < MAXR; r++) {
            int d = lane + 32 * r;
            if (d < hd) s += qr[r] * L::at(krow, d);
        }
        s = warp_sum(s) * scale;
        float mn = fmaxf(m, s);
        float c = expf(m - mn), p = expf(s - mn);
        l = l * c + p;
#pragma unroll
        for (int r = 0; r < MAXR; r++) {
            int d = lane + 32 * r;
            if (d < hd) acc[r] = acc[r] * c + p * L::at(vrow, d);
        }
        m = mn;
    }
    __shared__ float sm[WARPS], sl[WARPS];
    __shared__ float sacc[WARPS][32 * MAXR];
    if (lane == 0) {
        sm[warp] = m;
        sl[warp] = l;
    }
#pragma unroll
    for (int r = 0; r < MAXR; r++) sacc[warp][lane + 32 * r] = acc[r];
    __syncthreads();
    float gm = -INFINITY;
    for (int w = 0; w < WARPS; w++) gm = fmaxf(gm, sm[w]);
    float gl = 0.f;
    for (int w = 0; w < WARPS; w++) gl += sm[w] == -INFINITY ? 0.f : sl[w] * expf(sm[w] - gm);
    float* orow = out + ((size_t)h * t + qi) * hd;
    for (int d = threadIdx.x; d < hd; d += blockDim.x) {
        float a = 0.f;
        for (int w = 0; w < WARPS; w++) a += sm[w] == -INFINITY ? 0.f : sacc[w][d] * expf(sm[w] - gm);
        if (prow) {
            prow[d] = a;
        } else {
            orow[d] = a / gl;
        }
    }
    if (prow && threadIdx.x == 0) {
        prow[hd] = gm;
        prow[hd + 1] = gl;
    }
}

// out row (qi, h) from its segments, in order: sum_s e^(m_s - M) sums_s / sum_s e^(m_s - M) l_s.
// With one segment this is sums / l, the bits a one-segment call writes directly.
extern "C" __global__ void paged_attention_merge(float* __restrict__ out, const float* __restrict__ part, int nh,
                                                 int t, int hd, int past, int nsplit) {
    const int qi = blockIdx.x, h = blockIdx.y;
    const int len = past + qi + 1;
    const int used = (len + SPLIT - 1) / SPLIT;
    const float* p = part + ((size_t)qi * nh + h) * nsplit * (hd + 2);
    if (used == 1) {
        for (int d = threadIdx.x; d < hd; d += blockDim.x) out[((size_t)h * t + qi) * hd + d] = p[d] / p[hd + 1];
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
        out[((size_t)h * t + qi) * hd + d] = a / gl;
    }
}

#define PAGED(name, L)                                                                                        \
    extern "C" __global__ void __launch_bounds__(WARPS * 32)                                                  \
        name(float* out, float* part, const float* q, const L::elem* kp, const L::elem* vp,                    \
             const uint32_t* blocks, int nh, int nkv, int t, int hd, int past, int bs, float scale) {          \
        attend_row<L>(out, part, q, kp, vp, blocks, nh, nkv, t, hd, past, bs, scale);                         \
    }

PAGED(paged_attention_f32, Plain<float>)
PAGED(paged_attention_f16, Plain<__half>)
PAGED(paged_attention_bf16, Plain<__nv_bfloat16>)
PAGED(paged_attention_q8_0, Q8)
PAGED(paged_attention_q4_0, Q4)
