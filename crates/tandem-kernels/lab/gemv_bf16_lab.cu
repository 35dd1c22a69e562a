// A lab for the bf16 decode GEMV (issue 16, target 1): checks that every tvs_bf16_<PP>_<D>
// variant gives tmv_bf16_8_1's bits for 1-8 rows on odd and real shapes, then times each on the
// Qwen3.5-9B shape's matrices (weights rotated through more than the L2 holds) and over one
// whole decode step's sequence of matrices (32 layers, distinct weights), against the
// device-to-device copy bandwidth measured in the same run. Not part of the build:
// `scripts/gpu-gemv-lab.sh` compiles and runs it on the device machine.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "../cuda/tmma.cu"
#include "lab_common.cuh"

// The streaming variant measured and rejected (docs/PERFORMANCE.md): lab-only.
// tvs_bf16_<PP>_<D> (calls of up to 8 rows: decode and verify): tmv_bf16's chain, walked by
// warps that stream. Warp w of a block owns 16 output columns and the PP consecutive
// partitions q0 .. q0 + PP - 1 of the chain (q0 = (w % (8 / PP)) * PP); it walks their
// segments in k order (round r: segments 8r + q0 .. 8r + q0 + PP - 1, each step in order),
// each partition into its own accumulator from zero, so every partition sees its segments in
// the order tmv_bf16 gives them. The weights come through a ring of D one-step stages per warp
// (16 columns x 64 bytes) that cp.async keeps D - 1 steps ahead, so a warp has ~D KB of its
// rows in flight all the way through instead of one segment per round trip. A block is 8
// warps: 8 / PP warps per column group and PP column groups (16 * PP columns); the
// partitions' accumulators meet in shared memory and are added in partition order, as
// tmv_bf16 adds its warps. Dynamic shared memory: max(8 * D, 4 * PP) KB.
template <int PP, int D>
__device__ void tvs_bf16(float* __restrict__ y, const float4* __restrict__ x, const uint4* __restrict__ w, int m,
                         int n, int k) {
    constexpr int WS = TM_WARPS / PP;  // warps per column group
    extern __shared__ __align__(16) uint4 ts_smem[];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int g = lane >> 2, t = lane & 3;
    const int cg = warp / WS, q0 = (warp % WS) * PP;
    const int col0 = (blockIdx.x * PP + cg) * 16;
    const int steps = k >> 5, k8 = k >> 3, k4 = k >> 2;
    const int L = min(TM_MAXL, max(1, steps / TM_WARPS));
    const int nseg = (steps + L - 1) / L;
    uint4* ring = ts_smem + warp * D * 64;
    // This lane's two pieces of a stage: column c = piece / 4, quarter piece % 4 of its 64 bytes.
    const uint4* src[2];
#pragma unroll
    for (int h = 0; h < 2; h++) {
        const int pc = lane + 32 * h;
        const int col = min(col0 + (pc >> 2), n - 1);  // columns past n: never written
        src[h] = w + (size_t)col * k8 + (pc & 3);
    }
    // The load side's place in the walk: round lr, partition lq - q0, step li of its segment.
    int lr = 0, lq = 0, li = 0;
    auto lvalid = [&]() { return 8 * lr + q0 + lq < nseg; };
    auto lnext = [&]() {
        const int seg = 8 * lr + q0 + lq;
        if (++li < min(L, steps - seg * L)) return;
        li = 0;
        if (++lq == PP || seg + 1 >= nseg) lq = 0, lr++;
    };
    auto load = [&](int slot) {
        const int s = (8 * lr + q0 + lq) * L + li;
#pragma unroll
        for (int h = 0; h < 2; h++) cp_async16(ring + slot * 64 + lane + 32 * h, src[h] + (size_t)s * 4);
    };
#pragma unroll
    for (int d = 0; d < D - 1; d++) {
        if (lvalid()) {
            load(d);
            lnext();
        }
        cp_async_commit();
    }
    float acc[PP][4];
#pragma unroll
    for (int p = 0; p < PP; p++) acc[p][0] = acc[p][1] = acc[p][2] = acc[p][3] = 0.f;
    const bool live = g < m;
    const float4* xrow = x + (size_t)(live ? g : 0) * k4 + t;
    int j = 0;
    for (int r = 0; 8 * r + q0 < nseg; r++) {
#pragma unroll
        for (int p = 0; p < PP; p++) {
            const int seg = 8 * r + q0 + p;
            if (seg < nseg) {
                const int s0 = seg * L, ns = min(L, steps - s0);
                for (int i = 0; i < ns; i++, j++) {
                    if (lvalid()) {
                        load((j + D - 1) % D);
                        lnext();
                    }
                    cp_async_commit();
                    float4 a = make_float4(0.f, 0.f, 0.f, 0.f), b = a;
                    if (live) {
                        a = __ldg(xrow + (size_t)(s0 + i) * 8);
                        b = __ldg(xrow + (size_t)(s0 + i) * 8 + 4);
                    }
                    uint4 bh, bl;
                    split8(a, b, bh, bl);
                    cp_async_wait<D - 1>();
                    __syncwarp();
                    const uint4* st = ring + (j % D) * 64;
                    tm_step(acc[p], tm_lane(reinterpret_cast<const uint8_t*>(st + g * 4), t),
                            tm_lane(reinterpret_cast<const uint8_t*>(st + (g + 8) * 4), t), bh, bl);
                    __syncwarp();  // every lane has read this stage: it may be refilled
                }
            }
        }
    }
    cp_async_wait<0>();
    __syncthreads();
    // [column group][partition][16 columns][8 rows]: the rings are free now.
    float* red = reinterpret_cast<float*>(ts_smem);
#pragma unroll
    for (int p = 0; p < PP; p++) {
        float* o = red + ((cg * TM_WARPS + q0 + p) * 16) * 8;
        o[g * 8 + 2 * t] = acc[p][0];
        o[g * 8 + 2 * t + 1] = acc[p][1];
        o[(g + 8) * 8 + 2 * t] = acc[p][2];
        o[(g + 8) * 8 + 2 * t + 1] = acc[p][3];
    }
    __syncthreads();
    for (int i = threadIdx.x; i < PP * 128; i += blockDim.x) {
        const int c = (i >> 3) & 15, rr = i & 7, cgi = i >> 7;
        const float* o = red + (cgi * TM_WARPS * 16 + c) * 8 + rr;
        float v = o[0];
#pragma unroll
        for (int p = 1; p < TM_WARPS; p++) v += o[p * 128];
        const int col = (blockIdx.x * PP + cgi) * 16 + c;
        if (rr < m && col < n) y[(size_t)rr * n + col] = v;
    }
}

