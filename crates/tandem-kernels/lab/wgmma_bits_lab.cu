// A lab for issue 16's target 4 (not part of the build; `scripts/gpu-wgmma-bits.sh` compiles
// and runs it on the device machine): does Hopper's warpgroup MMA give the bits of mma.sync?
// tandem's bf16 matmuls are row-invariant because every kernel adds each output's products
// through the same chain of `mma.sync.m16n8k16` (cuda/tmma.cu); a wgmma GEMM can join that
// chain only if one `wgmma.m64n8k16` over the same 16 values and the same accumulator gives
// the same f32 bits as one `mma.sync.m16n8k16`. Three checks, each over many random tiles with
// wide exponent ranges (so that the alignment and rounding of the sum matter):
//   1. one k16 step, accumulator from random f32: wgmma (A and B from shared memory, no
//      swizzle, K-major) against mma.sync (the same rows, the same k slots);
//   2. a chain of 8 steps into one accumulator, both ways;
//   3. mma.sync against itself with the 16 k slots permuted (A and B alike): whether the
//      tensor core's sum depends on the slot order at all (if not, only the set of 16 values
//      per instruction must match, which widens the layouts a wgmma kernel may use).
// Prints the number of differing outputs of each check.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include <cuda_bf16.h>

#include "lab_common.cuh"

constexpr int M = 64, N = 8, K = 16, STEPS = 8;

__device__ __forceinline__ void mma16816(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                         uint32_t b0, uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// A shared-memory matrix descriptor, no swizzle: start address, the byte distance between core
// matrices adjacent along K (leading) and along M / N (stride), each in 16-byte units.
__device__ __forceinline__ uint64_t desc(const void* smem, uint32_t lbo, uint32_t sbo) {
    const uint32_t a = (uint32_t)__cvta_generic_to_shared(smem);
    return (uint64_t)((a >> 4) & 0x3fff) | ((uint64_t)((lbo >> 4) & 0x3fff) << 16) |
           ((uint64_t)((sbo >> 4) & 0x3fff) << 32);
}

__device__ __forceinline__ void wgmma_m64n8k16(float (&d)[4], uint64_t da, uint64_t db) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n8k16.f32.bf16.bf16 {%0, %1, %2, %3}, %4, %5, p, 1, 1, 0, 0;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "l"(da), "l"(db));
}

// Core-matrix layout of a K-major tile of R rows x 16 bf16 in shared memory: core matrix (r / 8,
// k / 8) at ((r / 8) * 2 + k / 8) * 128 bytes, its row r % 8 at 16 (r % 8) bytes, 8 values each.
// So core matrices adjacent along K are 128 bytes apart (LBO) and along rows 256 (SBO).
__device__ __forceinline__ int cm_index(int r, int k) { return ((r >> 3) * 2 + (k >> 3)) * 64 + (r & 7) * 8 + (k & 7); }

