// A lab for the bf16 prefill GEMM (issue 16, target 4): tmmg_bf16's chain on wgmma, fed by
// bulk copies from operands laid out in tiles, with a producer warp and mbarriers. Not part of
// the build: `LAB=bulk scripts/gpu-gemm-lab.sh` compiles and runs it on the device machine.
//
// Why: gemm_wgmma_lab.cu's kernels gave the chain's bits but waited on L2 (85% of its
// throughput at 105-129 TFLOP/s): every thread issued 8- or 16-byte copies between its wgmma
// groups, and a 128 x 128 tile of hi + lo activations costs 24 KB a 32-value step. Here:
//   - the operands come already in wgmma's no-swizzle K-major layout, one 32-value step of a
//     tile contiguous (weights: 128 columns x 32 values = 8 KB, a load-time repack; activations:
//     BR rows, written so by the pass that rounds or splits them, in place of bf16_hi_rows /
//     bf16_split_rows), so a stage is one bulk copy per operand (cp.async.bulk, no tensor map:
//     nothing for the host to encode);
//   - one producer thread issues the copies into ST stages; two consumer warpgroups (64 weight
//     columns each, wgmma's M, x BR activation rows, its N) wait on a stage's "full" mbarrier,
//     run its steps, and release it on its "empty" mbarrier once the wgmmas that read it are
//     done (wait_group 1 after the next stage's group);
//   - each partition's accumulator is folded into a total kept in shared memory (tg_fold's
//     order, empty partitions adding +0 too), which frees the registers for N = 256 (a
//     128 x 256 tile: 24 KB a step for 2 M products in bf16 mode), and the total leaves as
//     whole rows of y (float4 stores).
// The chain is tmma.cu's: a step is the set of values 8t .. 8t + 3 (t = 0..3), then 8t + 4 ..
// 8t + 7, each set one wgmma with the hi halves, then (split mode) one with the lo halves;
// partitions and segments as TgSteps walks them. Variants are checked bit for bit against
// tmmg_bf16 (split) or tmmg_bf16_h (bf16 activations) and timed on the 9B shape's matrices,
// beside cuBLAS's bf16 GEMM (f32 out) where the lab links against it (LAB_CUBLAS).
#include <cuda.h>
#include <cuda_bf16.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "../cuda/tmma.cu"
#include "lab_common.cuh"
#include "perm_rows.cuh"
#include "wgmma_ops.cuh"
#ifdef LAB_CUBLAS
#include <cublas_v2.h>
#endif

constexpr int BC = 128;  // weight columns a block (two consumer warpgroups of 64)

// Element index, in a tiled operand of R-row tiles, of (row, value i) of a [rows][k] matrix:
// tile rt = row / R, step s = i / 32; inside, set q (values 8t + 4q .. 8t + 4q + 3), then the
// no-swizzle core layout (cm_off) with the set's 16 values in slots 4t + (i & 3).
__host__ __device__ inline long long tiled_index(int row, int i, int R, int steps) {
    const int rt = row / R, r = row % R, s = i >> 5, v = i & 31;
    const int q = (v >> 2) & 1, j = (v >> 3) * 4 + (v & 3);
    const long long byte = ((long long)(rt * steps + s) * 2 + q) * (R * 32) + cm_off(r, j >> 3) + (j & 7) * 2;
    return byte >> 1;
}

// Weights [n][k] bf16 -> tiles of BC columns (columns past n zero).
__global__ void tile_weights(uint16_t* __restrict__ out, const uint16_t* __restrict__ w, int n, int k) {
    const int npad = (n + BC - 1) / BC * BC, steps = k >> 5;
    const long long total = (long long)npad * k;
    for (long long e = blockIdx.x * (long long)blockDim.x + threadIdx.x; e < total;
         e += (long long)gridDim.x * blockDim.x) {
        const int c = (int)(e / k), i = (int)(e % k);
        out[tiled_index(c, i, BC, steps)] = c < n ? w[e] : 0;
    }
}