#define TVS(PP, D)                                                                                            \
    extern "C" __global__ void __launch_bounds__(TM_WARPS * 32)                                              \
        tvs_bf16_##PP##_##D(float* y, const float4* x, const uint4* w, int m, int n, int k) {                \
        tvs_bf16<PP, D>(y, x, w, m, n, k);                                                                   \
    }

TVS(1, 8)
TVS(2, 8)
TVS(4, 8)
TVS(8, 8)
TVS(1, 12)
TVS(2, 12)
TVS(4, 12)
TVS(8, 12)
TVS(1, 16)
TVS(2, 16)
TVS(4, 16)
TVS(8, 16)

// Stands for the small kernels between two matmuls (norms, activations, the mixers): reads the
// matmul's output and writes the next one's activations, PDL-aware like the matmuls.
__global__ void between(float* __restrict__ x, const float* __restrict__ y, int n, int k) {
    pdl_trigger();
    pdl_wait();
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < k; i += gridDim.x * blockDim.x)
        x[i] = y[i % n] * 0.5f + 0.25f;
}

// The next matmul's first bytes into L2 while the kernels before it run (a graph branch beside
// the step's chain): one prefetch per 128-byte line, or one bulk prefetch per 32 KB.
__global__ void l2_prefetch_lines(const char* __restrict__ p, size_t bytes) {
    for (size_t off = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * 128; off < bytes;
         off += (size_t)gridDim.x * blockDim.x * 128)
        prefetch_l2(p + off);
}
__global__ void l2_prefetch_bulk(const char* __restrict__ p, size_t bytes) {
    const size_t C = 32768;
    for (size_t off = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * C; off < bytes;
         off += (size_t)gridDim.x * blockDim.x * C) {
        const uint32_t sz = (uint32_t)(bytes - off < C ? bytes - off : C);
        asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(p + off), "r"(sz) : "memory");
    }
}

