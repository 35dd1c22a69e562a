// The Q8_0 GEMM for calls of many rows (prefill chunks, big batches): y [m, n] f32 = x [m, k] .
// W [n, k]^T with W in GGML Q8_0 rows (34-byte blocks) and x quantised by qmma.cu's
// q8_quantize_rows, on qmma.cu's chain, so every row gets the bits qmv_q8_0 / qmma_q8_0 give it.
//
// The chain (qmma.cu's header): the blocks are cut into segments of L = min(8, max(1, nb / 8))
// blocks; partial w (w = 0..7) runs acc = fmaf(isum_b, dw_b * dx_b, acc) over the blocks of
// segments w, w + 8, w + 16, ... in order, and the eight partials are added in order. qmma.cu
// gives each partial its own warp; here a block walks the segments partial by partial (w = 0,
// its segments in order, then w = 1, ...), so each output keeps one running partial and the
// sum of the finished ones: the same operations on the same values in the same order.
//
// qgemm64_q8_0: a block per QG_BN = 64 output columns x QG_BM = 64 rows, eight warps of 32
//   columns x 16 rows (two m16 column tiles x two n8 row tiles each). Segment by segment: the
//   64 columns' blocks (the 16-byte aligned window around each column's L blocks) and the 64
//   rows' codes and scales come into shared memory by cp.async, the next segment's while this
//   one is computed (for k of 2048 and more, where a segment is 8 blocks = 272 bytes and starts
//   16-byte aligned, each warp copies 8 columns and 8 rows, four lanes to each, with addresses
//   kept across segments: about half the instructions a segment of the generic staging takes,
//   which was as many as the mma loop's); the block then copies the weight codes into 4-byte
//   aligned rows and the block scales into floats once, and each warp reads its fragments
//   with ldmatrix (three loads a block for both column and both row tiles), runs one int8
//   mma.sync (m16n8k32) per block and tile pair, and the chain on its 64 outputs. Needs k a multiple of
//   256 (nb a multiple of 8: every segment whole, at least eight of them), rows 16-byte aligned
//   (the host checks).
//   Dynamic shared memory: QG_BYTES (97,568 bytes; the host asks for the same), two blocks an SM.
// qgemm128_q8_0: the same on 128 x 128 tiles (sixteen warps of 32 x 32, 195,104 bytes, one
//   block an SM). Its threads keep the sum of the finished partials in y itself (TOT_Y: each
//   output written and read back by the one thread that owns it, once a partial), not in
//   registers: with the 32 more a thread it spilled 196 bytes, 73 local loads and stores a
//   segment; now 32 bytes, outside the mma loop.
#include "q8act.cuh"
#include "kquant.cuh"

#define QG_BLOCK 34  // bytes of a Q8_0 block: f16 scale, 32 int8 codes
#define QG_ST 288    // bytes of a column's staged window: up to 14 before the segment + 8 x 34, in 16s
#define QG_WS 272    // bytes per copied weight column and staged activation row: 8 x 32 codes + 16
#define QG_FS 12     // floats per staged row of dx: 8 blocks + 4
#define QG_WF 9      // floats per column of weight scales: 8 blocks + 1

// The shared memory of a BT x BT tile (BT = 64: 97,568 bytes; 128: 195,104).
template <int BT>
struct QgLayout {
    static constexpr int QG_BN = BT, QG_BM = BT;
    static constexpr int QG_RAW_BYTES = QG_BN * QG_ST + 16;
    static constexpr int QG_RAW = 0;                                  // [2][QG_RAW_BYTES] raw weight windows
    static constexpr int QG_XQ = QG_RAW + 2 * QG_RAW_BYTES;           // [2][QG_BM][QG_WS] activation codes
    static constexpr int QG_XD = QG_XQ + 2 * QG_BM * QG_WS;           // [2][QG_BM][QG_FS] activation scales
    static constexpr int QG_WQ = QG_XD + 2 * QG_BM * QG_FS * 4;       // [QG_BN][QG_WS] weight codes, aligned
    static constexpr int QG_WD = QG_WQ + QG_BN * QG_WS;               // [QG_BN][QG_WF] weight scales
    static constexpr int QG_BYTES = QG_WD + QG_BN * QG_WF * 4;
};