// Activations [m][k] f32 -> tiles of R rows: hi (and lo when xl is set) as bf16_split_rows /
// bf16_hi_rows write them (split1's hi is bf16's round to nearest even); rows past m zero.
__global__ void tile_rows(uint16_t* __restrict__ xh, uint16_t* __restrict__ xl, const float* __restrict__ x, int m,
                          int k, int R) {
    const int mpad = (m + R - 1) / R * R, steps = k >> 5;
    const long long total = (long long)mpad * k;
    for (long long e = blockIdx.x * (long long)blockDim.x + threadIdx.x; e < total;
         e += (long long)gridDim.x * blockDim.x) {
        const int r = (int)(e / k), i = (int)(e % k);
        const uint32_t s = r < m ? split1(x[e]) : 0u;
        const long long o = tiled_index(r, i, R, steps);
        xh[o] = (uint16_t)(s & 0xffffu);
        if (xl) xl[o] = (uint16_t)(s >> 16);
    }
}

// The total's place in shared memory: row r (activation row), column c (weight column) of a
// BR x BC tile, columns' bits 3-4 XORed with the row's bits 1-2 so that a fold's 32 lanes
// (rows 2t, columns g + 8 e) hit 32 banks; four consecutive columns stay together.
__device__ __forceinline__ int tot_at(int r, int c) { return r * BC + (c ^ (((r >> 1) & 3) << 3)); }

// A stage holds one 32-value step: weights (BC rows), hi (BR rows), lo (BR rows, split mode).
// Bulk feed: each operand in the no-swizzle core layout, set 1 after set 0. TMA feed: each
// operand as the tensor map's box of rows x 64 bytes (the step's 32 values, set 0 in the
// first 32 bytes: the permuted row order) in the 64-byte swizzle, set q at byte 32 q.
template <int BR, int ST, bool LO>
struct StageShape {
    static constexpr int W = BC * 64, X = BR * 64;  // bytes of one operand's step
    static constexpr int STAGE = W + (LO ? 2 : 1) * X;
    static constexpr int TOT = BR * BC * 4;
    static constexpr int SMEM = ST * STAGE + TOT + 2 * ST * 8;
};

// wgmma's descriptor of a K-major operand in the 64-byte swizzle: rows 64 bytes apart, groups
// of 8 rows 512 bytes apart (the leading offset is unused when K fits the swizzle).
__device__ __forceinline__ uint64_t wg_desc_sw64(const void* smem) {
    const uint32_t a = (uint32_t)__cvta_generic_to_shared(smem);
    return (uint64_t)((a >> 4) & 0x3fff) | ((uint64_t)1 << 16) | ((uint64_t)(512 >> 4) << 32) | ((uint64_t)2 << 62);
}