// One block = one warpgroup (128 threads). For tile i: A [STEPS][M][K], B [STEPS][N][K] (bf16 bits,
// B stored as N rows of K), C [M][N] f32. Outputs D [M][N] of each method.
//   wg: wgmma chain; mm: mma.sync chain; mp: mma.sync chain with the k slots permuted by perm.
__global__ void __launch_bounds__(128) run_tiles(const uint16_t* __restrict__ A, const uint16_t* __restrict__ B,
                                                 const float* __restrict__ C, float* __restrict__ wg,
                                                 float* __restrict__ mm, float* __restrict__ mp, int steps,
                                                 const int* __restrict__ perm, int swap) {
    __shared__ __align__(128) uint16_t sa[M * K];
    __shared__ __align__(128) uint16_t sb[N * K];
    const int tile = blockIdx.x, tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int g = lane >> 2, t = lane & 3;
    const uint16_t* a = A + (size_t)tile * STEPS * M * K;
    const uint16_t* b = B + (size_t)tile * STEPS * N * K;
    const float* c = C + (size_t)tile * M * N;
    // Accumulator fragments (rows 16 warp + g and + 8, columns 2t and 2t + 1), as both give them.
    const int r0 = 16 * warp + g, r1 = r0 + 8, c0 = 2 * t;
    float dw[4] = {c[r0 * N + c0], c[r0 * N + c0 + 1], c[r1 * N + c0], c[r1 * N + c0 + 1]};
    float dm[4] = {dw[0], dw[1], dw[2], dw[3]};
    float dp[4] = {dw[0], dw[1], dw[2], dw[3]};
    auto pair = [](const uint16_t* row, int k0, int k1) {
        return (uint32_t)row[k0] | ((uint32_t)row[k1] << 16);
    };
    for (int s = 0; s < steps; s++) {
        const uint16_t* as = a + (size_t)s * M * K;
        const uint16_t* bs = b + (size_t)s * N * K;
        __syncthreads();
        for (int i = tid; i < M * K; i += 128) sa[cm_index(i / K, i % K)] = as[i];
        for (int i = tid; i < N * K; i += 128) sb[cm_index(i / K, i % K)] = bs[i];
        // Each thread's shared-memory writes made visible to the async proxy, then the barrier.
        asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
        __syncthreads();
        asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
        // swap = 1 reads the two offsets the other way round (in case the layout's naming is
        // the reverse of this reading of the PTX manual; the f64 check tells which is right).
        const uint32_t lbo = swap ? 256 : 128, sbo = swap ? 128 : 256;
        wgmma_m64n8k16(dw, desc(sa, lbo, sbo), desc(sb, lbo, sbo));
        asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
        asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
        // mma.sync: warp w takes rows 16w .. 16w + 15, the canonical k slots.
        const uint16_t *ar0 = as + r0 * K, *ar1 = as + r1 * K, *bc = bs + g * K;
        mma16816(dm, pair(ar0, 2 * t, 2 * t + 1), pair(ar1, 2 * t, 2 * t + 1), pair(ar0, 2 * t + 8, 2 * t + 9),
                 pair(ar1, 2 * t + 8, 2 * t + 9), pair(bc, 2 * t, 2 * t + 1), pair(bc, 2 * t + 8, 2 * t + 9));
        // The same products with the slots permuted: slot j holds value perm[j].
        const int j0 = 2 * t, j1 = 2 * t + 1, j2 = 2 * t + 8, j3 = 2 * t + 9;
        mma16816(dp, pair(ar0, perm[j0], perm[j1]), pair(ar1, perm[j0], perm[j1]), pair(ar0, perm[j2], perm[j3]),
                 pair(ar1, perm[j2], perm[j3]), pair(bc, perm[j0], perm[j1]), pair(bc, perm[j2], perm[j3]));
    }
    float* outs[3] = {wg, mm, mp};
    float* ds[3] = {dw, dm, dp};
    for (int o = 0; o < 3; o++) {
        float* out = outs[o] + (size_t)tile * M * N;
        out[r0 * N + c0] = ds[o][0];
        out[r0 * N + c0 + 1] = ds[o][1];
        out[r1 * N + c0] = ds[o][2];
        out[r1 * N + c0 + 1] = ds[o][3];
    }
}

// bf16 values with exponents spread over about 2^-12 .. 2^12, both signs, some exact zeros.
static uint16_t rand_bf16(uint64_t& s) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    const uint32_t h = (uint32_t)(s >> 33);
    if ((h & 63) == 0) return 0;
    const int e = 127 - 12 + (int)((h >> 6) % 25);
    const uint32_t mant = (h >> 11) & 0x7f, sign = (h >> 31) & 1;
    return (uint16_t)((sign << 15) | ((uint32_t)e << 7) | mant);
}

static size_t differ(const std::vector<float>& a, const std::vector<float>& b) {
    size_t n = 0;
    for (size_t i = 0; i < a.size(); i++) n += memcmp(&a[i], &b[i], 4) != 0;
    return n;
}

