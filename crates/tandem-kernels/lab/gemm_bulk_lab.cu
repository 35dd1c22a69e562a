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
#include <cuda_bf16.h>

#include <vector>

#include "../cuda/tmma.cu"
#include "lab_common.cuh"
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

// The chain's steps in stage groups: partition p (0..7), its segments p, p + 8, ... < nseg,
// each segment's steps in runs of up to KS (a group never crosses a segment).
template <int KS>
struct Groups {
    int p, seg, i, ns, L, nseg, steps;
    __device__ void start(int L_, int nseg_, int steps_) {
        L = L_, nseg = nseg_, steps = steps_, p = 0, seg = 0, i = 0;
        settle();
    }
    __device__ void settle() {
        while (p < TM_WARPS && seg >= nseg) seg = ++p;
        ns = p < TM_WARPS ? min(L, steps - seg * L) : 0;
    }
    __device__ bool done() const { return p >= TM_WARPS; }
    __device__ int s0() const { return seg * L + i; }
    __device__ int count() const { return min(KS, ns - i); }
    __device__ void next() {
        i += KS;
        if (i < ns) return;
        i = 0;
        seg += TM_WARPS;
        if (seg >= nseg) seg = ++p;
        settle();
    }
};

// The total's place in shared memory: row r (activation row), column c (weight column) of a
// BR x BC tile, columns' bits 3-4 XORed with the row's bits 1-2 so that a fold's 32 lanes
// (rows 2t, columns g + 8 e) hit 32 banks; four consecutive columns stay together.
__device__ __forceinline__ int tot_at(int r, int c) { return r * BC + (c ^ (((r >> 1) & 3) << 3)); }

template <int BR, int ST, int KS, bool LO>
struct BulkShape {
    static constexpr int WSET = BC * 32, XSET = BR * 32;           // bytes of one set of one step
    static constexpr int WSTEP = 2 * WSET, XSTEP = 2 * XSET;        // bytes of one step
    static constexpr int STAGE = KS * (WSTEP + (LO ? 2 : 1) * XSTEP);
    static constexpr int TOT = BR * BC * 4;
    static constexpr int SMEM = ST * STAGE + TOT + 2 * ST * 8;
};

