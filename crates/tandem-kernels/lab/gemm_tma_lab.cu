// A lab for the bf16 prefill GEMM (issue 16, target 4): the engine's wgmma kernels
// (cuda/tmma_wg.cu: tmmw_bf16, tmmw_bf16_h; TMA tensor maps, a producer thread and two
// consumer warpgroups, partitions folded into a total in shared memory) checked bit for bit
// against tmmg_bf16 / tmmg_bf16_h on odd and real shapes, then timed on the 9B shape's
// matrices with a block a tile and persistent (a block an SM), beside tmmg and cuBLAS's bf16
// GEMM (f32 out) where the lab links against it (LAB_CUBLAS). Not part of the build:
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
};
static const int NV = sizeof(VARIANTS) / sizeof(VARIANTS[0]);

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
    const Shape checks[] = {{"odd", 77, 200, 96},       {"odd", 300, 1000, 2080}, {"one", 1, 64, 32},
                            {"small", 17, 4096, 4096},  {"real", 512, 12352, 4096}, {"down", 333, 4096, 12288},
                            {"wide", 129, 24576, 4096}};
    int fails = 0;
    for (const Shape& s : checks) {
        fill_bf16<<<4096, 256>>>(b.w, (size_t)s.n * s.k, 7 + s.n);
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
    return fails ? 1 : 0;
}
