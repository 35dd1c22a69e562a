// A lab for the bf16 prefill GEMM (issue 16, target 4): the engine's wgmma kernels
// (cuda/tmma_wg.cu: tmmw_bf16, tmmw_bf16_h; TMA tensor maps, a producer thread and two
// consumer warpgroups, partitions folded into a total in shared memory) checked bit for bit
// against tmmg_bf16 / tmmg_bf16_h on odd and real shapes, then timed on the 9B shape's
// matrices with a block a tile and persistent (a block an SM), beside tmmg and cuBLAS's bf16
// GEMM (f32 out) where the lab links against it (LAB_CUBLAS); then the batch kernels
// (tmmw2k_*) against tmmk_bf16. Not part of the build:
// `LAB=tma scripts/gpu-gemm-lab.sh` compiles and runs it on the device machine.
// (The bulk-copy feed from tiled operands, the first form of this kernel, is in git history:
// gemm_bulk_lab.cu, 2026-12-07.)
#include <cuda.h>
#include <cuda_bf16.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "../cuda/tmma.cu"
#include "../cuda/tmma_wg.cu"
#include "lab_common.cuh"
#ifdef LAB_CUBLAS
#include <cublas_v2.h>
#endif

typedef void (*TmaKern)(float*, const CUtensorMap, const CUtensorMap, const CUtensorMap, int, int, int);
typedef void (*TmaKernH)(float*, const CUtensorMap, const CUtensorMap, int, int, int);
typedef void (*TmaKernK)(float*, float*, unsigned*, const CUtensorMap, const CUtensorMap, const CUtensorMap, int, int,
                         int);
typedef void (*TmaKernKH)(float*, float*, unsigned*, const CUtensorMap, const CUtensorMap, int, int, int);
struct Variant {
    const char* name;
    const void* f;
    int br, smem;
    bool lo;
    bool persistent;
};
static const Variant VARIANTS[] = {
    {"tmmw_bf16_h", (const void*)tmmw_bf16_h, TW_H_BR, TwShape<TW_H_BR, TW_H_ST, false>::SMEM, false, false},
    {"tmmw_bf16_h persistent", (const void*)tmmw_bf16_h, TW_H_BR, TwShape<TW_H_BR, TW_H_ST, false>::SMEM, false,
     true},
    {"tmmw_bf16", (const void*)tmmw_bf16, TW_SPLIT_BR, TwShape<TW_SPLIT_BR, TW_SPLIT_ST, true>::SMEM, true, false},
    {"tmmw_bf16 persistent", (const void*)tmmw_bf16, TW_SPLIT_BR, TwShape<TW_SPLIT_BR, TW_SPLIT_ST, true>::SMEM, true,
     true},
    {"tmmw2_bf16_h", (const void*)tmmw2_bf16_h, 128, TwShape<128, TW2_H_ST, false, true>::SMEM, false, false},
    {"tmmw2_bf16_h persistent", (const void*)tmmw2_bf16_h, 128, TwShape<128, TW2_H_ST, false, true>::SMEM, false,
     true},
    {"tmmw2_bf16", (const void*)tmmw2_bf16, 128, TwShape<128, TW2_SPLIT_ST, true, true>::SMEM, true, false},
    {"tmmw2_bf16 persistent", (const void*)tmmw2_bf16, 128, TwShape<128, TW2_SPLIT_ST, true, true>::SMEM, true, true},
};
static const int NV = sizeof(VARIANTS) / sizeof(VARIANTS[0]);

// Every value v (the signed-zero check's weights: -1 everywhere).
__global__ void fill_u16(uint16_t* p, size_t n, uint16_t v) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) p[i] = v;
}