// The consumers' side (warpgroups 1 and 2; h = 0 / 1 their 64 weight columns of the tile):
// every step of the chain from its stage, partitions folded into the shared total, then the
// total into y.
// G0: the stage ring's count of steps before this tile (a persistent block's earlier tiles);
// returns it after. The tile's last stage is released once its wgmmas are done.
template <int BR, int ST, bool LO, bool TMA>
__device__ __forceinline__ int consume(float* __restrict__ y, uint8_t* smem, float* tot, uint64_t* full,
                                       uint64_t* empty, int h, int ctid, int row0, int col0, int m, int n,
                                       int steps, int L, int nseg, int G0 = 0) {
    using S = StageShape<BR, ST, LO>;
    constexpr int NR = BR / 2;  // accumulator registers a consumer thread
    const int warp = (ctid >> 5) & 3, lane = ctid & 31;
    const int g = lane >> 2, t = lane & 3;
    float acc[NR];
#pragma unroll
    for (int i = 0; i < NR; i++) acc[i] = 0.f;
    TgSteps gc;
    gc.start(L, nseg, steps);
    int G = G0;
    for (; !gc.done(); G++) {
        const int st = G % ST;
        mbar_wait(&full[st], (G / ST) & 1);
        const uint8_t* ws = smem + st * S::STAGE;
        const uint8_t* hs = ws + S::W;
        const uint8_t* ls = hs + S::X;
        asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#pragma unroll
        for (int set = 0; set < 2; set++) {
            if constexpr (TMA) {
                const uint64_t da = wg_desc_sw64(ws + h * 64 * 64 + set * 32);
                wgmma_n(acc, da, wg_desc_sw64(hs + set * 32));
                if constexpr (LO) wgmma_n(acc, da, wg_desc_sw64(ls + set * 32));
            } else {
                const uint64_t da = wg_desc(ws + set * (S::W / 2) + h * 64 * 32);
                wgmma_n(acc, da, wg_desc(hs + set * (S::X / 2)));
                if constexpr (LO) wgmma_n(acc, da, wg_desc(ls + set * (S::X / 2)));
            }
        }
        asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
        // The step before this one has finished: its stage may be refilled.
        asm volatile("wgmma.wait_group.sync.aligned 1;\n" ::: "memory");
        if (G > G0) mbar_arrive(&empty[(G - 1) % ST]);
        const int p0 = gc.p;
        gc.next();
        const int p1 = gc.done() ? TM_WARPS : gc.p;
        if (p1 != p0) {
            // The end of partition p0 (and of the empty ones up to p1): into the total.
            asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
#pragma unroll
            for (int i = 0; i < NR; i++) {
                // d[4 j + e]: weight column 16 warp + g + 8 (e >> 1) of this warpgroup's 64,
                // activation row 8 j + 2 t + (e & 1). Empty partitions after p0 add +0.
                const int j = i >> 2, e = i & 3;
                float* p = &tot[tot_at(8 * j + 2 * t + (e & 1), h * 64 + 16 * warp + g + 8 * (e >> 1))];
                float v = p0 == 0 ? acc[i] : *p + acc[i];
                for (int q = p0 + 1; q < p1; q++) v = v + 0.f;
                *p = v;
                acc[i] = 0.f;
            }
        }
    }
    // The last partition's fold waited for every wgmma: the tile's last stage is free.
    if (G > G0) mbar_arrive(&empty[(G - 1) % ST]);
    asm volatile("bar.sync 1, 256;\n" ::: "memory");
    const bool vec = (n & 3) == 0;
    for (int idx = ctid; idx < BR * BC / 4; idx += 256) {
        const int r = idx / (BC / 4), c = (idx % (BC / 4)) * 4;
        const int row = row0 + r, col = col0 + c;
        if (row >= m) continue;
        const float4 v = *reinterpret_cast<const float4*>(&tot[tot_at(r, c)]);
        float* yp = y + (size_t)row * n + col;
        if (vec && col + 3 < n) {
            *reinterpret_cast<float4*>(yp) = v;
        } else {
            const float a[4] = {v.x, v.y, v.z, v.w};
            for (int e = 0; e < 4; e++)
                if (col + e < n) yp[e] = a[e];
        }
    }
    // Every consumer has read the total before a next tile's first fold writes it.
    asm volatile("bar.sync 1, 256;\n" ::: "memory");
    return G;
}

// The block's shared memory: ST stages, the total, then the full / empty mbarriers (set up
// by thread 0 before the roles split).
template <int BR, int ST, bool LO>
struct Smem {
    using S = StageShape<BR, ST, LO>;
    uint8_t* base;
    float* tot;
    uint64_t *full, *empty;
    __device__ Smem(uint8_t* b) : base(b) {
        tot = reinterpret_cast<float*>(b + ST * S::STAGE);
        full = reinterpret_cast<uint64_t*>(b + ST * S::STAGE + S::TOT);
        empty = full + ST;
        if (threadIdx.x == 0) {
            for (int s = 0; s < ST; s++) {
                mbar_init(&full[s], 1);
                mbar_init(&empty[s], 256);
            }
            mbar_init_fence();
        }
        __syncthreads();
    }
};

