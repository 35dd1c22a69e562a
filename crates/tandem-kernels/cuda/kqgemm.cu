// The K-quant GEMM for calls of many rows (prefill chunks, big batches): y [m, n] f32 =
// x [m, k] . W [n, k]^T with W in Q4_K / Q5_K / Q6_K rows and x quantised by kqmma.cu's
// q8_quantize_rows_sums, on the chain kqmma.cu's header defines (the same bits as its GEMV
// and small-tile GEMM for every row).
//
// qkgemm64_<t>: a block per KB_BN = 64 output columns x KB_BM = 64 rows, eight warps of 32
//   columns x 16 rows (two m16 column tiles x two n8 row tiles each). Superblock by
//   superblock: the block's 64 weight rows (the 16-byte aligned windows around them) and its
//   64 activation rows with their scales come into shared memory by cp.async, the next
//   superblock's while this one is computed; the whole block then decodes the superblock once
//   into int8 codes and per-sub-block factors (q4_k / q5_k: dsc = d sc, dm = dmin m; q6_k: the
//   two 16-value scales and d), where kqmma.cu's GEMM decodes them per warp and use; and each
//   warp runs int8 mma.sync (m16n8k32; m16n8k16 for q6_k's halves) on the decoded codes and
//   the chain on its 64 outputs. Dynamic shared memory: KbLayout<KT>::BYTES (87,840 bytes for
//   q4_k, 98,080 for q6_k; the host computes the same), two blocks an SM.
#include "kquant.cuh"

#define KB_BN 64
#define KB_BM 64
#define KB_WS 272  // bytes per decoded weight column and staged activation row: 256 codes + 16
#define KB_FS 12   // floats per row of the activations' dx (and dxs): 8 sub-blocks + 4
#define KB_WF 9    // float2 per column of the weights' factors: 8 sub-blocks + 1

template <int KT>
struct KbLayout {
    static constexpr int ST = kq_stride<KT>();
    static constexpr int RAW_BYTES = KB_BN * ST + 16;              // a stage of raw superblocks
    static constexpr int RAW = 0;                                  // [2][RAW_BYTES]
    static constexpr int XQ = RAW + 2 * RAW_BYTES;                 // [2][KB_BM][KB_WS] codes
    static constexpr int XD = XQ + 2 * KB_BM * KB_WS;              // [2 stages][dx, dxs][KB_BM][KB_FS]
    static constexpr int WQ = XD + 2 * 2 * KB_BM * KB_FS * 4;      // [KB_BN][KB_WS] decoded codes
    static constexpr int WF = WQ + KB_BN * KB_WS;                  // [KB_BN][KB_WF] float2 (q6_k: int2)
    static constexpr int WD = WF + KB_BN * KB_WF * 8;              // [KB_BN] float: q6_k's d
    static constexpr int BYTES = WD + KB_BN * 4;
};

template <int KT>
__device__ void qkgemm64(float* __restrict__ y, const int8_t* __restrict__ xq, const float* __restrict__ dx,
                         const float* __restrict__ dxs, const uint8_t* __restrict__ w, int m, int n, int k) {
    using L = KbLayout<KT>;
    constexpr int BB = kq_bytes<KT>(), ST = L::ST;
    extern __shared__ __align__(16) uint8_t kb_smem[];
    {
        unsigned dyn;
        asm("mov.u32 %0, %%dynamic_smem_size;" : "=r"(dyn));
        if (dyn < (unsigned)L::BYTES) __trap();  // launched with too little shared memory
    }
    if (blockDim.x != 256) __trap();  // the staging below gives each of 256 threads its share
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int g = lane >> 2, tig = lane & 3;
    const int wcol = (warp & 1) * 32, wrow = (warp >> 1) * 16;
    const int row0 = blockIdx.x * KB_BM, col0 = blockIdx.y * KB_BN;
    const int S = k >> 8, nb = k >> 5;
    const long long rb = (long long)S * BB;
    const uint8_t* end = w + (size_t)n * rb;
    uint8_t* const wq = kb_smem + L::WQ;
    float2* const wf = reinterpret_cast<float2*>(kb_smem + L::WF);
    float* const wd = reinterpret_cast<float*>(kb_smem + L::WD);
    auto raw = [&](int buf) { return kb_smem + L::RAW + buf * L::RAW_BYTES; };
    auto xcodes = [&](int buf) { return kb_smem + L::XQ + buf * KB_BM * KB_WS; };
    auto xscale = [&](int buf, int which) {
        return reinterpret_cast<float*>(kb_smem + L::XD) + (buf * 2 + which) * KB_BM * KB_FS;
    };
    // Where column c's superblock s starts in its staged window.
    auto win = [&](int c, int s) { return (int)(((long long)c * rb + (long long)s * BB) & 15); };
    // Each thread's share of a stage, fixed for the whole call (256 threads): weight column
    // t / 4's pieces t % 4, t % 4 + 4, ...; activation row t / 4's codes t % 4 (64 bytes, four
    // pieces); and one piece of its scales (dx or dxs, half t % 2). Only the superblock moves
    // the sources, so a stage is a few copies a thread (the general loops were a division and
    // a branch a piece: a fifth of the instructions).
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
            const float* ssrc = ((lq >> 1) ? dxs : dx) + (size_t)(row0 + lr) * nb + s * 8 + (lq & 1) * 4;
            cp_async16(xscale(buf, lq >> 1) + lr * KB_FS + (lq & 1) * 4, ssrc);
        }
    };
    // The staged superblock s of every column into codes and factors (a (column, sub-block)
    // pair per thread and turn).
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
            float d, dmin;
            kscale<KT>(sb, j, &a, &b);
            kd<KT>(sb, &d, &dmin);
            if constexpr (KT == KT_Q6_K) {
                wf[c * KB_WF + j] = make_float2(__int_as_float(a), __int_as_float(b));
                if (j == 0) wd[c] = d;
            } else {
                float fa, fb;
                kq_factors(a, b, d, dmin, &fa, &fb);
                wf[c * KB_WF + j] = make_float2(fa, fb);
            }
        }
    };

    load(0, 0);
    cp_async_commit();
    float acc[2][2][4];