typedef void (*Kern)(float*, const float4*, const uint4*, int, int, int);
struct Variant {
    const char* name;
    Kern f;
    int pp, d;
};
#define V(PP, D) {"tvs_" #PP "_" #D, tvs_bf16_##PP##_##D, PP, D}
static Variant VARIANTS[] = {V(1, 8),  V(2, 8),  V(4, 8),  V(8, 8),  V(1, 12), V(2, 12),
                             V(4, 12), V(8, 12), V(1, 16), V(2, 16), V(4, 16), V(8, 16)};
static const int NV = sizeof(VARIANTS) / sizeof(VARIANTS[0]);

static void launch_base(float* y, const float* x, const uint16_t* w, int m, int n, int k) {
    const int smem = TM_WARPS * TV_STAGE;
    dim3 grid((n + 15) / 16, (m + 7) / 8);
    tmv_bf16_8_1<<<grid, 256, smem>>>(y, (const float4*)x, (const uint8_t*)w, m, n, k);
}
static void launch_tvs(const Variant& v, float* y, const float* x, const uint16_t* w, int m, int n, int k) {
    const int smem = std::max(8 * v.d * 1024, 4096 * v.pp);
    dim3 grid((n + 16 * v.pp - 1) / (16 * v.pp));
    v.f<<<grid, 256, smem>>>(y, (const float4*)x, (const uint4*)w, m, n, k);
}
// The largest PP whose grid still has `target` warps (n / 16 column groups x 8 / PP warps each).
static int auto_pp(int n, int target) {
    const int groups = (n + 15) / 16;
    for (int pp = 8; pp > 1; pp /= 2)
        if (groups * (8 / pp) >= target) return pp;
    return 1;
}
static const Variant* find(int pp, int d) {
    for (int i = 0; i < NV; i++)
        if (VARIANTS[i].pp == pp && VARIANTS[i].d == d) return &VARIANTS[i];
    return nullptr;
}

static int check() {
    const int shapes[][2] = {{17, 32}, {40, 96}, {100, 4096}, {1000, 4128}, {33, 12288}, {4096, 4096}, {12352, 4096},
                             {64, 256}, {48, 8192}};
    int fails = 0, runs = 0;
    for (auto& s : shapes) {
        const int n = s[0], k = s[1];
        uint16_t* w;
        float *x, *y0, *y1;
        CK(cudaMalloc(&w, (size_t)n * k * 2));
        CK(cudaMalloc(&x, (size_t)8 * k * 4));
        CK(cudaMalloc(&y0, (size_t)8 * n * 4));
        CK(cudaMalloc(&y1, (size_t)8 * n * 4));
        fill_bf16<<<1024, 256>>>(w, (size_t)n * k, n * 7 + k);
        fill_f32<<<256, 256>>>(x, (size_t)8 * k, n + 3 * k);
        std::vector<float> a(8 * n), b(8 * n);
        for (int m : {1, 2, 3, 5, 8}) {
            CK(cudaMemset(y0, 0xff, (size_t)8 * n * 4));
            launch_base(y0, x, w, m, n, k);
            CK(cudaGetLastError());
            CK(cudaMemcpy(a.data(), y0, (size_t)m * n * 4, cudaMemcpyDeviceToHost));
            for (int i = 0; i < NV; i++) {
                CK(cudaMemset(y1, 0xff, (size_t)8 * n * 4));
                launch_tvs(VARIANTS[i], y1, x, w, m, n, k);
                CK(cudaGetLastError());
                CK(cudaMemcpy(b.data(), y1, (size_t)m * n * 4, cudaMemcpyDeviceToHost));
                runs++;
                if (memcmp(a.data(), b.data(), (size_t)m * n * 4) != 0) {
                    int bad = 0;
                    for (int e = 0; e < m * n; e++) bad += memcmp(&a[e], &b[e], 4) != 0;
                    if (fails < 20)
                        printf("MISMATCH %s n=%d k=%d m=%d: %d of %d differ (first %g vs %g)\n", VARIANTS[i].name, n,
                               k, m, bad, m * n, a[0], b[0]);
                    fails++;
                }
            }
        }
        CK(cudaFree(w));
        CK(cudaFree(x));
        CK(cudaFree(y0));
        CK(cudaFree(y1));
    }
    printf("check: %d of %d variant runs bit-equal to tmv_bf16_8_1\n", runs - fails, runs);
    return fails;
}