int main() {
    CK(cudaSetDevice(0));
    const int tiles = 4096;
    std::vector<uint16_t> A((size_t)tiles * STEPS * M * K), B((size_t)tiles * STEPS * N * K);
    std::vector<float> C((size_t)tiles * M * N);
    uint64_t s = 12345;
    for (auto& v : A) v = rand_bf16(s);
    for (auto& v : B) v = rand_bf16(s);
    for (auto& v : C) {
        const uint16_t h = rand_bf16(s);
        uint32_t bits = (uint32_t)h << 16 | (uint32_t)(s >> 40 & 0xffff);
        memcpy(&v, &bits, 4);
    }
    // A slot permutation that keeps pairs together (the mma reads two values per register)
    // and moves every pair: slot pair p <- value pair (5 p + 3) mod 8.
    int perm[16];
    for (int p = 0; p < 8; p++) perm[2 * p] = 2 * ((5 * p + 3) % 8), perm[2 * p + 1] = perm[2 * p] + 1;
    uint16_t *dA, *dB;
    float *dC, *wg, *mm, *mp;
    int* dperm;
    CK(cudaMalloc(&dA, A.size() * 2));
    CK(cudaMalloc(&dB, B.size() * 2));
    CK(cudaMalloc(&dC, C.size() * 4));
    CK(cudaMalloc(&wg, C.size() * 4));
    CK(cudaMalloc(&mm, C.size() * 4));
    CK(cudaMalloc(&mp, C.size() * 4));
    CK(cudaMalloc(&dperm, sizeof(perm)));
    CK(cudaMemcpy(dA, A.data(), A.size() * 2, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dB, B.data(), B.size() * 2, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dC, C.data(), C.size() * 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dperm, perm, sizeof(perm), cudaMemcpyHostToDevice));
    int bad = 0;
    auto far_from_f64 = [&](const std::vector<float>& got, int steps) {
        auto f = [](uint16_t h) {
            uint32_t b = (uint32_t)h << 16;
            float v;
            memcpy(&v, &b, 4);
            return (double)v;
        };
        size_t far = 0;
        for (int tile = 0; tile < tiles; tile++)
            for (int r = 0; r < M; r++)
                for (int c = 0; c < N; c++) {
                    double ref = C[(size_t)tile * M * N + r * N + c];
                    for (int st = 0; st < steps; st++)
                        for (int k = 0; k < K; k++)
                            ref += f(A[(((size_t)tile * STEPS + st) * M + r) * K + k]) *
                                   f(B[(((size_t)tile * STEPS + st) * N + c) * K + k]);
                    const double v = got[(size_t)tile * M * N + r * N + c];
                    if (fabs(v - ref) > 1e-3 * (fabs(ref) + 1.0)) far++;
                }
        return far;
    };
    for (int swap : {0, 1}) {
        for (int steps : {1, STEPS}) {
            run_tiles<<<tiles, 128>>>(dA, dB, dC, wg, mm, mp, steps, dperm, swap);
            CK(cudaGetLastError());
            CK(cudaDeviceSynchronize());
            std::vector<float> hw(C.size()), hm(C.size()), hp(C.size());
            CK(cudaMemcpy(hw.data(), wg, hw.size() * 4, cudaMemcpyDeviceToHost));
            CK(cudaMemcpy(hm.data(), mm, hm.size() * 4, cudaMemcpyDeviceToHost));
            CK(cudaMemcpy(hp.data(), mp, hp.size() * 4, cudaMemcpyDeviceToHost));
            const size_t fw = far_from_f64(hw, steps), fm = far_from_f64(hm, steps);
            const size_t w = differ(hw, hm), p = differ(hp, hm);
            printf("offsets %s, %d step(s): wgmma vs mma.sync %zu of %zu outputs differ; mma.sync with permuted "
                   "slots vs canonical %zu differ; far from the f64 sum: wgmma %zu, mma.sync %zu\n",
                   swap ? "swapped" : "as read", steps, w, hm.size(), p, fw, fm);
            if (fw == 0 && fm == 0) bad += w != 0;
        }
    }
    printf("%s\n", bad ? "where the layout is right (nothing far from f64), wgmma does NOT reproduce mma.sync's bits"
                       : "where the layout is right, wgmma reproduces mma.sync's bits on every output");
    return 0;
}
