// tmmw_bf16 / tmmw_bf16_h: tmma.cu's chain on Hopper's wgmma (sm_90a only: build.rs compiles
// this module for compute_90a when CUDA_COMPUTE_CAP is 90, and to an empty module otherwise),
// for the calls tmmg_bf16 takes (prefill, wide batches). The same bits as tmmg_bf16 /
// tmmg_bf16_h for every row (the lab, lab/gemm_tma_lab.cu, checks them bit for bit; k is
// a positive multiple of 32, cuda_tmma.rs' `fits`: with no step the total would stay unwritten).
//
// - Operands: W [n, k] bf16 as loaded, and the activations' hi (and lo) halves [m, k] as
//   bf16_split_rows / bf16_hi_rows write them, both read by TMA tensor maps (encoded by the
//   host) in boxes of 32 values (one step of the chain) x BC weight rows / BR activation rows,
//   in the 64-byte swizzle; rows past the matrix arrive as zeros.
// - A block: one producer thread (warpgroup 0) issues a step's boxes into a ring of ST stages,
//   each with a "full" mbarrier (the copies' bytes) and an "empty" one (the consumers' 256
//   threads); two consumer warpgroups (64 weight columns each: wgmma's M) take the BR
//   activation rows as wgmma's N. A step is two sets of 16 values (0 .. 15, 16 .. 31, the
//   chain's order), each one wgmma with the hi halves and (split mode) one with the lo halves.
// - Partitions: the steps come in TgSteps' order; at a partition's end the accumulators are
//   added into a total in shared memory (tg_fold's order: the total is partition 0's, then
//   each next one added; empty partitions add +0), which keeps the registers free for
//   N = 256. The total leaves as whole rows of y.
// - Tiles: block b walks tiles b, b + gridDim.x, ... (row tile fastest, so neighbours share a
//   weight tile); with a grid of every tile a block runs one, with fewer (a block an SM) the
//   ring runs on across tiles so the next tile's first loads overlap the last one's folds.
// - tmmw2_bf16 / tmmw2_bf16_h (calls of up to 512 rows, cuda_tmma_wg.rs): 128 x 128 tiles whose
//   partitions alternate between two accumulators, with the total in registers (tw_consume2).
//   A partition's fold waits only for its own last step while the next partition's first step
//   runs, where tw_consume's fold waits for every wgmma in flight (the tensor cores idle) and
//   goes through shared memory. 3 x 64 accumulator registers: the producer's warpgroup gives
//   its registers to the consumers (setmaxnreg).
#include "common.cuh"
#include "tmma_chain.cuh"

// Only sm_90a has wgmma: built for any other GPU, the module stays empty (the host pass of a
// lab build sees the declarations).
#if !defined(__CUDA_ARCH__) || defined(__CUDA_ARCH_FEAT_SM90_ALL)
#include "wgmma.cuh"

#define TW_BC 128  // weight columns a block (two consumer warpgroups of 64)

// A stage: one step's boxes, weights (BC rows) then hi (BR rows) then lo (split mode), each a
// box of rows x 64 bytes in the 64-byte swizzle; then the total and the mbarriers.
template <int BR, int ST, bool LO, bool TWO = false>
struct TwShape {
    static constexpr int W = TW_BC * 64, X = BR * 64;
    static constexpr int STAGE = W + (LO ? 2 : 1) * X;
    static constexpr int TOT = TWO ? 0 : BR * TW_BC * 4;
    // + 16: the batch kernels' arrival count (tmmwk).
    static constexpr int SMEM = ST * STAGE + TOT + 2 * ST * 8 + 16;
};

// The total's place in shared memory: row r (activation row), column c (weight column),
// columns' bits 3-4 XORed with the row's bits 1-2 so that a fold's 32 lanes hit 32 banks;
// four consecutive columns stay together (float4 reads for the stores).
__device__ __forceinline__ int tw_tot_at(int r, int c) { return r * TW_BC + (c ^ (((r >> 1) & 3) << 3)); }