#pragma unroll
    for (int rt = 0; rt < 2; rt++)
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
        const float* xd = xscale(s & 1, 0);
        const float* xds = xscale(s & 1, 1);
        float dq[2][2] = {{0.f, 0.f}, {0.f, 0.f}};
        if constexpr (KT == KT_Q6_K) {
#pragma unroll
            for (int ct = 0; ct < 2; ct++) {
                dq[ct][0] = wd[wcol + ct * 16 + g];
                dq[ct][1] = wd[wcol + ct * 16 + g + 8];
            }
        }
        float p[2][2][4], h[2][2][4], u[2][2][4];
#pragma unroll
        for (int j = 0; j < 8; j++) {
            // A fragments of the two column tiles: values 4 tig .. and 16 + 4 tig .. of
            // columns g and g + 8 (q6_k: the first pair is the k16 mma of values 0..15).
            uint32_t a[2][4];
            float2 fl[2][2];
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
            for (int rt = 0; rt < 2; rt++) {
                // The B fragment: row g of the tile, values 4 tig .. and 16 + 4 tig ..; this
                // lane's outputs are rows 2 tig and 2 tig + 1.
                const int rbase = wrow + rt * 8;
                const uint8_t* xr = xb + (rbase + g) * KB_WS + j * 32 + 4 * tig;
                const uint32_t x0 = lds32(xr), x1 = lds32(xr + 16);
                const int r0 = rbase + 2 * tig;
                const float dx0 = xd[r0 * KB_FS + j], dx1 = xd[(r0 + 1) * KB_FS + j];
#pragma unroll
                for (int ct = 0; ct < 2; ct++) {
                    float f[4];
                    if constexpr (KT == KT_Q6_K) {
                        int d0[4], d1[4];
                        mma_k16(d0, a[ct][0], a[ct][1], x0);
                        mma_k16(d1, a[ct][2], a[ct][3], x1);
                        const int sa_lo = __float_as_int(fl[ct][0].x), sb_lo = __float_as_int(fl[ct][0].y);
                        const int sa_hi = __float_as_int(fl[ct][1].x), sb_hi = __float_as_int(fl[ct][1].y);
                        f[0] = kq_f6(sa_lo * d0[0] + sb_lo * d1[0], dq[ct][0], dx0);
                        f[1] = kq_f6(sa_lo * d0[1] + sb_lo * d1[1], dq[ct][0], dx1);
                        f[2] = kq_f6(sa_hi * d0[2] + sb_hi * d1[2], dq[ct][1], dx0);
                        f[3] = kq_f6(sa_hi * d0[3] + sb_hi * d1[3], dq[ct][1], dx1);
                    } else {
                        const float ds0 = xds[r0 * KB_FS + j], ds1 = xds[(r0 + 1) * KB_FS + j];
                        int d[4];
                        mma_k32(d, a[ct], x0, x1);
                        f[0] = kq_f_min(d[0], fl[ct][0].x, fl[ct][0].y, dx0, ds0);
                        f[1] = kq_f_min(d[1], fl[ct][0].x, fl[ct][0].y, dx1, ds1);
                        f[2] = kq_f_min(d[2], fl[ct][1].x, fl[ct][1].y, dx0, ds0);
                        f[3] = kq_f_min(d[3], fl[ct][1].x, fl[ct][1].y, dx1, ds1);
                    }
#pragma unroll
                    for (int e = 0; e < 4; e++) t_step(j, f[e], p[rt][ct][e], h[rt][ct][e], u[rt][ct][e]);
                }
            }
        }
#pragma unroll
        for (int rt = 0; rt < 2; rt++)
#pragma unroll
            for (int ct = 0; ct < 2; ct++)
#pragma unroll
                for (int e = 0; e < 4; e++) acc[rt][ct][e] = __fadd_rn(acc[rt][ct][e], u[rt][ct][e]);
        __syncthreads();  // every warp is done with this stage and the decoded superblock
    }
#pragma unroll
    for (int rt = 0; rt < 2; rt++) {
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

#define KQGEMM64(suffix, KT)                                                                                  \
    extern "C" __global__ void __launch_bounds__(256, 2)                                                      \
        qkgemm64_##suffix(float* y, const int8_t* xq, const float* dx, const float* dxs, const uint8_t* w,     \
                          int m, int n, int k) {                                                              \
        qkgemm64<KT>(y, xq, dx, dxs, w, m, n, k);                                                            \
    }

KQGEMM64(q4_k, KT_Q4_K)
KQGEMM64(q5_k, KT_Q5_K)
KQGEMM64(q6_k, KT_Q6_K)