// tmma.cu's chain for k values: steps of 32, segments of L steps, nseg segments.
struct Chain {
    int steps, L, nseg;
    __device__ explicit Chain(int k)
        : steps(k >> 5), L(min(TM_MAXL, max(1, (k >> 5) / TM_WARPS))), nseg(((k >> 5) + L - 1) / L) {}
};

// The thread's warpgroup (0: the producer's, 1 and 2: the consumers) from a value the compiler
// sees as warp-uniform (otherwise it serialises the wgmmas behind the divergent branch:
// ptxas's C7520).
__device__ __forceinline__ int warpgroup_role() { return __shfl_sync(0xffffffffu, threadIdx.x >> 7, 0); }

// The producer's walk of one tile: step s of the chain into stage G % ST once its last use
// (step G - ST of the ring) is released, `load(stage, s, bar)` issuing the stage's copies;
// G counts the ring's steps over the block's tiles. Returns G after the tile.
template <int BR, int ST, bool LO, class Load>
__device__ __forceinline__ int produce(Smem<BR, ST, LO>& sm, uint8_t* smem, int steps, int L, int nseg, int G,
                                       Load load) {
    using S = StageShape<BR, ST, LO>;
    TgSteps gi;
    gi.start(L, nseg, steps);
    for (; !gi.done(); G++, gi.next()) {
        const int st = G % ST;
        if (G >= ST) mbar_wait(&sm.empty[st], ((G / ST) & 1) ^ 1);
        mbar_expect_tx(&sm.full[st], S::STAGE);
        load(smem + st * S::STAGE, gi.step(), &sm.full[st]);
    }
    return G;
}

// 384 threads: warpgroup 0's first thread the producer (one step a stage, a stage refilled
// once the consumers released it), warpgroups 1 and 2 the consumers. Bulk feed: operands
// tiled by tile_weights / tile_rows.
template <int BR, int ST, bool LO>
__global__ void __launch_bounds__(384, 1)
    tmmb(float* __restrict__ y, const uint8_t* __restrict__ wt, const uint8_t* __restrict__ xht,
         const uint8_t* __restrict__ xlt, int m, int n, int k) {
    using S = StageShape<BR, ST, LO>;
    extern __shared__ __align__(1024) uint8_t smem[];
    Smem<BR, ST, LO> sm(smem);
    const Chain ch(k);
    const int steps = ch.steps, L = ch.L, nseg = ch.nseg;
    const int role = warpgroup_role();
    if (role == 0) {
        if (threadIdx.x != 0) return;
        const uint8_t* wb = wt + (size_t)blockIdx.y * steps * S::W;
        const size_t xo = (size_t)blockIdx.x * steps * S::X;
        produce(sm, smem, steps, L, nseg, 0, [&](uint8_t* stage, int s, uint64_t* bar) {
            bulk_g2s(stage, wb + (size_t)s * S::W, S::W, bar);
            bulk_g2s(stage + S::W, xht + xo + (size_t)s * S::X, S::X, bar);
            if constexpr (LO) bulk_g2s(stage + S::W + S::X, xlt + xo + (size_t)s * S::X, S::X, bar);
        });
        return;
    }
    consume<BR, ST, LO, false>(y, smem, sm.tot, sm.full, sm.empty, role - 1, threadIdx.x - 128, blockIdx.x * BR,
                               blockIdx.y * BC, m, n, steps, L, nseg);
}

// A 2-D tensor map's box into shared memory (coordinates: value, row), counted on bar.
__device__ __forceinline__ void tma_2d(void* dst, const CUtensorMap* map, int x, int yrow, uint64_t* bar) {
    asm volatile(
        "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];\n" ::"r"(
            smem_u32(dst)),
        "l"(map), "r"(x), "r"(yrow), "r"(smem_u32(bar))
        : "memory");
}