// The ring's mbarriers at `at` (full[st], then empty[st]): full[s] completes when stage s's
// boxes have landed (one arrival, the producer's, and the bytes), empty[s] when the
// consumers' 256 threads have read it. Every thread of the block calls this (thread 0
// initialises them, a block barrier publishes them); returns full.
__device__ __forceinline__ uint64_t* tw_ring(uint8_t* at, int st) {
    uint64_t* full = reinterpret_cast<uint64_t*>(at);
    if (threadIdx.x == 0) {
        for (int s = 0; s < st; s++) {
            mbar_init(&full[s], 1);
            mbar_init(&full[st + s], 256);
        }
        mbar_init_fence();
    }
    __syncthreads();
    return full;
}

// The producer's part of one tile: the steps gi walks, each into the ring's next stage (G
// counts the ring's steps) once the consumers have freed it: the weights' column tile ct,
// the activations' rows from r0.
template <int ST, int STAGE, int W, int X, bool LO>
__device__ __forceinline__ void tw_produce(uint8_t* smem, uint64_t* full, uint64_t* empty, TgSteps& gi, int& G,
                                           const CUtensorMap& tw, const CUtensorMap& th, const CUtensorMap& tl,
                                           int ct, int r0) {
    for (; !gi.done(); G++, gi.next()) {
        const int st = G % ST;
        if (G >= ST) mbar_wait(&empty[st], ((G / ST) & 1) ^ 1);
        mbar_expect_tx(&full[st], STAGE);
        uint8_t* stage = smem + st * STAGE;
        const int s = gi.step();
        tma_2d(stage, &tw, s * 32, ct * TW_BC, &full[st]);
        tma_2d(stage + W, &th, s * 32, r0, &full[st]);
        if constexpr (LO) tma_2d(stage + W + X, &tl, s * 32, r0, &full[st]);
    }
}

// One step of the chain from its stage into acc: each set of 16 values (0 .. 15, then 16 .. 31)
// one wgmma with the hi halves and (split mode) one with the lo halves, committed as a group;
// returns once the step before it has finished (wait_group 1), so that step's stage may be
// refilled. fresh: the first wgmma writes acc without reading it (a partition's first step
// in tw_consume2).
template <int X, bool LO, int NR>
__device__ __forceinline__ void tw_step(float (&acc)[NR], const uint8_t* ws, int h, bool fresh) {
    const uint8_t* hs = ws + TW_BC * 64;
    const uint8_t* ls = hs + X;
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#pragma unroll
    for (int set = 0; set < 2; set++) {
        const uint64_t da = wg_desc_sw64(ws + h * 64 * 64 + set * 32);
        wgmma_n(acc, da, wg_desc_sw64(hs + set * 32), !fresh || set > 0);
        if constexpr (LO) wgmma_n(acc, da, wg_desc_sw64(ls + set * 32), 1);
    }
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
    asm volatile("wgmma.wait_group.sync.aligned 1;\n" ::: "memory");
}