// 384 threads: warpgroup 0's first thread the producer, warpgroups 1 and 2 the consumers.
template <int BR, int ST, int KS, bool LO>
__global__ void __launch_bounds__(384, 1)
    tmmb(float* __restrict__ y, const uint8_t* __restrict__ wt, const uint8_t* __restrict__ xht,
         const uint8_t* __restrict__ xlt, int m, int n, int k) {
    using S = BulkShape<BR, ST, KS, LO>;
    constexpr int NR = BR / 2;  // accumulator registers a consumer thread
    extern __shared__ __align__(1024) uint8_t smem[];
    float* tot = reinterpret_cast<float*>(smem + ST * S::STAGE);
    uint64_t* full = reinterpret_cast<uint64_t*>(smem + ST * S::STAGE + S::TOT);
    uint64_t* empty = full + ST;
    const int tid = threadIdx.x;
    const int rt = blockIdx.x, ct = blockIdx.y;
    const int row0 = rt * BR, col0 = ct * BC;
    const int steps = k >> 5;
    const int L = min(TM_MAXL, max(1, steps / TM_WARPS));
    const int nseg = (steps + L - 1) / L;
    if (tid == 0) {
        for (int s = 0; s < ST; s++) {
            mbar_init(&full[s], 1);
            mbar_init(&empty[s], 256);
        }
        mbar_init_fence();
    }
    __syncthreads();
    // The warpgroup's role from a value the compiler sees as warp-uniform (otherwise it
    // serialises the wgmmas behind the divergent branch: ptxas's C7520).
    const int role = __shfl_sync(0xffffffffu, tid >> 7, 0);

    if (role == 0) {
        if (tid != 0) return;
        // The producer: stage group G into stage G % ST once its last use (group G - ST) is released.
        const uint8_t* wbase = wt + (size_t)ct * steps * S::WSTEP;
        const size_t xoff = (size_t)rt * steps * S::XSTEP;
        Groups<KS> gi;
        gi.start(L, nseg, steps);
        for (int G = 0; !gi.done(); G++, gi.next()) {
            const int st = G % ST, c = gi.count(), s0 = gi.s0();
            if (G >= ST) mbar_wait(&empty[st], ((G / ST) & 1) ^ 1);
            uint8_t* stage = smem + st * S::STAGE;
            const uint32_t wb = c * S::WSTEP, xb = c * S::XSTEP;
            mbar_expect_tx(&full[st], wb + (LO ? 2 : 1) * xb);
            bulk_g2s(stage, wbase + (size_t)s0 * S::WSTEP, wb, &full[st]);
            bulk_g2s(stage + KS * S::WSTEP, xht + xoff + (size_t)s0 * S::XSTEP, xb, &full[st]);
            if constexpr (LO) bulk_g2s(stage + KS * (S::WSTEP + S::XSTEP), xlt + xoff + (size_t)s0 * S::XSTEP, xb, &full[st]);
        }
        return;
    }

    // A consumer: warpgroup h, weight columns h * 64 .. + 63 of the tile, all BR rows.
    const int ctid = tid - 128, h = role - 1, warp = (ctid >> 5) & 3, lane = ctid & 31;
    const int g = lane >> 2, t = lane & 3;
    float acc[NR];
#pragma unroll
    for (int i = 0; i < NR; i++) acc[i] = 0.f;
    Groups<KS> gc;
    gc.start(L, nseg, steps);
    for (int G = 0; !gc.done(); G++) {
        const int st = G % ST, c = gc.count();
        mbar_wait(&full[st], (G / ST) & 1);
        const uint8_t* stage = smem + st * S::STAGE;
        asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#pragma unroll
        for (int u = 0; u < KS; u++) {
            if (KS > 1 && u >= c) break;  // a segment's last group may be short
            const uint8_t* ws = stage + u * S::WSTEP + h * 64 * 32;
            const uint8_t* hs = stage + KS * S::WSTEP + u * S::XSTEP;
            const uint8_t* ls = hs + KS * S::XSTEP;
#pragma unroll
            for (int set = 0; set < 2; set++) {
                const uint64_t da = wg_desc(ws + set * S::WSET);
                wgmma_n(acc, da, wg_desc(hs + set * S::XSET));
                if constexpr (LO) wgmma_n(acc, da, wg_desc(ls + set * S::XSET));
            }
        }
        asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
        // The group before this one has finished: its stage may be refilled.
        asm volatile("wgmma.wait_group.sync.aligned 1;\n" ::: "memory");
        if (G > 0) mbar_arrive(&empty[(G - 1) % ST]);
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
}

typedef void (*BulkKern)(float*, const uint8_t*, const uint8_t*, const uint8_t*, int, int, int);
struct Variant {
    const char* name;
    BulkKern f;
    int br, smem;
    bool lo;
};
#define VB(BR, ST, KS, LO) \
    {"tmmb_" #BR "_st" #ST "_ks" #KS "_" #LO, tmmb<BR, ST, KS, LO>, BR, BulkShape<BR, ST, KS, LO>::SMEM, LO}
static const Variant VARIANTS[] = {
    VB(256, 4, 1, false),  // bf16 activations, 128 x 256 tiles (229,440 bytes of shared memory)
    VB(128, 6, 1, false),  // bf16 activations, 128 x 128 tiles
    VB(128, 8, 1, false),
    VB(128, 6, 1, true),   // split (hi + lo), 128 x 128 tiles
    VB(128, 4, 1, true),
};
// (KS = 2 compiles with ptxas's C7519: the short last group of an odd segment makes the
// second step's wgmmas conditional, and the compiler then serialises them.)
static const int NV = sizeof(VARIANTS) / sizeof(VARIANTS[0]);

struct Bufs {
    uint16_t *w, *wt, *xh, *xl, *th, *tl;
    float* x;
};

// The reference (row-major operands, tmmg_bf16 / tmmg_bf16_h) and a variant's tiled operands.
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
static void prepare(const Variant& v, const Bufs& b, int m, int k) {
    tile_rows<<<2048, 256>>>(b.th, v.lo ? b.tl : nullptr, b.x, m, k, v.br);
}
static void launch(const Variant& v, float* y, const Bufs& b, int m, int n, int k) {
    dim3 grid((m + v.br - 1) / v.br, (n + BC - 1) / BC);
    v.f<<<grid, 384, v.smem>>>(y, (const uint8_t*)b.wt, (const uint8_t*)b.th, (const uint8_t*)b.tl, m, n, k);
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
        CK(cudaFuncSetAttribute(VARIANTS[i].f, cudaFuncAttributeMaxDynamicSharedMemorySize, VARIANTS[i].smem));
    const size_t WE = (size_t)24576 * 12288, XE = (size_t)4096 * 12288;
    Bufs b;
    float *y0, *y1;
    CK(cudaMalloc(&b.w, (size_t)24576 * 4096 * 2));
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
        tile_weights<<<4096, 256>>>(b.wt, b.w, s.n, s.k);
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
        tile_weights<<<4096, 256>>>(b.wt, b.w, s.n, s.k);
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