// The TMA feed: operands row-major in the permuted order (perm_index), read by tensor maps
// with boxes of 32 values x BC (weights) / BR (activations) rows in the 64-byte swizzle; rows
// past the matrix arrive as zeros.
// A TMA stage: the weights' box of tile ct and the activations' of row tile rt at step s.
template <int BR, int ST, bool LO>
__device__ __forceinline__ void tma_stage(uint8_t* stage, const CUtensorMap& tw, const CUtensorMap& th,
                                          const CUtensorMap& tl, int s, int rt, int ct, uint64_t* bar) {
    using S = StageShape<BR, ST, LO>;
    tma_2d(stage, &tw, s * 32, ct * BC, bar);
    tma_2d(stage + S::W, &th, s * 32, rt * BR, bar);
    if constexpr (LO) tma_2d(stage + S::W + S::X, &tl, s * 32, rt * BR, bar);
}

// The TMA kernel: block b walks the tiles t = b, b + gridDim.x, ... (row tile t % row tiles,
// so that neighbours share a weight tile). With a block a tile (the grid of all tiles) each
// block runs one; persistent (a block an SM), its stage ring runs on across tiles: the
// producer loads the next tile's first steps while the consumers fold and store the last one,
// which hides a tile's start and end.
template <int BR, int ST, bool LO>
__global__ void __launch_bounds__(384, 1)
    tmmp(float* __restrict__ y, const __grid_constant__ CUtensorMap tw, const __grid_constant__ CUtensorMap th,
         const __grid_constant__ CUtensorMap tl, int m, int n, int k) {
    using S = StageShape<BR, ST, LO>;
    extern __shared__ __align__(1024) uint8_t smem[];
    Smem<BR, ST, LO> sm(smem);
    const Chain ch(k);
    const int steps = ch.steps, L = ch.L, nseg = ch.nseg;
    const int nrt = (m + BR - 1) / BR, tiles = nrt * ((n + BC - 1) / BC);
    const int role = warpgroup_role();
    if (role == 0) {
        if (threadIdx.x != 0) return;
        int G = 0;
        for (int tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
            const int rt = tile % nrt, ct = tile / nrt;
            G = produce(sm, smem, steps, L, nseg, G, [&](uint8_t* stage, int s, uint64_t* bar) {
                tma_stage<BR, ST, LO>(stage, tw, th, tl, s, rt, ct, bar);
            });
        }
        return;
    }
    int G = 0;
    for (int tile = blockIdx.x; tile < tiles; tile += gridDim.x)
        G = consume<BR, ST, LO, true>(y, smem, sm.tot, sm.full, sm.empty, role - 1, threadIdx.x - 128,
                                      (tile % nrt) * BR, (tile / nrt) * BC, m, n, steps, L, nseg, G);
}

typedef void (*BulkKern)(float*, const uint8_t*, const uint8_t*, const uint8_t*, int, int, int);
typedef void (*TmaKern)(float*, const CUtensorMap, const CUtensorMap, const CUtensorMap, int, int, int);
struct Variant {
    const char* name;
    BulkKern fb;  // the bulk feed, or
    TmaKern ft;   // the TMA feed
    int br, smem;
    bool lo;
    bool persistent = false;
    const void* f() const { return fb ? (const void*)fb : (const void*)ft; }
};
#define VB(BR, ST, LO) {"tmmb_" #BR "_st" #ST "_" #LO, tmmb<BR, ST, LO>, nullptr, BR, StageShape<BR, ST, LO>::SMEM, LO}
#define VT(BR, ST, LO) {"tmmt_" #BR "_st" #ST "_" #LO, nullptr, tmmp<BR, ST, LO>, BR, StageShape<BR, ST, LO>::SMEM, LO}
#define VP(BR, ST, LO) \
    {"tmmp_" #BR "_st" #ST "_" #LO, nullptr, tmmp<BR, ST, LO>, BR, StageShape<BR, ST, LO>::SMEM, LO, true}
static const Variant VARIANTS[] = {
    VB(256, 4, false),  // bf16 activations, 128 x 256 tiles (229,440 bytes of shared memory)
    VT(256, 4, false),
    VP(256, 4, false),  // ... persistent
    VT(128, 8, false),  // bf16 activations, 128 x 128 tiles
    VP(128, 8, false),
    VB(128, 6, true),   // split (hi + lo), 128 x 128 tiles
    VT(128, 6, true),
    VP(128, 6, true),
};
// (Two steps a stage compiled with ptxas's C7519: the short last group of an odd segment made
// the second step's wgmmas conditional, and the compiler then serialised them.)
static const int NV = sizeof(VARIANTS) / sizeof(VARIANTS[0]);

struct Bufs {
    uint16_t *w, *wp, *wt, *xh, *xl, *th, *tl;
    float* x;
};

typedef CUresult (*EncodeTiled)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*, const cuuint64_t*,
                                const cuuint64_t*, const cuuint32_t*, const cuuint32_t*, CUtensorMapInterleave,
                                CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill);