// The 9B decode step's matrices (fused projections as the engine runs them), [n, k] and count.
struct Mat {
    const char* name;
    int n, k, count;
};
static const Mat STEP[] = {{"gdn_in", 12352, 4096, 24},  {"gdn_out", 4096, 4096, 24}, {"attn_qkv", 10240, 4096, 8},
                           {"attn_o", 4096, 4096, 8},    {"gate_up", 24576, 4096, 32}, {"down", 4096, 12288, 32},
                           {"lm_head", 248320, 4096, 1}};

int main(int argc, char** argv) {
    CK(cudaSetDevice(0));
    // Dynamic shared memory above 48 KB for every kernel.
    CK(cudaFuncSetAttribute(tmv_bf16_8_1, cudaFuncAttributeMaxDynamicSharedMemorySize, TM_WARPS * TV_STAGE));
    for (int i = 0; i < NV; i++)
        CK(cudaFuncSetAttribute(VARIANTS[i].f, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                std::max(8 * VARIANTS[i].d * 1024, 4096 * VARIANTS[i].pp)));
    const int fails = check();

    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    // Copy bandwidth (bytes read + written).
    {
        const size_t bytes = (size_t)4 << 30;
        void *a, *b;
        CK(cudaMalloc(&a, bytes));
        CK(cudaMalloc(&b, bytes));
        CK(cudaMemset(a, 1, bytes));
        CK(cudaMemcpy(b, a, bytes, cudaMemcpyDeviceToDevice));
        CK(cudaEventRecord(e0));
        for (int i = 0; i < 5; i++) CK(cudaMemcpy(b, a, bytes, cudaMemcpyDeviceToDevice));
        CK(cudaEventRecord(e1));
        CK(cudaEventSynchronize(e1));
        float ms;
        CK(cudaEventElapsedTime(&ms, e0, e1));
        printf("copy: %.3f TB/s (read + write)\n", 5.0 * 2 * bytes / (ms * 1e-3) / 1e12);
        CK(cudaFree(a));
        CK(cudaFree(b));
    }

    // The whole step's weights, distinct per layer (15.9 GB + the head).
    std::vector<std::vector<uint16_t*>> ws(sizeof(STEP) / sizeof(STEP[0]));
    size_t total = 0;
    for (size_t s = 0; s < ws.size(); s++) {
        for (int c = 0; c < STEP[s].count; c++) {
            uint16_t* p;
            const size_t e = (size_t)STEP[s].n * STEP[s].k;
            CK(cudaMalloc(&p, e * 2));
            fill_bf16<<<4096, 256>>>(p, e, (uint32_t)(s * 131 + c));
            ws[s].push_back(p);
            total += e * 2;
        }
    }
    float *x, *y;
    CK(cudaMalloc(&x, (size_t)8 * 12288 * 4));
    CK(cudaMalloc(&y, (size_t)8 * 248320 * 4));
    fill_f32<<<256, 256>>>(x, (size_t)8 * 12288, 99);
    CK(cudaDeviceSynchronize());
    printf("step weights: %.2f GB\n", total / 1e9);

    // Per matrix: every copy of it once per repetition (rotating through more than the L2).
    auto time_mat = [&](size_t s, auto&& run, int reps) {
        for (auto* p : ws[s]) run(p);
        CK(cudaEventRecord(e0));
        for (int r = 0; r < reps; r++)
            for (auto* p : ws[s]) run(p);
        CK(cudaEventRecord(e1));
        CK(cudaEventSynchronize(e1));
        CK(cudaGetLastError());
        float ms;
        CK(cudaEventElapsedTime(&ms, e0, e1));
        const double bytes = (double)STEP[s].n * STEP[s].k * 2 * ws[s].size() * reps;
        return std::make_pair(ms / (ws[s].size() * reps) * 1e3, bytes / (ms * 1e-3) / 1e12);
    };
    // GEMV_LAB_PF_ONLY=1: skip the per-matrix and streaming-variant timings (the L2 prefetch runs).
    const bool pf_only = getenv("GEMV_LAB_PF_ONLY") != nullptr;
    for (int m : {1, 4}) {
        if (pf_only) break;
        printf("\nper matrix, m = %d: us per call / TB/s\n%-10s %-16s", m, "", "tmv_bf16_8_1");
        for (int i = 0; i < NV; i++) printf(" %-16s", VARIANTS[i].name);
        printf("\n");
        for (size_t s = 0; s < ws.size(); s++) {
            const int n = STEP[s].n, k = STEP[s].k;
            const int reps = s + 1 == ws.size() ? 10 : 3;
            auto b = time_mat(s, [&](uint16_t* p) { launch_base(y, x, p, m, n, k); }, reps);
            printf("%-10s %7.1f / %5.2f  ", STEP[s].name, b.first, b.second);
            for (int i = 0; i < NV; i++) {
                auto r = time_mat(s, [&](uint16_t* p) { launch_tvs(VARIANTS[i], y, x, p, m, n, k); }, reps);
                printf(" %7.1f / %5.2f ", r.first, r.second);
            }
            printf("\n");
        }
    }

    // Ends the capture on st, then ms per replay of the graph (three warm-up replays, 20 timed).
    auto graph_ms = [&](cudaStream_t st) {
        cudaGraph_t gr;
        cudaGraphExec_t ge;
        CK(cudaStreamEndCapture(st, &gr));
        CK(cudaGraphInstantiate(&ge, gr, 0));
        for (int i = 0; i < 3; i++) CK(cudaGraphLaunch(ge, st));
        CK(cudaStreamSynchronize(st));
        const int reps = 20;
        CK(cudaEventRecord(e0, st));
        for (int i = 0; i < reps; i++) CK(cudaGraphLaunch(ge, st));
        CK(cudaEventRecord(e1, st));
        CK(cudaEventSynchronize(e1));
        CK(cudaGetLastError());
        float ms;
        CK(cudaEventElapsedTime(&ms, e0, e1));
        CK(cudaGraphExecDestroy(ge));
        CK(cudaGraphDestroy(gr));
        return ms / reps;
    };
    // The whole step: every matrix once, in layer order, as one CUDA graph (as decode runs).
    auto step_time = [&](auto&& run) {
        cudaStream_t st;
        CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
        CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
        for (int layer = 0; layer < 32; layer++) {
            const bool gdn = layer % 4 != 3;
            const int li = gdn ? layer - layer / 4 : layer / 4;
            if (gdn) {
                run(st, 0, ws[0][li]);
                run(st, 1, ws[1][li]);
            } else {
                run(st, 2, ws[2][li]);
                run(st, 3, ws[3][li]);
            }
            run(st, 4, ws[4][layer]);
            run(st, 5, ws[5][layer]);
        }
        run(st, 6, ws[6][0]);
        const float ms = graph_ms(st);
        CK(cudaStreamDestroy(st));
        return ms;
    };
    printf("\nwhole step (graph of %d matmuls, %.2f GB), m = 1:\n", 24 * 2 + 8 * 2 + 64 + 1, total / 1e9);
    auto report = [&](const char* name, float ms) {
        printf("%-28s %7.3f ms  %5.2f TB/s  %6.1f steps/s\n", name, ms, total / (ms * 1e-3) / 1e12, 1e3 / ms);
    };
    report("tmv_bf16_8_1", step_time([&](cudaStream_t st, int s, uint16_t* p) {
               const int n = STEP[s].n, k = STEP[s].k;
               dim3 grid((n + 15) / 16, 1);
               tmv_bf16_8_1<<<grid, 256, TM_WARPS * TV_STAGE, st>>>(y, (const float4*)x, (const uint8_t*)p, 1, n, k);
           }));
    for (int d : {8, 12, 16}) {
        if (pf_only) break;
        for (int target : {0, 1024, 2048, 4096, 8192}) {
            char name[64];
            snprintf(name, sizeof name, "tvs D=%d target=%d", d, target);
            report(name, step_time([&](cudaStream_t st, int s, uint16_t* p) {
                       const int n = STEP[s].n, k = STEP[s].k;
                       const int pp = target == 0 ? 8 : auto_pp(n, target);
                       const Variant* v = find(pp, d);
                       const int smem = std::max(8 * v->d * 1024, 4096 * v->pp);
                       dim3 grid((n + 16 * pp - 1) / (16 * pp));
                       v->f<<<grid, 256, smem, st>>>(y, (const float4*)x, (const uint4*)p, 1, n, k);
                   }));
        }
    }
    // Launch gaps: the baseline kernel with NB small kernels between matmuls, launched the
    // ordinary way or with programmatic stream serialisation (PDL), in a graph.
    for (int nb : {0, 3}) {
        for (int pdl : {0, 1}) {
            char name[64];
            snprintf(name, sizeof name, "tmv %d between, pdl %d", nb, pdl);
            report(name, step_time([&](cudaStream_t st, int s, uint16_t* p) {
                       const int n = STEP[s].n, k = STEP[s].k;
                       cudaLaunchAttribute at[1];
                       at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
                       at[0].val.programmaticStreamSerializationAllowed = 1;
                       cudaLaunchConfig_t c = {};
                       c.gridDim = dim3((n + 15) / 16, 1);
                       c.blockDim = dim3(256);
                       c.dynamicSmemBytes = TM_WARPS * TV_STAGE;
                       c.stream = st;
                       c.attrs = at;
                       c.numAttrs = pdl;
                       CK(cudaLaunchKernelEx(&c, tmv_bf16_8_1, y, (const float4*)x, (const uint8_t*)p, 1, n, k));
                       for (int b = 0; b < nb; b++) {
                           cudaLaunchConfig_t cb = {};
                           cb.gridDim = dim3(16);
                           cb.blockDim = dim3(256);
                           cb.stream = st;
                           cb.attrs = at;
                           cb.numAttrs = pdl;
                           CK(cudaLaunchKernelEx(&cb, between, x, (const float*)y, n, 4096));
                       }
                   }));
        }
    }
    // L2 prefetch branch: the step's matmuls in order, NB small kernels after each; a side
    // stream of the graph puts the next matmul's first P bytes into L2, forked after the
    // matmul before it (mode 1: beside the small kernels) or before it (mode 2: beside it too).
    {
        struct Call {
            int s;
            uint16_t* p;
        };
        std::vector<Call> seq;
        for (int layer = 0; layer < 32; layer++) {
            const bool gdn = layer % 4 != 3;
            const int li = gdn ? layer - layer / 4 : layer / 4;
            seq.push_back({gdn ? 0 : 2, ws[gdn ? 0 : 2][li]});
            seq.push_back({gdn ? 1 : 3, ws[gdn ? 1 : 3][li]});
            seq.push_back({4, ws[4][layer]});
            seq.push_back({5, ws[5][layer]});
        }
        seq.push_back({6, ws[6][0]});
        cudaStream_t st, side;
        CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
        CK(cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking));
        cudaEvent_t ev, evs;
        CK(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
        CK(cudaEventCreateWithFlags(&evs, cudaEventDisableTiming));
        auto pf_step = [&](int nb, int mode, size_t P, int bulk) {
            auto prefetch = [&](int j) {
                const Call& c = seq[j];
                const size_t bytes = std::min(P, (size_t)STEP[c.s].n * STEP[c.s].k * 2);
                CK(cudaEventRecord(ev, st));
                CK(cudaStreamWaitEvent(side, ev, 0));
                if (bulk)
                    l2_prefetch_bulk<<<8, 128, 0, side>>>((const char*)c.p, bytes);
                else
                    l2_prefetch_lines<<<64, 256, 0, side>>>((const char*)c.p, bytes);
            };
            CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
            const int n = (int)seq.size();
            for (int j = 0; j < n; j++) {
                if (mode == 2 && j + 1 < n) prefetch(j + 1);
                const int nn = STEP[seq[j].s].n, k = STEP[seq[j].s].k;
                tmv_bf16_8_1<<<dim3((nn + 15) / 16, 1), 256, TM_WARPS * TV_STAGE, st>>>(
                    y, (const float4*)x, (const uint8_t*)seq[j].p, 1, nn, k);
                if (mode == 1 && j + 1 < n) prefetch(j + 1);
                for (int b = 0; b < nb; b++) between<<<16, 256, 0, st>>>(x, (const float*)y, nn, 4096);
            }
            if (mode) {
                CK(cudaEventRecord(evs, side));
                CK(cudaStreamWaitEvent(st, evs, 0));
            }
            return graph_ms(st);
        };
        for (int nb : {0, 3, 8}) {
            char name[64];
            snprintf(name, sizeof name, "pf nb=%d none", nb);
            report(name, pf_step(nb, 0, 0, 0));
            for (int mode : {1, 2})
                for (int bulk : {0, 1})
                    for (size_t mb : {8, 16, 32}) {
                        snprintf(name, sizeof name, "pf nb=%d mode=%d %s %zuMB", nb, mode, bulk ? "bulk" : "lines", mb);
                        report(name, pf_step(nb, mode, mb << 20, bulk));
                    }
        }
    }
    printf("\ncheck failures: %d\n", fails);
    return fails ? 1 : 0;
}