struct Bufs {
    uint16_t *w, *xh, *xl;
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
// A bf16 [rows][k] matrix as boxes of 32 values x box_rows rows in the 64-byte swizzle (what
// the engine's launcher encodes: cuda_tmma_wg.rs).
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

// The activations' halves (row-major: both the reference and the variants read them).
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
static void prepare(const Variant& v, const Bufs& b, int m, int k) { prepare_ref(b, m, k, v.lo); }
static void launch(const Variant& v, float* y, const Bufs& b, int m, int n, int k) {
    static int sms = 0;
    if (!sms) CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    const int tiles = ((m + v.br - 1) / v.br) * ((n + TW_BC - 1) / TW_BC);
    const int grid = v.persistent ? std::min(sms, tiles) : tiles;
    const CUtensorMap tw = tensor_map(b.w, n, k, TW_BC), th = tensor_map(b.xh, m, k, v.br);
    if (v.lo) {
        const CUtensorMap tl = tensor_map(b.xl, m, k, v.br);
        ((TmaKern)v.f)<<<grid, 384, v.smem>>>(y, tw, th, tl, m, n, k);
    } else {
        ((TmaKernH)v.f)<<<grid, 384, v.smem>>>(y, tw, th, m, n, k);
    }
}

struct Shape {
    const char* what;
    int m, n, k;
};

// The batch GEMM (tmmk_bf16's calls: 17-64 rows): tmmw2k_* against tmmk_bf16, both followed
// by tmmk_sum, bit for bit, then timed with the weights' bytes per microsecond (these calls
// are bound by the weights' bytes).
struct KVariant {
    const char* name;
    const void* f;
    int smem;
    bool lo;
};
static const KVariant KVARIANTS[] = {
    {"tmmw2k_bf16_1", (const void*)tmmw2k_bf16_1, TwShape<64, TWK_ST1, true, true>::SMEM, true},
    {"tmmw2k_bf16_2", (const void*)tmmw2k_bf16_2, TwShape<64, TWK_ST2, true, true>::SMEM, true},
    {"tmmw2k_bf16_h_1", (const void*)tmmw2k_bf16_h_1, TwShape<64, TWK_H_ST1, false, true>::SMEM, false},
    {"tmmw2k_bf16_h_2", (const void*)tmmw2k_bf16_h_2, TwShape<64, TWK_H_ST2, false, true>::SMEM, false},
};
static const int NKV = sizeof(KVARIANTS) / sizeof(KVARIANTS[0]);

static void launch_tmmk(float* y, float* part, const Bufs& b, int m, int n, int k, bool lo) {
    dim3 grid((m + 63) / 64, (n + 63) / 64, TM_WARPS);
    if (lo)
        tmmk_bf16<<<grid, 256, 36864>>>(part, (const uint4*)b.xh, (const uint4*)b.xl, (const uint4*)b.w, m, n, k);
    else
        tmmk_bf16_h<<<grid, 256, 24576>>>(part, (const uint4*)b.xh, (const uint4*)b.w, m, n, k);
    const long long mn = (long long)m * n;
    tmmk_sum<<<(unsigned)((mn + 255) / 256), 256>>>(y, part, mn);
}
// Tile counters for the in-kernel sum (cnt: zero between calls, as the engine keeps them).
static unsigned* g_cnt = nullptr;
// fused: each tile's last block adds the partials into y (the engine's TANDEM_BF16_BATCH_SUM=
// kernel); otherwise tmmk_sum does, in a launch of its own.
static void launch_k(const KVariant& v, float* y, float* part, const Bufs& b, int m, int n, int k,
                     bool fused = false) {
    dim3 grid(((m + 63) / 64) * ((n + TW_BC - 1) / TW_BC), TM_WARPS);
    if (fused && g_cnt == nullptr) {
        CK(cudaMalloc(&g_cnt, 4096 * sizeof(unsigned)));
        CK(cudaMemset(g_cnt, 0, 4096 * sizeof(unsigned)));
    }
    float* yk = fused ? y : nullptr;
    unsigned* cnt = fused ? g_cnt : nullptr;
    const CUtensorMap tw = tensor_map(b.w, n, k, TW_BC), th = tensor_map(b.xh, m, k, 64);
    if (v.lo) {
        const CUtensorMap tl = tensor_map(b.xl, m, k, 64);
        ((TmaKernK)v.f)<<<grid, 384, v.smem>>>(part, yk, cnt, tw, th, tl, m, n, k);
    } else {
        ((TmaKernKH)v.f)<<<grid, 384, v.smem>>>(part, yk, cnt, tw, th, m, n, k);
    }
    if (fused) return;
    const long long mn = (long long)m * n;
    tmmk_sum<<<(unsigned)((mn + 255) / 256), 256>>>(y, part, mn);
}

static int skinny(const Bufs& b, float* y0, float* y1, float* part) {
    for (int i = 0; i < NKV; i++)
        CK(cudaFuncSetAttribute(KVARIANTS[i].f, cudaFuncAttributeMaxDynamicSharedMemorySize, KVARIANTS[i].smem));
    const Shape checks[] = {{"odd", 17, 200, 96},       {"odd", 50, 1000, 2080},  {"b64", 64, 12352, 4096},
                            {"b32", 32, 4096, 12288},   {"b64", 64, 24576, 4096}, {"b100", 100, 4096, 4096}};
    int fails = 0;
    for (const Shape& s : checks) {
        fill_bf16<<<4096, 256>>>(b.w, (size_t)s.n * s.k, 11 + s.n);
        std::vector<float> ref[2], got((size_t)s.m * s.n);
        for (int lo = 0; lo < 2; lo++) {
            prepare_ref(b, s.m, s.k, lo);
            launch_tmmk(y0, part, b, s.m, s.n, s.k, lo);
            ref[lo].resize(got.size());
            CK(cudaMemcpy(ref[lo].data(), y0, got.size() * 4, cudaMemcpyDeviceToHost));
        }
        // Each variant with tmmk_sum and with the in-kernel sum (twice: the counters must be
        // back at zero after a call).
        for (int i = 0; i < NKV; i++)
            for (int f = 0; f < 3; f++) {
                const KVariant& v = KVARIANTS[i];
                CK(cudaMemset(y1, 0xff, got.size() * 4));
                prepare_ref(b, s.m, s.k, v.lo);
                launch_k(v, y1, part, b, s.m, s.n, s.k, f > 0);
                CK(cudaGetLastError());
                CK(cudaMemcpy(got.data(), y1, got.size() * 4, cudaMemcpyDeviceToHost));
                size_t bad = 0, first = 0;
                for (size_t e = 0; e < got.size(); e++)
                    if (memcmp(&ref[v.lo][e], &got[e], 4) != 0 && bad++ == 0) first = e;
                if (bad) {
                    fails++;
                    printf("FAIL %s%s %s m%d n%d k%d: %zu of %zu differ (first at row %zu col %zu: %g vs %g)\n",
                           v.name, f ? " (in-kernel sum)" : "", s.what, s.m, s.n, s.k, bad, got.size(), first / s.n,
                           first % s.n, got[first], ref[v.lo][first]);
                }
            }
    }
    printf("skinny bits: %d failures over %d variants x 3 sums x %d shapes\n", fails, NKV,
           (int)(sizeof(checks) / sizeof(checks[0])));
    const Shape shapes[] = {{"gdn in_proj", 64, 12352, 4096}, {"ffn gate+up", 64, 24576, 4096},
                            {"ffn down", 64, 4096, 12288},   {"out_proj", 64, 4096, 4096},
                            {"gate+up b32", 32, 24576, 4096}, {"gate+up b128", 128, 24576, 4096}};
    printf("| shape (GB/s of weights) | tmmk_bf16 | tmmk_bf16_h |");
    for (int i = 0; i < NKV; i++) printf(" %s | %s, in-kernel sum |", KVARIANTS[i].name, KVARIANTS[i].name);
    printf("\n");
    for (const Shape& s : shapes) {
        fill_bf16<<<4096, 256>>>(b.w, (size_t)s.n * s.k, 7);
        const double bytes = 2.0 * s.n * s.k;
        printf("| %s %dx%dx%d |", s.what, s.m, s.n, s.k);
        for (int lo = 1; lo >= 0; lo--) {
            prepare_ref(b, s.m, s.k, lo);
            const double us = time_us([&] { launch_tmmk(y1, part, b, s.m, s.n, s.k, lo); });
            printf(" %.1f us %.0f |", us, bytes / us / 1e3);
        }
        for (int i = 0; i < NKV; i++)
            for (int f = 0; f < 2; f++) {
                prepare_ref(b, s.m, s.k, KVARIANTS[i].lo);
                const double us = time_us([&] { launch_k(KVARIANTS[i], y1, part, b, s.m, s.n, s.k, f == 1); });
                printf(" %.1f us %.0f |", us, bytes / us / 1e3);
            }
        printf("\n");
    }
    return fails;
}

int main() {
    CK(cudaSetDevice(0));
    for (int i = 0; i < NV; i++)
        CK(cudaFuncSetAttribute(VARIANTS[i].f, cudaFuncAttributeMaxDynamicSharedMemorySize, VARIANTS[i].smem));
    const size_t WE = (size_t)24576 * 12288, XE = (size_t)4096 * 12288;  // W: the largest shape
    Bufs b;
    float *y0, *y1;
    CK(cudaMalloc(&b.w, WE * 2));
    CK(cudaMalloc(&b.x, XE * 4));
    for (uint16_t** p : {&b.xh, &b.xl}) CK(cudaMalloc(p, XE * 2));
    CK(cudaMalloc(&y0, (size_t)4096 * 24576 * 4));
    CK(cudaMalloc(&y1, (size_t)4096 * 24576 * 4));
    fill_f32<<<4096, 256>>>(b.x, XE, 99);
#ifdef LAB_CUBLAS
    cublasHandle_t cb;
    if (cublasCreate(&cb) != CUBLAS_STATUS_SUCCESS) return 2;
#endif

    // Bits: every variant against tmmg_bf16 (split) / tmmg_bf16_h (bf16) on odd and real shapes.
    // "zeros": activations +0 and weights -1, every product -0 (tmmg's accumulators start at
    // +0; tmmw2's partitions start with scale-d = 0 and fold with "+ 0.f"), then random again.
    const Shape checks[] = {{"odd", 77, 200, 96},       {"odd", 300, 1000, 2080}, {"one", 1, 64, 32},
                            {"small", 17, 4096, 4096},  {"real", 512, 12352, 4096}, {"down", 333, 4096, 12288},
                            {"wide", 129, 24576, 4096}, {"zeros", 130, 300, 4096}};
    int fails = 0;
    for (const Shape& s : checks) {
        const bool zeros = strcmp(s.what, "zeros") == 0;
        if (zeros) {
            fill_u16<<<1024, 256>>>(b.w, (size_t)s.n * s.k, 0xBF80);
            CK(cudaMemset(b.x, 0, (size_t)s.m * s.k * 4));
        } else {
            fill_bf16<<<4096, 256>>>(b.w, (size_t)s.n * s.k, 7 + s.n);
        }
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
        if (zeros) {
            uint32_t u;
            memcpy(&u, &ref[0][0], 4);
            printf("zeros: tmmg_bf16_h's y[0] bits %08x\n", u);
            fill_f32<<<4096, 256>>>(b.x, XE, 99);
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
    printf(" bf16_hi_rows | bf16_split_rows |\n");
    for (const Shape& s : shapes) {
        fill_bf16<<<4096, 256>>>(b.w, (size_t)s.n * s.k, 7);
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
        const double hu = time_us([&] { bf16_hi_rows<<<(unsigned)((tot + 255) / 256), 256>>>(b.xh, b.x, tot); });
        const double su =
            time_us([&] { bf16_split_rows<<<(unsigned)((tot + 255) / 256), 256>>>(b.xh, b.xl, b.x, tot); });
        printf(" %.0f us | %.0f us |\n", hu, su);
    }
    float* part;
    CK(cudaMalloc(&part, (size_t)TM_WARPS * 128 * 24576 * 4));
    fails += skinny(b, y0, y1, part);
    return fails ? 1 : 0;
}