static EncodeTiled encode_tiled() {
    static EncodeTiled f = nullptr;
    if (!f) {
        cudaDriverEntryPointQueryResult q;
        CK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", (void**)&f, 12000, cudaEnableDefault, &q));
        if (q != cudaDriverEntryPointSuccess || !f) {
            fprintf(stderr, "cuTensorMapEncodeTiled not found\n");
            exit(1);
        }
    }
    return f;
}
// A bf16 [rows][k] matrix as boxes of 32 values x box_rows rows in the 64-byte swizzle.
static CUtensorMap tensor_map(const void* base, int rows, int k, int box_rows) {
    CUtensorMap map;
    const cuuint64_t dims[2] = {(cuuint64_t)k, (cuuint64_t)rows}, strides[1] = {(cuuint64_t)k * 2};
    const cuuint32_t box[2] = {32, (cuuint32_t)box_rows}, estr[2] = {1, 1};
    const CUresult r = encode_tiled()(&map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, const_cast<void*>(base), dims,
                                      strides, box, estr, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_64B,
                                      CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    if (r != CUDA_SUCCESS) {
        fprintf(stderr, "cuTensorMapEncodeTiled: %d (rows %d k %d box %d)\n", (int)r, rows, k, box_rows);
        exit(1);
    }
    return map;
}

// The reference (row-major operands, tmmg_bf16 / tmmg_bf16_h) and a variant's operands.
static void prepare_ref(const Bufs& b, int m, int k, bool lo) {
    const long long tot = (long long)m * k;
    if (lo)
        bf16_split_rows<<<(unsigned)((tot + 255) / 256), 256>>>(b.xh, b.xl, b.x, tot);
    else
        bf16_hi_rows<<<(unsigned)((tot + 255) / 256), 256>>>(b.xh, b.x, tot);
}
static void launch_ref(float* y, const Bufs& b, int m, int n, int k, bool lo) {
    dim3 grid((m + TG_BM - 1) / TG_BM, (n + TG_BN - 1) / TG_BN);
    if (lo)
        tmmg_bf16<<<grid, 256>>>(y, (const uint4*)b.xh, (const uint4*)b.xl, (const uint4*)b.w, m, n, k);
    else
        tmmg_bf16_h<<<grid, 256>>>(y, (const uint4*)b.xh, (const uint4*)b.w, m, n, k);
}
// The weights of a shape in both feeds' forms (b.w filled).
static void prepare_weights(const Bufs& b, int n, int k) {
    tile_weights<<<4096, 256>>>(b.wt, b.w, n, k);
    perm_bf16<<<4096, 256>>>(b.wp, b.w, (long long)n * k);
}
static void prepare(const Variant& v, const Bufs& b, int m, int k) {
    if (v.fb) {
        tile_rows<<<2048, 256>>>(b.th, v.lo ? b.tl : nullptr, b.x, m, k, v.br);
    } else {
        const long long tot = (long long)m * k;
        split_perm<<<(unsigned)((tot + 255) / 256), 256>>>(b.th, v.lo ? b.tl : nullptr, b.x, tot);
    }
}
static void launch(const Variant& v, float* y, const Bufs& b, int m, int n, int k) {
    dim3 grid((m + v.br - 1) / v.br, (n + BC - 1) / BC);
    if (v.ft) {  // the TMA kernel walks tiles on a 1-D grid: all of them, or one block an SM
        static int sms = 0;
        if (!sms) CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
        grid = dim3(v.persistent ? std::min<int>(sms, grid.x * grid.y) : grid.x * grid.y, 1);
    }
    if (v.fb) {
        v.fb<<<grid, 384, v.smem>>>(y, (const uint8_t*)b.wt, (const uint8_t*)b.th, (const uint8_t*)b.tl, m, n, k);
    } else {
        const CUtensorMap tw = tensor_map(b.wp, n, k, BC), th = tensor_map(b.th, m, k, v.br),
                          tl = tensor_map(b.tl, m, k, v.br);
        v.ft<<<grid, 384, v.smem>>>(y, tw, th, tl, m, n, k);
    }
}

struct Shape {
    const char* what;
    int m, n, k;
};

template <class F>
static double time_us(F f, int reps = 10) {
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    f();
    CK(cudaEventRecord(e0));
    for (int r = 0; r < reps; r++) f();
    CK(cudaEventRecord(e1));
    CK(cudaEventSynchronize(e1));
    CK(cudaGetLastError());
    float ms;
    CK(cudaEventElapsedTime(&ms, e0, e1));
    CK(cudaEventDestroy(e0));
    CK(cudaEventDestroy(e1));
    return ms * 1e3 / reps;
}

int main() {
    CK(cudaSetDevice(0));
    for (int i = 0; i < NV; i++)
        CK(cudaFuncSetAttribute(VARIANTS[i].f(), cudaFuncAttributeMaxDynamicSharedMemorySize, VARIANTS[i].smem));
    const size_t WE = (size_t)24576 * 12288, XE = (size_t)4096 * 12288;
    Bufs b;
    float *y0, *y1;
    CK(cudaMalloc(&b.w, (size_t)24576 * 4096 * 2));
    CK(cudaMalloc(&b.wp, (size_t)24576 * 4096 * 2));
    CK(cudaMalloc(&b.wt, WE * 2));
    CK(cudaMalloc(&b.x, XE * 4));
    for (uint16_t** p : {&b.xh, &b.xl, &b.th, &b.tl}) CK(cudaMalloc(p, XE * 2));
    CK(cudaMalloc(&y0, (size_t)4096 * 24576 * 4));
    CK(cudaMalloc(&y1, (size_t)4096 * 24576 * 4));
    fill_f32<<<4096, 256>>>(b.x, XE, 99);
#ifdef LAB_CUBLAS
    cublasHandle_t cb;
    if (cublasCreate(&cb) != CUBLAS_STATUS_SUCCESS) return 2;
#endif

    // Bits: every variant against tmmg_bf16 (split) / tmmg_bf16_h (bf16) on odd and real shapes.
    const Shape checks[] = {{"odd", 77, 200, 96},       {"odd", 300, 1000, 2080}, {"one", 1, 64, 32},
                            {"small", 17, 4096, 4096},  {"real", 512, 12352, 4096}, {"down", 333, 4096, 12288},
                            {"wide", 129, 24576, 4096}};
    int fails = 0;
    for (const Shape& s : checks) {
        fill_bf16<<<4096, 256>>>(b.w, (size_t)s.n * s.k, 7 + s.n);
        prepare_weights(b, s.n, s.k);
        std::vector<float> ref[2];
        for (int lo = 0; lo < 2; lo++) {
            prepare_ref(b, s.m, s.k, lo);
            launch_ref(y0, b, s.m, s.n, s.k, lo);
            ref[lo].resize((size_t)s.m * s.n);
            CK(cudaMemcpy(ref[lo].data(), y0, ref[lo].size() * 4, cudaMemcpyDeviceToHost));
        }
        std::vector<float> got((size_t)s.m * s.n);
        for (int i = 0; i < NV; i++) {
            const Variant& v = VARIANTS[i];
            CK(cudaMemset(y1, 0xff, got.size() * 4));
            prepare(v, b, s.m, s.k);
            launch(v, y1, b, s.m, s.n, s.k);
            CK(cudaGetLastError());
            CK(cudaMemcpy(got.data(), y1, got.size() * 4, cudaMemcpyDeviceToHost));
            const std::vector<float>& a = ref[v.lo];
            size_t bad = 0, first = 0;
            for (size_t e = 0; e < a.size(); e++)
                if (memcmp(&a[e], &got[e], 4) != 0 && bad++ == 0) first = e;
            if (bad) {
                fails++;
                printf("FAIL %s %s m%d n%d k%d: %zu of %zu differ (first at row %zu col %zu: %g vs %g)\n", v.name,
                       s.what, s.m, s.n, s.k, bad, a.size(), first / s.n, first % s.n, got[first], a[first]);
            }
        }
    }
    printf("bits: %d failures over %d variants x %d shapes\n", fails, NV, (int)(sizeof(checks) / sizeof(checks[0])));

    // Time: the 9B shape's matrices at 4,096 rows (and 512); useful TFLOP/s = 2 m n k / time.
    const Shape shapes[] = {{"gdn in_proj", 4096, 12352, 4096}, {"ffn gate+up", 4096, 24576, 4096},
                            {"ffn down", 4096, 4096, 12288},   {"out_proj", 4096, 4096, 4096},
                            {"gate+up pp512", 512, 24576, 4096}};
    printf("| shape | tmmg_bf16 | tmmg_bf16_h |");
#ifdef LAB_CUBLAS
    printf(" cuBLAS bf16 |");
#endif
    for (int i = 0; i < NV; i++) printf(" %s |", VARIANTS[i].name);
    printf(" tile_rows 256 hi | bf16_hi_rows |\n");
    for (const Shape& s : shapes) {
        fill_bf16<<<4096, 256>>>(b.w, (size_t)s.n * s.k, 7);
        prepare_weights(b, s.n, s.k);
        const double fl = 2.0 * s.m * s.n * s.k;
        auto tf = [&](double us) { return fl / (us * 1e-6) / 1e12; };
        printf("| %s %dx%dx%d |", s.what, s.m, s.n, s.k);
        for (int lo = 1; lo >= 0; lo--) {
            prepare_ref(b, s.m, s.k, lo);
            const double us = time_us([&] { launch_ref(y1, b, s.m, s.n, s.k, lo); });
            printf(" %.0f us %.0f TF |", us, tf(us));
        }
#ifdef LAB_CUBLAS
        {
            const float one = 1.f, zero = 0.f;
            const double us = time_us([&] {
                cublasGemmEx(cb, CUBLAS_OP_T, CUBLAS_OP_N, s.n, s.m, s.k, &one, b.w, CUDA_R_16BF, s.k, b.xh,
                             CUDA_R_16BF, s.k, &zero, y1, CUDA_R_32F, s.n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
            });
            printf(" %.0f us %.0f TF |", us, tf(us));
        }
#endif
        for (int i = 0; i < NV; i++) {
            prepare(VARIANTS[i], b, s.m, s.k);
            const double us = time_us([&] { launch(VARIANTS[i], y1, b, s.m, s.n, s.k); });
            printf(" %.0f us %.0f TF |", us, tf(us));
        }
        const long long tot = (long long)s.m * s.k;
        const double tu = time_us([&] { tile_rows<<<2048, 256>>>(b.th, nullptr, b.x, s.m, s.k, 256); });
        const double hu = time_us([&] { bf16_hi_rows<<<(unsigned)((tot + 255) / 256), 256>>>(b.xh, b.x, tot); });
        printf(" %.0f us | %.0f us |\n", tu, hu);
    }
    return fails ? 1 : 0;
}