// LC: the segment length when known at compile time (8: every k of 2048+), 0 when not; with it
// the staging loops' index arithmetic is by constants.
// BT = 64 (eight warps of 32 columns x 16 rows) or 128 (sixteen warps of 32 x 32): 4 BT
// threads, warps of 32 columns x RT = BT / 32 row tiles of 8.
template <int LC, int BT>
__device__ void qgemm_q8_0_body(float* __restrict__ y, const int8_t* __restrict__ xq, const float* __restrict__ dx,
                             const uint8_t* __restrict__ w, int m, int n, int k, long long rb) {
    using Lq = QgLayout<BT>;
    constexpr int QG_BN = BT, QG_BM = BT, QG_RAW_BYTES = Lq::QG_RAW_BYTES, QG_RAW = Lq::QG_RAW, QG_XQ = Lq::QG_XQ,
                  QG_XD = Lq::QG_XD, QG_WQ = Lq::QG_WQ, QG_WD = Lq::QG_WD, QG_BYTES = Lq::QG_BYTES;
    constexpr int RT = BT / 32, WC = BT / 32, NT = 4 * BT;
    extern __shared__ __align__(16) uint8_t qg_smem[];
    if (blockDim.x != NT) __trap();
    {
        unsigned dyn;
        asm("mov.u32 %0, %%dynamic_smem_size;" : "=r"(dyn));
        if (dyn < (unsigned)QG_BYTES) __trap();  // launched with too little shared memory
    }
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int g = lane >> 2, tig = lane & 3;
    const int wcol = (warp % WC) * 32, wrow = (warp / WC) * (RT * 8);
    const int row0 = blockIdx.x * QG_BM, col0 = blockIdx.y * QG_BN;
    const int nb = k >> 5;
    const int L = LC ? LC : min(8, max(1, nb / 8));
    const int nseg = nb / L;
    // 16-byte pieces of a column's window: the segment starts up to 14 bytes into it.
    const int pieces = (L * QG_BLOCK + 14 + 15) >> 4;
    const uint8_t* end = w + (size_t)n * rb;
    uint8_t* const wq = qg_smem + QG_WQ;
    float* const wd = reinterpret_cast<float*>(qg_smem + QG_WD);
    auto raw = [&](int buf) { return qg_smem + QG_RAW + buf * QG_RAW_BYTES; };
    auto xcodes = [&](int buf) { return qg_smem + QG_XQ + buf * QG_BM * QG_WS; };
    auto xscale = [&](int buf) { return reinterpret_cast<float*>(qg_smem + QG_XD) + buf * QG_BM * QG_FS; };
    // Where segment s of column c starts: its byte offset in W, and in its staged window.
    auto seg_off = [&](int c, int s) { return (long long)c * rb + (long long)s * L * QG_BLOCK; };
    auto load = [&](int s, int buf) {
        for (int i = threadIdx.x; i < QG_BN * pieces; i += NT) {
            const int r = i / pieces, c = i - r * pieces;
            const int col = col0 + r;
            if (col < n) {
                const long long off = seg_off(col, s);
                cp_async16_upto(raw(buf) + r * QG_ST + c * 16, w + (size_t)(off - (off & 15)) + c * 16, end);
            }
        }
        // Per row: 2 L pieces of codes, then L scales.
        const int per = 3 * L;
        for (int i = threadIdx.x; i < QG_BM * per; i += NT) {
            const int r = i / per, c = i - r * per;
            const int row = row0 + r;
            if (row >= m) continue;
            if (c < 2 * L) {
                cp_async16(xcodes(buf) + r * QG_WS + c * 16, xq + (size_t)row * k + (size_t)s * L * 32 + c * 16);
            } else {
                const int b = c - 2 * L;
                cp_async4(xscale(buf) + r * QG_FS + b, dx + (size_t)row * nb + (size_t)s * L + b);
            }
        }
    };
    // Block j of column c, staged at blk, into aligned codes and its float scale.
    auto unpack_block = [&](int c, int j, const uint8_t* blk) {
        uint32_t v[8];
        lds_run<8>(blk + 2, v);
        uint4* dst = reinterpret_cast<uint4*>(wq + c * QG_WS + j * 32);
        dst[0] = make_uint4(v[0], v[1], v[2], v[3]);
        dst[1] = make_uint4(v[4], v[5], v[6], v[7]);
        wd[c * QG_WF + j] = __half2float(*reinterpret_cast<const __half*>(blk));
    };
    // The staged segment of every column (a (column, block) pair per thread and turn).
    auto unpack = [&](int s, int buf) {
        for (int t = threadIdx.x; t < QG_BN * L; t += NT) {
            const int c = t / L, j = t - c * L;
            unpack_block(c, j, raw(buf) + c * QG_ST + (int)(seg_off(col0 + c, s) & 15) + j * QG_BLOCK);
        }
    };

    // With L = 8 (LC == 8) a segment is 272 bytes, a multiple of 16, and rows are 16-byte
    // aligned (the host checks), so every column's segment starts 16-byte aligned and is 17
    // whole pieces ending inside W: no window shift, no cut copy. Each warp stages 8 weight
    // columns and 8 activation rows, four lanes to a column or row, every lane keeping its
    // column's and row's addresses across segments (pieces lane & 3, + 4, ...).
    const int lr = warp * 8 + (lane >> 2), lp = lane & 3;
    const bool wcol_ok = col0 + lr < n, xrow_ok = row0 + lr < m;
    const uint8_t* wsrc = w + (size_t)min(col0 + lr, n - 1) * rb + lp * 16;
    const int xr = min(row0 + lr, m - 1);  // the activation row's pointers are made per segment
    auto load8 = [&](int s, int buf) {
        if (wcol_ok) {
            const uint8_t* src = wsrc + (size_t)s * 272;
            uint8_t* dst = raw(buf) + lr * QG_ST + lp * 16;
#pragma unroll
            for (int q = 0; q < 4; q++) cp_async16(dst + q * 64, src + q * 64);
            if (lp == 0) cp_async16(dst + 256, src + 256);
        }
        if (xrow_ok) {
            const int8_t* src = xq + ((size_t)xr * k + (size_t)s * 256 + lp * 16);
            uint8_t* dst = xcodes(buf) + lr * QG_WS + lp * 16;
#pragma unroll
            for (int q = 0; q < 4; q++) cp_async16(dst + q * 64, src + q * 64);
            if (lp < 2) cp_async16(xscale(buf) + lr * QG_FS + lp * 4, dx + ((size_t)xr * nb + (size_t)s * 8 + lp * 4));
        }
    };
    auto unpack8 = [&](int buf) {
#pragma unroll
        for (int q = 0; q < QG_BN * 8 / NT; q++) {
            const int t = threadIdx.x + NT * q;
            const int c = t >> 3, j = t & 7;
            unpack_block(c, j, raw(buf) + c * QG_ST + j * QG_BLOCK);
        }
    };
    // TOT_Y (the 128 tile): the finished partials' sum lives in y, not in 32 more registers a
    // thread (with them the 128 tile spilled 196 bytes); it changes once a partial (eight times).
    constexpr bool TOT_Y = BT == 128;
    float acc[RT][2][4], tot[TOT_Y ? 1 : RT][2][4];
#pragma unroll
    for (int rt = 0; rt < RT; rt++)
#pragma unroll
        for (int ct = 0; ct < 2; ct++)
#pragma unroll
            for (int e = 0; e < 4; e++) acc[rt][ct][e] = tot[TOT_Y ? 0 : rt][ct][e] = 0.f;
    if constexpr (LC == 8)
        load8(0, 0);
    else
        load(0, 0);
    cp_async_commit();
    // The walk: partial p over its segments p, p + 8, ...; then partial p + 1.
    int p = 0, s = 0;
    for (int i = 0; i < nseg; i++) {
        int np = p, ns = s + 8;
        const bool last_of_partial = ns >= nseg;
        if (last_of_partial) np = ns = p + 1;
        if (i + 1 < nseg) {
            if constexpr (LC == 8)
                load8(ns, (i + 1) & 1);
            else
                load(ns, (i + 1) & 1);
        }
        cp_async_commit();
        cp_async_wait<1>();
        __syncthreads();  // segment s staged
        if constexpr (LC == 8)
            unpack8(i & 1);
        else
            unpack(s, i & 1);
        __syncthreads();  // and unpacked
        const uint8_t* xb = xcodes(i & 1);
        const float* xd = xscale(i & 1);
        // ldmatrix rows of this lane (matrix lane / 8, row lane % 8): the A fragments' columns
        // (matrices: columns 0-7 / 8-15 of the tile x values 0-15 / 16-31 of the block) and the
        // B fragments' rows (matrices: values 0-15 / 16-31 x row tile 0 / 1); common.cuh.
        const int lm = lane >> 3, lr8 = lane & 7;
        const uint32_t a_row = smem_addr(wq + (wcol + lr8 + 8 * (lm & 1)) * QG_WS + 16 * (lm >> 1));
        const uint32_t b_row = smem_addr(xb + (wrow + lr8 + 8 * (lm >> 1)) * QG_WS + 16 * (lm & 1));
#pragma unroll
        for (int j = 0; j < 8; j++) {
            if (j < L) {
                uint32_t a[2][4];
                float dw[2][2];
#pragma unroll
                for (int ct = 0; ct < 2; ct++) {
                    const int c = wcol + ct * 16 + g;
                    ldsm_x4(a[ct], a_row + ct * 16 * QG_WS + j * 32);
                    dw[ct][0] = wd[c * QG_WF + j];
                    dw[ct][1] = wd[(c + 8) * QG_WF + j];
                }
                // The B fragments: row g of each row tile, values 4 tig .. and 16 + 4 tig ..;
                // this lane's outputs are rows 2 tig and 2 tig + 1.
                uint32_t bx[RT / 2][4];
#pragma unroll
                for (int h = 0; h < RT / 2; h++) ldsm_x4(bx[h], b_row + h * 16 * QG_WS + j * 32);
#pragma unroll
                for (int rt = 0; rt < RT; rt++) {
                    const int rbase = wrow + rt * 8;
                    const uint32_t x0 = bx[rt >> 1][2 * (rt & 1)], x1 = bx[rt >> 1][2 * (rt & 1) + 1];
                    const int r0 = rbase + 2 * tig;
                    const float dx0 = xd[r0 * QG_FS + j], dx1 = xd[(r0 + 1) * QG_FS + j];
#pragma unroll
                    for (int ct = 0; ct < 2; ct++) {
                        int d[4];
                        mma_k32(d, a[ct], x0, x1);
                        float* o = acc[rt][ct];
                        o[0] = chain_step(o[0], d[0], dw[ct][0], dx0);
                        o[1] = chain_step(o[1], d[1], dw[ct][0], dx1);
                        o[2] = chain_step(o[2], d[2], dw[ct][1], dx0);
                        o[3] = chain_step(o[3], d[3], dw[ct][1], dx1);
                    }
                }
            }
        }
        if (last_of_partial) {
            // Partial p is complete: the first one is the sum so far, later ones are added
            // (TOT_Y: to the sum this thread keeps in y, written and read back by it alone; the
            // loads all issued before the first store, so their latencies overlap).
            if constexpr (TOT_Y) {
                float old[RT][2][4];
#pragma unroll
                for (int rt = 0; rt < RT; rt++)
#pragma unroll
                    for (int ct = 0; ct < 2; ct++)
#pragma unroll
                        for (int e = 0; e < 4; e++) {
                            const int row = row0 + wrow + rt * 8 + 2 * tig + (e & 1);
                            const int col = col0 + wcol + ct * 16 + g + (e >> 1) * 8;
                            old[rt][ct][e] = p > 0 && row < m && col < n ? y[(size_t)row * n + col] : 0.f;
                        }
#pragma unroll
                for (int rt = 0; rt < RT; rt++)
#pragma unroll
                    for (int ct = 0; ct < 2; ct++)
#pragma unroll
                        for (int e = 0; e < 4; e++) {
                            const int row = row0 + wrow + rt * 8 + 2 * tig + (e & 1);
                            const int col = col0 + wcol + ct * 16 + g + (e >> 1) * 8;
                            if (row < m && col < n)
                                y[(size_t)row * n + col] = p == 0 ? acc[rt][ct][e] : __fadd_rn(old[rt][ct][e], acc[rt][ct][e]);
                            acc[rt][ct][e] = 0.f;
                        }
            } else {
#pragma unroll
                for (int rt = 0; rt < RT; rt++)
#pragma unroll
                    for (int ct = 0; ct < 2; ct++)
#pragma unroll
                        for (int e = 0; e < 4; e++) {
                            tot[rt][ct][e] = p == 0 ? acc[rt][ct][e] : __fadd_rn(tot[rt][ct][e], acc[rt][ct][e]);
                            acc[rt][ct][e] = 0.f;
                        }
            }
        }
        __syncthreads();  // every warp is done with this stage and the unpacked segment
        p = np;
        s = ns;
    }
    if constexpr (!TOT_Y) {  // TOT_Y: the last partial's sums are in y already
    #pragma unroll
        for (int rt = 0; rt < RT; rt++) {
    #pragma unroll
            for (int ct = 0; ct < 2; ct++) {
    #pragma unroll
                for (int e = 0; e < 4; e++) {
                    const int row = row0 + wrow + rt * 8 + 2 * tig + (e & 1);
                    const int col = col0 + wcol + ct * 16 + g + (e >> 1) * 8;
                    if (row < m && col < n) y[(size_t)row * n + col] = tot[rt][ct][e];
                }
            }
        }
    }
}

extern "C" __global__ void __launch_bounds__(256, 2)
    qgemm64_q8_0(float* y, const int8_t* xq, const float* dx, const uint8_t* w, int m, int n, int k, long long rb) {
    if (k >= 2048)
        qgemm_q8_0_body<8, 64>(y, xq, dx, w, m, n, k, rb);
    else
        qgemm_q8_0_body<0, 64>(y, xq, dx, w, m, n, k, rb);
}
// 128 x 128 tiles, one block of sixteen warps an SM, the same bits; the host takes it for
// calls whose grid it fills (cuda_qmma.rs: 2.7% faster on the 9B Q8_0 prefill, H100,
// 2026-12-07, once the partial sums left the registers).
extern "C" __global__ void __launch_bounds__(512, 1)
    qgemm128_q8_0(float* y, const int8_t* xq, const float* dx, const uint8_t* w, int m, int n, int k, long long rb) {
    if (k >= 2048)
        qgemm_q8_0_body<8, 128>(y, xq, dx, w, m, n, k, rb);
    else
        qgemm_q8_0_body<0, 128>(y, xq, dx, w, m, n, k, rb);
}
