// The K-quant GEMM for calls of many rows (prefill chunks, big batches): y [m, n] f32 =
// x [m, k] . W [n, k]^T with W in Q4_K / Q5_K / Q6_K rows and x quantised by kqmma.cu's
// q8k_quantize_rows, on the chain kqmma.cu's header defines (the same bits as its GEMV
// and small-tile GEMM for every row).
//
// qkgemm<BT>_<t>: a block per BT output columns x BT rows (BT = 64: eight warps of 32 columns x
//   16 rows, two blocks an SM; BT = 128: sixteen warps of 32 columns x 32 rows, one block an
//   SM, so each decoded superblock serves twice the rows and each fragment read twice the
//   mma), each warp two m16 column tiles x RT n8 row tiles. Superblock by superblock: the
//   block's BT weight rows (the 16-byte aligned windows around them) and its BT activation
//   rows with their scales come into shared memory by cp.async, the next superblock's while
//   this one is computed; the whole block then decodes the superblock once into int8 codes
//   and integer scales (q4_k / q5_k: each sub-block's scale and min, the mins packed as bytes,
//   d and dmin; q6_k: the two 16-value scales and d), where kqmma.cu's GEMM decodes them per
//   warp and use; and each warp runs int8 mma.sync (m16n8k32; m16n8k16 for q6_k's halves) on
//   the decoded codes, the integer sums I (and M) of its outputs, and their superblock terms.
//   Dynamic shared memory: KbLayout<KT, BT>::BYTES (BT = 64: 80,416 bytes for q4_k, 90,656 for
//   q6_k; the host computes the same).
#include "kquant.cuh"

#define KB_WS 272  // bytes per decoded weight column and staged activation row: 256 codes + 16
#define KB_XD 32   // bytes per row of a staged activation superblock's sums (16) and dx (4)
#define KB_WF 9    // int2 per column of the weights' scales: 8 sub-blocks + 1

// BT columns (KB_BN) and BT rows (KB_BM) a block.
template <int KT, int BT>
struct KbLayout {
    static constexpr int KB_BN = BT, KB_BM = BT;
    static constexpr int ST = kq_stride<KT>();
    static constexpr int RAW_BYTES = KB_BN * ST + 16;              // a stage of raw superblocks
    static constexpr int RAW = 0;                                  // [2][RAW_BYTES]
    static constexpr int XQ = RAW + 2 * RAW_BYTES;                 // [2][KB_BM][KB_WS] codes
    static constexpr int XD = XQ + 2 * KB_BM * KB_WS;              // [2][KB_BM][KB_XD]: xs, dx
    static constexpr int WQ = XD + 2 * KB_BM * KB_XD;              // [KB_BN][KB_WS] decoded codes
    static constexpr int WF = WQ + KB_BN * KB_WS;                  // [KB_BN][KB_WF] int2 scales
    static constexpr int WD = WF + KB_BN * KB_WF * 8;              // [KB_BN] float2: d, dmin
    static constexpr int WM = WD + KB_BN * 8;                      // [KB_BN] uint2: the mins as bytes
    static constexpr int BYTES = WM + KB_BN * 8;
};

