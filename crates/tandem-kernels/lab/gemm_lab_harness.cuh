// The bf16 GEMM labs' harness (gemm_bf16_lab.cu; not part of the build):
// a lab lists its variants (the first being tmmg_bf16, the reference) and calls gemm_lab_main,
// which checks every variant bit for bit against the first on odd and real shapes, then times
// them on the Qwen3.5-9B shape's matrices at 4,096 rows (useful TFLOP/s: 2 m n k a call).
// LAB_PROFILE=1: one launch of each on the gate+up shape only (for Nsight Compute).
#pragma once
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "lab_common.cuh"

typedef void (*Kern)(float*, const uint4*, const uint4*, const uint4*, int, int, int);
// A variant: its kernel, block tile (br rows x bc columns) and dynamic shared memory.
struct Variant {
    const char* name;
    Kern f;
    int br, bc, smem;
};

struct Bufs {
    uint16_t *w, *xh, *xl;
    float* x;
};

static void split(const Bufs& b, int m, int k) {
    const long long tot = (long long)m * k;
    bf16_split_rows<<<(unsigned)((tot + 255) / 256), 256>>>(b.xh, b.xl, b.x, tot);
}

static void launch(const Variant& v, float* y, const Bufs& b, int m, int n, int k) {
    dim3 grid((m + v.br - 1) / v.br, (n + v.bc - 1) / v.bc);
    v.f<<<grid, 256, v.smem>>>(y, (const uint4*)b.xh, (const uint4*)b.xl, (const uint4*)b.w, m, n, k);
}

struct Shape {
    const char* what;
    int m, n, k;
};

static int gemm_lab_main(const Variant* VARIANTS, int NV) {
    CK(cudaSetDevice(0));
    for (int i = 1; i < NV; i++)
        CK(cudaFuncSetAttribute(VARIANTS[i].f, cudaFuncAttributeMaxDynamicSharedMemorySize, VARIANTS[i].smem));
    const size_t MAXE = (size_t)4096 * 24576;
    Bufs b;
    float *y0, *y1;
    const size_t XE = (size_t)4096 * 12288;
    CK(cudaMalloc(&b.w, MAXE * 2));
    CK(cudaMalloc(&b.x, XE * 4));
    for (uint16_t** p : {&b.xh, &b.xl}) CK(cudaMalloc(p, XE * 2));
    CK(cudaMalloc(&y0, (size_t)4096 * 24576 * 4));
    CK(cudaMalloc(&y1, (size_t)4096 * 24576 * 4));
    fill_bf16<<<4096, 256>>>(b.w, MAXE, 7);
    fill_f32<<<4096, 256>>>(b.x, XE, 99);
    // LAB_PROFILE=1: one launch of each variant on the gate+up shape only (for Nsight Compute).
    if (getenv("LAB_PROFILE")) {
        split(b, 4096, 4096);
        for (int i = 0; i < NV; i++) launch(VARIANTS[i], y1, b, 4096, 24576, 4096);
        CK(cudaDeviceSynchronize());
        return 0;
    }
    // Bits: every variant against tmmg_bf16 on odd and real shapes.
    const Shape checks[] = {{"odd", 77, 200, 96},       {"odd", 300, 1000, 2080}, {"one", 1, 64, 32},
                            {"small", 17, 4096, 4096},  {"real", 512, 12352, 4096}, {"down", 333, 4096, 12288},
                            {"wide", 129, 24576, 4096}};
    int fails = 0;
    for (const Shape& s : checks) {
        split(b, s.m, s.k);
        launch(VARIANTS[0], y0, b, s.m, s.n, s.k);
        std::vector<float> a((size_t)s.m * s.n), got(a.size());
        CK(cudaMemcpy(a.data(), y0, a.size() * 4, cudaMemcpyDeviceToHost));
        for (int i = 1; i < NV; i++) {
            CK(cudaMemset(y1, 0xff, a.size() * 4));
            launch(VARIANTS[i], y1, b, s.m, s.n, s.k);
            CK(cudaGetLastError());
            CK(cudaMemcpy(got.data(), y1, got.size() * 4, cudaMemcpyDeviceToHost));
            size_t bad = 0;
            for (size_t e = 0; e < a.size(); e++) bad += memcmp(&a[e], &got[e], 4) != 0;
            if (bad) {
                fails++;
                printf("FAIL %s %s m%d n%d k%d: %zu of %zu differ\n", VARIANTS[i].name, s.what, s.m, s.n, s.k, bad,
                       a.size());
            }
        }
    }
    printf("bits: %d failures over %d variants x %d shapes\n", fails, NV - 1, (int)(sizeof(checks) / sizeof(checks[0])));

    // Time: the 9B shape's matrices at 4,096 rows (and 512).
    // LAB_ROWS=32,64: the four matrices at those row counts instead (batched decode's calls).
    std::vector<Shape> shapes = {{"gdn in_proj", 4096, 12352, 4096}, {"ffn gate+up", 4096, 24576, 4096},
                                 {"ffn down", 4096, 4096, 12288},   {"out_proj", 4096, 4096, 4096},
                                 {"gate+up pp512", 512, 24576, 4096}};
    if (const char* rows = getenv("LAB_ROWS")) {
        std::vector<Shape> base(shapes.begin(), shapes.begin() + 4);
        shapes.clear();
        for (const char* r = rows; *r;) {
            const int m = atoi(r);
            for (Shape s : base) shapes.push_back({s.what, m, s.n, s.k});
            while (*r && *r != ',') r++;
            if (*r) r++;
        }
    }
    printf("| shape | m x n x k |");
    for (int i = 0; i < NV; i++) printf(" %s |", VARIANTS[i].name);
    printf("\n|---|---|");
    for (int i = 0; i < NV; i++) printf("---|");
    printf("\n");
    for (const Shape& s : shapes) {
        split(b, s.m, s.k);
        printf("| %s | %d x %d x %d |", s.what, s.m, s.n, s.k);
        for (int i = 0; i < NV; i++) {
            const double us = time_us([&] { launch(VARIANTS[i], y1, b, s.m, s.n, s.k); });
            printf(" %.0f us %.0f TF |", us, 2.0 * s.m * s.n * s.k / (us * 1e-6) / 1e12);
        }
        printf("\n");
    }
    return fails ? 1 : 0;
}