// The consumers (warpgroups 1 and 2; h = 0 / 1 their 64 weight columns): every step of the
// chain from its stage, partitions folded into the total, the total into y. G0 counts the
// ring's steps before this tile; returns the count after it.
template <int BR, int ST, bool LO>
__device__ __forceinline__ int tw_consume(float* __restrict__ y, uint8_t* smem, float* tot, uint64_t* full,
                                          uint64_t* empty, int h, int ctid, int row0, int col0, int m, int n,
                                          const TmChain& ch, int G0) {
    using S = TwShape<BR, ST, LO>;
    constexpr int NR = BR / 2;  // accumulator registers a consumer thread
    const int warp = (ctid >> 5) & 3, lane = ctid & 31;
    const int g = lane >> 2, t = lane & 3;
    float acc[NR];
#pragma unroll
    for (int i = 0; i < NR; i++) acc[i] = 0.f;
    TgSteps gc;
    gc.start(ch);
    int G = G0;
    for (; !gc.done(); G++) {
        const int st = G % ST;
        mbar_wait(&full[st], (G / ST) & 1);
        tw_step<S::X, LO>(acc, smem + st * S::STAGE, h, false);
        if (G > G0) mbar_arrive(&empty[(G - 1) % ST]);
        const int p0 = gc.p;
        gc.next();
        const int p1 = gc.done() ? TM_WARPS : gc.p;
        if (p1 != p0) {
            // The end of partition p0 (and of the empty ones up to p1): into the total.
            asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
#pragma unroll
            for (int i = 0; i < NR; i++) {
                // acc[4 j + e]: weight column 16 warp + g + 8 (e >> 1) of this warpgroup's
                // 64, activation row 8 j + 2 t + (e & 1).
                const int j = i >> 2, e = i & 3;
                float* p = &tot[tw_tot_at(8 * j + 2 * t + (e & 1), h * 64 + 16 * warp + g + 8 * (e >> 1))];
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
    for (int idx = ctid; idx < BR * TW_BC / 4; idx += 256) {
        const int r = idx / (TW_BC / 4), c = (idx % (TW_BC / 4)) * 4;
        const int row = row0 + r, col = col0 + c;
        if (row >= m || col >= n) continue;
        const float4 v = *reinterpret_cast<const float4*>(&tot[tw_tot_at(r, c)]);
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

// Partitions pp0 .. pp1 - 1 (the first with steps, the others empty) folded into the total:
// partition 0's accumulator + 0 (a -0 from scale-d = 0 becomes tmmg's +0), a later one added;
// empty partitions add +0 (once is as good as many).
__device__ __forceinline__ void tw_fold(float (&tot)[64], const float (&acc)[64], int pp0, int pp1) {
    const bool pz = pp1 > pp0 + 1;
#pragma unroll
    for (int i = 0; i < 64; i++) {
        const float v = pp0 == 0 ? acc[i] + 0.f : tot[i] + acc[i];
        tot[i] = pz ? v + 0.f : v;
    }
}

// The two-accumulator consumer (N = 128: BR = 128, 64 registers an accumulator): partitions
// alternate between accumulators a and b, and the total stays in registers. A partition's
// accumulator is folded after the next partition's first step has been issued (its
// wait_group 1 is the wait for the partition's last step), so the tensor cores run on through
// the fold; only the tile's last partition waits for everything. The same adds in the same
// order as tw_consume: the same bits. Runs one partition from gc; returns false at the tile's
// end (everything folded).
template <int ST, bool LO>
__device__ __forceinline__ bool tw_part2(float (&cur)[64], float (&prev)[64], float (&tot)[64], TgSteps& gc,
                                         uint8_t* smem, uint64_t* full, uint64_t* empty, int h, int& G, int G0,
                                         bool& pending, int& pp0, int& pp1) {
    using S = TwShape<128, ST, LO>;
    const int p0 = gc.p;
    bool first = true;
    do {
        const int st = G % ST;
        mbar_wait(&full[st], (G / ST) & 1);
        tw_step<S::X, LO>(cur, smem + st * S::STAGE, h, first);
        if (G > G0) mbar_arrive(&empty[(G - 1) % ST]);
        if (first && pending) {
            // The previous partition's last step has finished: its accumulator into the total.
            tw_fold(tot, prev, pp0, pp1);
            pending = false;
        }
        first = false;
        G++;
        gc.next();
    } while (!gc.done() && gc.p == p0);
    pp0 = p0;
    pp1 = gc.done() ? TM_WARPS : gc.p;
    pending = true;
    if (!gc.done()) return true;
    asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
    tw_fold(tot, cur, pp0, pp1);
    pending = false;
    return false;
}

// A tile with the two-accumulator consumer; the total leaves from the registers (a warp's
// store covers 8 consecutive columns of 4 rows: whole 32-byte sectors).
template <int ST, bool LO>
__device__ __forceinline__ int tw_consume2(float* __restrict__ y, uint8_t* smem, uint64_t* full, uint64_t* empty,
                                           int h, int ctid, int row0, int col0, int m, int n, const TmChain& ch,
                                           int G0) {
    const int warp = (ctid >> 5) & 3, lane = ctid & 31;
    const int g = lane >> 2, t = lane & 3;
    // A partition's first wgmma writes its accumulator without reading it (scale-d = 0), so
    // no other instruction writes them: ptxas keeps the wgmmas asynchronous (a zeroing store
    // between them serialises all of them: C7515). A -0 from a partition of -0 products
    // (where tmmg's accumulator, started at +0, has +0) becomes +0 in the fold's "+ 0.f".
    float a[64], b[64], tot[64];
    TgSteps gc;
    gc.start(ch);
    int G = G0, pp0 = 0, pp1 = 0;
    bool pending = false;
    while (tw_part2<ST, LO>(a, b, tot, gc, smem, full, empty, h, G, G0, pending, pp0, pp1) &&
           tw_part2<ST, LO>(b, a, tot, gc, smem, full, empty, h, G, G0, pending, pp0, pp1)) {
    }
    // The last fold waited for every wgmma: the tile's last stage is free.
    if (G > G0) mbar_arrive(&empty[(G - 1) % ST]);
#pragma unroll
    for (int i = 0; i < 64; i++) {
        const int j = i >> 2, e = i & 3;
        const int row = row0 + 8 * j + 2 * t + (e & 1), col = col0 + h * 64 + 16 * warp + g + 8 * (e >> 1);
        if (row < m && col < n) y[(size_t)row * n + col] = tot[i];
    }
    return G;
}

// The thread's warpgroup from a value the compiler sees as warp-uniform (otherwise it
// serialises the wgmmas behind the divergent branch: ptxas's C7520).
__device__ __forceinline__ int tw_role() { return __shfl_sync(0xffffffffu, threadIdx.x >> 7, 0); }

// 384 threads: warpgroup 0's first thread the producer, warpgroups 1 and 2 the consumers.
template <int BR, int ST, bool LO, bool TWO = false>
__device__ __forceinline__ void tmmw(float* __restrict__ y, const CUtensorMap& tw, const CUtensorMap& th,
                                     const CUtensorMap& tl, int m, int n, int k) {
    using S = TwShape<BR, ST, LO, TWO>;
    static_assert(!TWO || BR == 128, "the two-accumulator consumer is N = 128");
    extern __shared__ __align__(1024) uint8_t tw_smem[];
    uint8_t* smem = tw_smem;
    float* tot = reinterpret_cast<float*>(smem + ST * S::STAGE);
    uint64_t* full = tw_ring(smem + ST * S::STAGE + S::TOT, ST);
    uint64_t* empty = full + ST;
    const TmChain ch(k);
    const int nrt = (m + BR - 1) / BR, tiles = nrt * ((n + TW_BC - 1) / TW_BC);
    const int role = tw_role();
    if (role == 0) {
        // The two-accumulator consumers need 3 x 64 registers and more: the producer's
        // warpgroup gives its registers to them (128 x 40 + 256 x 232 <= 65,536).
        if constexpr (TWO) asm volatile("setmaxnreg.dec.sync.aligned.u32 40;\n" ::: "memory");
        if (threadIdx.x != 0) return;
        int G = 0;
        for (int tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
            const int rt = tile % nrt, ct = tile / nrt;
            TgSteps gi;
            gi.start(ch);
            tw_produce<ST, S::STAGE, S::W, S::X, LO>(smem, full, empty, gi, G, tw, th, tl, ct, rt * BR);
        }
        return;
    }
    int G = 0;
    if constexpr (TWO) {
        asm volatile("setmaxnreg.inc.sync.aligned.u32 232;\n" ::: "memory");
        for (int tile = blockIdx.x; tile < tiles; tile += gridDim.x)
            G = tw_consume2<ST, LO>(y, smem, full, empty, role - 1, threadIdx.x - 128, (tile % nrt) * BR,
                                    (tile / nrt) * TW_BC, m, n, ch, G);
    } else {
        for (int tile = blockIdx.x; tile < tiles; tile += gridDim.x)
            G = tw_consume<BR, ST, LO>(y, smem, tot, full, empty, role - 1, threadIdx.x - 128, (tile % nrt) * BR,
                                       (tile / nrt) * TW_BC, m, n, ch, G);
    }
}

// Split mode (hi + lo): 128 x 128 tiles, six stages (213,088 bytes of dynamic shared memory).
#define TW_SPLIT_BR 128
#define TW_SPLIT_ST 6
// bf16 activations (hi alone): 128 x 256 tiles, four stages (229,440 bytes).
#define TW_H_BR 256
#define TW_H_ST 4

extern "C" __global__ void __launch_bounds__(384, 1)
    tmmw_bf16(float* __restrict__ y, const __grid_constant__ CUtensorMap tw, const __grid_constant__ CUtensorMap th,
              const __grid_constant__ CUtensorMap tl, int m, int n, int k) {
    tmmw<TW_SPLIT_BR, TW_SPLIT_ST, true>(y, tw, th, tl, m, n, k);
}

extern "C" __global__ void __launch_bounds__(384, 1)
    tmmw_bf16_h(float* __restrict__ y, const __grid_constant__ CUtensorMap tw, const __grid_constant__ CUtensorMap th,
                int m, int n, int k) {
    tmmw<TW_H_BR, TW_H_ST, false>(y, tw, th, th, m, n, k);
}

// The two-accumulator forms (tw_consume2; 128 x 128 tiles, no total in shared memory): split
// mode with nine stages (221,328 bytes), bf16 activations with fourteen (229,600 bytes).
#define TW2_SPLIT_ST 9
#define TW2_H_ST 14

extern "C" __global__ void __launch_bounds__(384, 1)
    tmmw2_bf16(float* __restrict__ y, const __grid_constant__ CUtensorMap tw, const __grid_constant__ CUtensorMap th,
               const __grid_constant__ CUtensorMap tl, int m, int n, int k) {
    tmmw<128, TW2_SPLIT_ST, true, true>(y, tw, th, tl, m, n, k);
}

extern "C" __global__ void __launch_bounds__(384, 1)
    tmmw2_bf16_h(float* __restrict__ y, const __grid_constant__ CUtensorMap tw, const __grid_constant__ CUtensorMap th,
                 int m, int n, int k) {
    tmmw<128, TW2_H_ST, false, true>(y, tw, th, th, m, n, k);
}
// tmmw2k_bf16 / tmmw2k_bf16_h: tmmk_bf16's calls (batches: few rows, so the weights' bytes
// bound the call) on wgmma. Block (tile x, partition y) runs partition y of the chain alone
// for 64 activation rows x 128 weight columns (wgmma m64n64k16: the rows are N) and leaves its
// accumulator in part + y m n (+0 for an empty partition; the accumulator starts at +0 as
// tmmk's does); the eight are added in order (partition 0 first, tmmk_sum's order: tmmk_bf16's
// bits), by tmmk_sum (cnt null) or, with tile counters cnt (one an x block, zero at launch),
// by the tile's last block to finish: each block's consumers publish their stores (a fence,
// then one atomic increment of cnt[x]); the one that sees seven before it reads the eight
// partials (L2, not L1) into y and sets cnt[x] back to zero for the next call. That saves a
// launch a call and the partials' trip through DRAM (a batch-64 step: 128 tmmk_sum launches,
// 8% of its time on an H100; opt-in, TANDEM_BF16_BATCH_SUM=kernel, until run on a GPU). A ring of ST stages of TMA boxes keeps the weights streaming
// (tmmk_bf16 has two 32-value steps in flight).
template <int ST, bool LO>
__device__ __forceinline__ void tmmwk(float* __restrict__ part, float* __restrict__ y_out, unsigned* __restrict__ cnt,
                                      const CUtensorMap& tw, const CUtensorMap& th, const CUtensorMap& tl, int m,
                                      int n, int k) {
    using S = TwShape<64, ST, LO, true>;
    extern __shared__ __align__(1024) uint8_t tw_smem[];
    uint8_t* smem = tw_smem;
    uint64_t* full = tw_ring(smem + ST * S::STAGE, ST);
    uint64_t* empty = full + ST;
    const TmChain ch(k);
    const int p = blockIdx.y, nrt = (m + 63) / 64;
    const int rt = blockIdx.x % nrt, ct = blockIdx.x / nrt;
    const int role = tw_role();
    if (role == 0) {
        if (threadIdx.x != 0) return;
        TgSteps gi;
        gi.start_at(ch, p, p + 1);
        int G = 0;
        tw_produce<ST, S::STAGE, S::W, S::X, LO>(smem, full, empty, gi, G, tw, th, tl, ct, rt * 64);
        return;
    }
    const int h = role - 1, ctid = threadIdx.x - 128;
    const int warp = (ctid >> 5) & 3, lane = ctid & 31;
    const int g = lane >> 2, t = lane & 3;
    float acc[32];
#pragma unroll
    for (int i = 0; i < 32; i++) acc[i] = 0.f;
    TgSteps gc;
    gc.start_at(ch, p, p + 1);
    int G = 0;
    for (; !gc.done(); G++, gc.next()) {
        const int st = G % ST;
        mbar_wait(&full[st], (G / ST) & 1);
        tw_step<S::X, LO>(acc, smem + st * S::STAGE, h, false);
        if (G > 0) mbar_arrive(&empty[(G - 1) % ST]);
    }
    asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
    float* y = part + (size_t)p * m * n;
    const int row0 = rt * 64, col0 = ct * TW_BC + h * 64 + 16 * warp + g;
#pragma unroll
    for (int i = 0; i < 32; i++) {
        const int j = i >> 2, e = i & 3;
        const int row = row0 + 8 * j + 2 * t + (e & 1), col = col0 + 8 * (e >> 1);
        if (row < m && col < n) y[(size_t)row * n + col] = acc[i];
    }
    if (cnt == nullptr) return;
    volatile unsigned* arrived = reinterpret_cast<volatile unsigned*>(empty + ST);
    __threadfence();
    asm volatile("bar.sync 1, 256;\n" ::: "memory");
    if (ctid == 0) *arrived = atomicAdd(&cnt[blockIdx.x], 1u);
    asm volatile("bar.sync 1, 256;\n" ::: "memory");
    if (*arrived != TM_WARPS - 1) return;
    __threadfence();
    const size_t mn = (size_t)m * n;
    for (int idx = ctid; idx < 64 * TW_BC; idx += 256) {
        const int row = row0 + idx / TW_BC, col = ct * TW_BC + idx % TW_BC;
        if (row >= m || col >= n) continue;
        const size_t at = (size_t)row * n + col;
        float v = __ldcg(part + at);
#pragma unroll
        for (int q = 1; q < TM_WARPS; q++) v = v + __ldcg(part + q * mn + at);
        y_out[at] = v;
    }
    if (ctid == 0) cnt[blockIdx.x] = 0u;
}

// Split mode 16,384 bytes a stage, bf16 activations 12,288 (TwShape<64, ST, LO, true>): one
// block an SM with a deep ring (_1) or two with a shallower one (_2).
#define TWK_ST1 12
#define TWK_ST2 6
#define TWK_H_ST1 16
#define TWK_H_ST2 8

extern "C" __global__ void __launch_bounds__(384, 1)
    tmmw2k_bf16_1(float* __restrict__ part, float* __restrict__ y, unsigned* __restrict__ cnt, const __grid_constant__ CUtensorMap tw,
                  const __grid_constant__ CUtensorMap th, const __grid_constant__ CUtensorMap tl, int m, int n, int k) {
    tmmwk<TWK_ST1, true>(part, y, cnt, tw, th, tl, m, n, k);
}
extern "C" __global__ void __launch_bounds__(384, 2)
    tmmw2k_bf16_2(float* __restrict__ part, float* __restrict__ y, unsigned* __restrict__ cnt, const __grid_constant__ CUtensorMap tw,
                  const __grid_constant__ CUtensorMap th, const __grid_constant__ CUtensorMap tl, int m, int n, int k) {
    tmmwk<TWK_ST2, true>(part, y, cnt, tw, th, tl, m, n, k);
}
extern "C" __global__ void __launch_bounds__(384, 1)
    tmmw2k_bf16_h_1(float* __restrict__ part, float* __restrict__ y, unsigned* __restrict__ cnt, const __grid_constant__ CUtensorMap tw,
                    const __grid_constant__ CUtensorMap th, int m, int n, int k) {
    tmmwk<TWK_H_ST1, false>(part, y, cnt, tw, th, th, m, n, k);
}
extern "C" __global__ void __launch_bounds__(384, 2)
    tmmw2k_bf16_h_2(float* __restrict__ part, float* __restrict__ y, unsigned* __restrict__ cnt, const __grid_constant__ CUtensorMap tw,
                    const __grid_constant__ CUtensorMap th, int m, int n, int k) {
    tmmwk<TWK_H_ST2, false>(part, y, cnt, tw, th, th, m, n, k);
}
#endif