// BT = 64 or 128; 4 BT threads (a weight column and an activation row to each four of them
// when staging); warps of 32 columns x RT = BT / 32 row tiles of 8 (WC = BT / 32 warps across the
// columns, four down the rows).
template <int KT, int BT>
__device__ void qkgemm_big(float* __restrict__ y, const int8_t* __restrict__ xq, const float* __restrict__ dx,
                         const int16_t* __restrict__ xs, const uint8_t* __restrict__ w, int m, int n, int k) {
    using L = KbLayout<KT, BT>;
    constexpr int KB_BN = BT, KB_BM = BT, RT = BT / 32, WC = BT / 32;
    constexpr int BB = kq_bytes<KT>(), ST = L::ST;
    extern __shared__ __align__(16) uint8_t kb_smem[];
    {
        unsigned dyn;
        asm("mov.u32 %0, %%dynamic_smem_size;" : "=r"(dyn));
        if (dyn < (unsigned)L::BYTES) __trap();  // launched with too little shared memory
    }
    if (blockDim.x != 4 * BT) __trap();  // the staging below gives each of 4 BT threads its share
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int g = lane >> 2, tig = lane & 3;
    const int wcol = (warp % WC) * 32, wrow = (warp / WC) * (RT * 8);
    const int row0 = blockIdx.x * KB_BM, col0 = blockIdx.y * KB_BN;
    const int S = k >> 8, nb = k >> 5;
    const long long rb = (long long)S * BB;
    const uint8_t* end = w + (size_t)n * rb;
    uint8_t* const wq = kb_smem + L::WQ;
    int2* const wf = reinterpret_cast<int2*>(kb_smem + L::WF);
    float2* const wd = reinterpret_cast<float2*>(kb_smem + L::WD);
    uint8_t* const wm = kb_smem + L::WM;
    auto raw = [&](int buf) { return kb_smem + L::RAW + buf * L::RAW_BYTES; };
    auto xcodes = [&](int buf) { return kb_smem + L::XQ + buf * KB_BM * KB_WS; };
    auto xsums = [&](int buf) { return kb_smem + L::XD + buf * KB_BM * KB_XD; };
    // Where column c's superblock s starts in its staged window.
    auto win = [&](int c, int s) { return (int)(((long long)c * rb + (long long)s * BB) & 15); };
    // Each thread's share of a stage, fixed for the whole call: weight column
    // t / 4's pieces t % 4, t % 4 + 4, ...; activation row t / 4's codes t % 4 (64 bytes, four
    // pieces); and its code sums (t % 4 = 0: 16 bytes) or scale (t % 4 = 1). Only the superblock moves
    // the sources, so a stage is a few copies a thread (the general loops were a division and
    // a branch a piece: a fifth of the instructions). (256 threads for BT = 64, 512 for 128.)
    const int lr = threadIdx.x >> 2, lq = threadIdx.x & 3;
    const bool wok = col0 + lr < n, xok = row0 + lr < m;
    const long long wbase = (long long)(col0 + lr) * rb;
    auto load = [&](int s, int buf) {
        constexpr int pieces = ST / 16;
        if (wok) {
            const long long off = wbase + (long long)s * BB;
            const uint8_t* src = w + (size_t)(off - (off & 15));
            uint8_t* dst = raw(buf) + lr * ST;
#pragma unroll
            for (int c0 = 0; c0 < pieces; c0 += 4) {
                const int c = c0 + lq;
                if (c < pieces) cp_async16_upto(dst + c * 16, src + c * 16, end);
            }
        }
        if (xok) {
            uint8_t* dst = xcodes(buf) + lr * KB_WS + lq * 64;
            const int8_t* src = xq + (size_t)(row0 + lr) * k + (size_t)s * 256 + lq * 64;
#pragma unroll
            for (int c = 0; c < 4; c++) cp_async16(dst + c * 16, src + c * 16);
            if (lq == 0) cp_async16(xsums(buf) + lr * KB_XD, xs + (size_t)(row0 + lr) * nb + s * 8);
            if (lq == 1) cp_async4(xsums(buf) + lr * KB_XD + 16, dx + (size_t)(row0 + lr) * S + s);
        }
    };
    // The staged superblock s of every column into codes and integer scales (a (column,
    // sub-block) pair per thread and turn).
    auto decode = [&](int s, int buf) {
        for (int t = threadIdx.x; t < KB_BN * 8; t += blockDim.x) {
            const int c = t >> 3, j = t & 7;
            const uint8_t* sb = raw(buf) + c * ST + win(col0 + c, s);
            uint32_t v[8];
#pragma unroll
            for (int i = 0; i < 8; i++) v[i] = kword<KT>(sb, j, i);
            uint4* dst = reinterpret_cast<uint4*>(wq + c * KB_WS + j * 32);
            dst[0] = make_uint4(v[0], v[1], v[2], v[3]);
            dst[1] = make_uint4(v[4], v[5], v[6], v[7]);
            int a, b;
            kscale<KT>(sb, j, &a, &b);
            wf[c * KB_WF + j] = make_int2(a, b);
            if constexpr (KT != KT_Q6_K) wm[c * 8 + j] = (uint8_t)b;
            if (j == 0) {
                float d, dmin;
                kd<KT>(sb, &d, &dmin);
                wd[c] = make_float2(d, dmin);
            }
        }
    };

    load(0, 0);
    cp_async_commit();
    float acc[RT][2][4];
#pragma unroll
    for (int rt = 0; rt < RT; rt++)
#pragma unroll
        for (int ct = 0; ct < 2; ct++)
#pragma unroll
            for (int e = 0; e < 4; e++) acc[rt][ct][e] = 0.f;
    for (int s = 0; s < S; s++) {
        if (s + 1 < S) load(s + 1, (s + 1) & 1);
        cp_async_commit();
        cp_async_wait<1>();
        __syncthreads();  // superblock s staged
        decode(s, s & 1);
        __syncthreads();  // and decoded
        const uint8_t* xb = xcodes(s & 1);
        int isum[RT][2][4];
#pragma unroll
        for (int rt = 0; rt < RT; rt++)
#pragma unroll
            for (int ct = 0; ct < 2; ct++)
#pragma unroll
                for (int e = 0; e < 4; e++) isum[rt][ct][e] = 0;
        if constexpr (KT == KT_Q6_K) {
            // Q6_K: two k16 products and two scales a column tile, row tile and sub-block.
            // With both column tiles' fragments and scales live across the row tiles (the
            // loop below) the 128 tile spilled 212 bytes; column tile by column tile, the row
            // tiles' B fragments loaded once a sub-block, it keeps 4 (9B Q6_K pp512 6,668 ->
            // 7,122 tok/s, H200, 2026-12-07). The same integer sums: exact in any order.
#pragma unroll
            for (int j = 0; j < 8; j++) {
                uint32_t xf[RT][2];
#pragma unroll
                for (int rt = 0; rt < RT; rt++) {
                    const uint8_t* xr = xb + (wrow + rt * 8 + g) * KB_WS + j * 32 + 4 * tig;
                    xf[rt][0] = lds32(xr);
                    xf[rt][1] = lds32(xr + 16);
                }
#pragma unroll
                for (int ct = 0; ct < 2; ct++) {
                    const int c = wcol + ct * 16 + g;
                    const uint8_t* lo = wq + c * KB_WS + j * 32 + 4 * tig;
                    const uint8_t* hi = lo + 8 * KB_WS;
                    const uint32_t a0 = lds32(lo), a1 = lds32(hi), a2 = lds32(lo + 16), a3 = lds32(hi + 16);
                    const int2 f0 = wf[c * KB_WF + j], f1 = wf[(c + 8) * KB_WF + j];
#pragma unroll
                    for (int rt = 0; rt < RT; rt++) {
                        int* is = isum[rt][ct];
                        int d0[4], d1[4];
                        mma_k16(d0, a0, a1, xf[rt][0]);
                        is[0] += f0.x * d0[0];
                        is[1] += f0.x * d0[1];
                        is[2] += f1.x * d0[2];
                        is[3] += f1.x * d0[3];
                        mma_k16(d1, a2, a3, xf[rt][1]);
                        is[0] += f0.y * d1[0];
                        is[1] += f0.y * d1[1];
                        is[2] += f1.y * d1[2];
                        is[3] += f1.y * d1[3];
                    }
                }
            }
        } else {
#pragma unroll
            for (int j = 0; j < 8; j++) {
                // A fragments of the two column tiles: values 4 tig .. and 16 + 4 tig .. of
                // columns g and g + 8 (q4_k / q5_k: one k32 mma a column and row tile). By
                // words rather than ldmatrix (q8gemm.cu): with ldmatrix this kernel takes 128
                // registers and spills, and ran 4% slower on the H100 (9B Q4_K pp512 6,631 against
                // 6,906 tok/s, 2026-12-05).
                uint32_t a[2][4];
                int2 fl[2][2];
#pragma unroll
                for (int ct = 0; ct < 2; ct++) {
                    const int c = wcol + ct * 16 + g;
                    const uint8_t* lo = wq + c * KB_WS + j * 32 + 4 * tig;
                    const uint8_t* hi = lo + 8 * KB_WS;
                    a[ct][0] = lds32(lo);
                    a[ct][1] = lds32(hi);
                    a[ct][2] = lds32(lo + 16);
                    a[ct][3] = lds32(hi + 16);
                    fl[ct][0] = wf[c * KB_WF + j];
                    fl[ct][1] = wf[(c + 8) * KB_WF + j];
                }
#pragma unroll
                for (int rt = 0; rt < RT; rt++) {
                    // The B fragment: row g of the tile, values 4 tig .. and 16 + 4 tig ..; this
                    // lane's outputs are rows 2 tig and 2 tig + 1.
                    const uint8_t* xr = xb + (wrow + rt * 8 + g) * KB_WS + j * 32 + 4 * tig;
                    const uint32_t x0 = lds32(xr), x1 = lds32(xr + 16);
#pragma unroll
                    for (int ct = 0; ct < 2; ct++) {
                        int* is = isum[rt][ct];
                        int d[4];
                        mma_k32(d, a[ct], x0, x1);
                        is[0] += fl[ct][0].x * d[0];
                        is[1] += fl[ct][0].x * d[1];
                        is[2] += fl[ct][1].x * d[2];
                        is[3] += fl[ct][1].x * d[3];
                    }
                }
            }
        }
        // The superblock's terms: this lane's rows' code sums and dx, its columns' d, dmin and
        // mins.
        const uint8_t* xsb = xsums(s & 1);
#pragma unroll
        for (int rt = 0; rt < RT; rt++) {
            const int r0 = wrow + rt * 8 + 2 * tig;
            const uint8_t* x0p = xsb + r0 * KB_XD;
            const uint8_t* x1p = x0p + KB_XD;
            const float dx0 = *reinterpret_cast<const float*>(x0p + 16), dx1 = *reinterpret_cast<const float*>(x1p + 16);
            uint4 xs0 = make_uint4(0u, 0u, 0u, 0u), xs1 = xs0;
            if constexpr (KT != KT_Q6_K) {
                xs0 = *reinterpret_cast<const uint4*>(x0p);
                xs1 = *reinterpret_cast<const uint4*>(x1p);
            }
#pragma unroll
            for (int ct = 0; ct < 2; ct++) {
#pragma unroll
                for (int h = 0; h < 2; h++) {
                    const int c = wcol + ct * 16 + g + 8 * h;
                    const float2 dd = wd[c];
                    int m0 = 0, m1 = 0;
                    if constexpr (KT != KT_Q6_K) {
                        const uint2 mw = *reinterpret_cast<const uint2*>(wm + c * 8);
                        m0 = kq_msum(xs0, mw);
                        m1 = kq_msum(xs1, mw);
                    }
                    float* ac = acc[rt][ct];
                    ac[2 * h] = __fadd_rn(ac[2 * h], kq_term(isum[rt][ct][2 * h], m0, dd.x, dd.y, dx0));
                    ac[2 * h + 1] = __fadd_rn(ac[2 * h + 1], kq_term(isum[rt][ct][2 * h + 1], m1, dd.x, dd.y, dx1));
                }
            }
        }
        __syncthreads();  // every warp is done with this stage and the decoded superblock
    }
#pragma unroll
    for (int rt = 0; rt < RT; rt++) {
#pragma unroll
        for (int ct = 0; ct < 2; ct++) {
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int row = row0 + wrow + rt * 8 + 2 * tig + (e & 1);
                const int col = col0 + wcol + ct * 16 + g + (e >> 1) * 8;
                if (row < m && col < n) y[(size_t)row * n + col] = acc[rt][ct][e];
            }
        }
    }
}

// BT = 64: two blocks an SM (128 registers a thread); BT = 128: one block of 512 threads.
#define KQGEMM(BT, MINB, suffix, KT)                                                                          \
    extern "C" __global__ void __launch_bounds__(4 * BT, MINB)                                                \
        qkgemm##BT##_##suffix(float* y, const int8_t* xq, const float* dx, const int16_t* xs, const uint8_t* w, \
                              int m, int n, int k) {                                                          \
        qkgemm_big<KT, BT>(y, xq, dx, xs, w, m, n, k);                                                        \
    }

KQGEMM(64, 2, q4_k, KT_Q4_K)
KQGEMM(64, 2, q5_k, KT_Q5_K)
KQGEMM(64, 2, q6_k, KT_Q6_K)
KQGEMM(128, 1, q4_k, KT_Q4_K)
KQGEMM(128, 1, q5_k, KT_Q5_K)
KQGEMM(128, 1, q6_k, KT_Q6_K)
