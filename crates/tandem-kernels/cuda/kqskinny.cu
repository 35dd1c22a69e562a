// The K-quant matmul of a few rows on the tensor cores: y [m, n] f32 = x [m, k] . W [n, k]^T
// for m = 1..8 (verify steps, small batches), W in Q4_K / Q5_K / Q6_K rows, x quantised by
// kqmma.cu's q8k_quantize_rows, on the chain kqmma.cu's header defines (the same bits as
// its GEMV and GEMMs, row for row).
//
// qkmvm_<t>: a block per KS_COLS = 16 output columns, KS_WARPS = 4 warps. The columns'
//   superblocks are dealt out to the warps in turn (warp w takes s = 4 r + w in round r); a
//   warp copies its superblock of the 16 columns, and the m rows' codes, code sums and dx of
//   that superblock, into its own shared-memory stage by cp.async, one round ahead. One int8
//   mma.sync m16n8k32 per sub-block (two m16n8k16 for q6_k's 16-value halves) gives the
//   integer dot products of all 16 columns with all eight rows at once: the weight codes are
//   the mma's A operand, the rows' codes its B operand, so a row costs one column of B rather
//   than its own dot products (qkmv's cost grows with the rows; this kernel's hardly does).
//   Each lane sums its four outputs' integers (columns g, g + 8 x rows 2 tig, 2 tig + 1) to
//   the superblock's T and leaves them in shared memory; after a block barrier, once every R
//   rounds (R = 4 by default: qkmvm_<t>_g4), warp w adds those rounds' T of output e = w in
//   superblock order. Rows past m read row m - 1 (a B
//   column only reaches its own outputs, which are dropped).
// Measured on the H200 (9B Q4_K, a verify step of 5 rows): 1.6-2x qkmv_1's time per matrix,
// where qkmv's 4-row kernel takes 2.4x; at one row it loses to qkmv_1 (decode 209 against
// 256 tok/s), so one-row calls stay there. Latency-bound (0.4 instructions issued a cycle per
// scheduler, 0.9 eligible warps of 4.5).
#include "kquant.cuh"

#define KS_WARPS 4
#define KS_COLS 16

#ifndef KS_STAGES
#define KS_STAGES 2  // rounds in flight a warp
#endif
#ifndef KS_MINB
#define KS_MINB 5  // blocks an SM must hold: a register budget (ptxas: 67-90 registers, no spills)
#endif

// The dynamic shared memory a block takes for calls of m rows (the host computes the same):
// per warp and stage the 16 columns' superblock windows, the m rows' codes of that superblock
// (KS_XS bytes a row: 256 + 16 of padding against bank conflicts) and their code sums and dx
// (KS_XD bytes a row: 16 + 4 + padding); then the superblock terms of two groups of R rounds.
#define KS_XS 272
#define KS_XD 32
template <int KT>
__host__ __device__ constexpr int ks_region(int m) {
    return KS_COLS * kq_stride<KT>() + m * (KS_XS + KS_XD);
}
// R: rounds whose terms a block adds per barrier (two buffers of R rounds' terms).
template <int KT, int R>
__host__ __device__ constexpr int ks_smem_bytes(int m) {
    return KS_WARPS * KS_STAGES * ks_region<KT>(m) + 2 * R * KS_WARPS * 4 * 32 * 4;
}

template <int KT, int R>
__device__ void qkmvm(float* __restrict__ y, const int8_t* __restrict__ xq, const float* __restrict__ dx,
                      const int16_t* __restrict__ xs, const uint8_t* __restrict__ w, int m, int n, int k) {
    constexpr int BB = kq_bytes<KT>(), ST = kq_stride<KT>(), NS = KS_STAGES;
    constexpr int PIECES = ST / 16;
    extern __shared__ __align__(16) uint8_t ks_smem[];
    const int region = ks_region<KT>(m);
    {
        unsigned dyn;
        asm("mov.u32 %0, %%dynamic_smem_size;" : "=r"(dyn));
        if (m < 1 || m > 8 || dyn < (unsigned)ks_smem_bytes<KT, R>(m)) __trap();  // launched wrongly
    }
    float* const tsm = reinterpret_cast<float*>(ks_smem + KS_WARPS * NS * region);  // [2][R][warp][e][lane]
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int g = lane >> 2, tig = lane & 3;
    const int col0 = blockIdx.x * KS_COLS;
    const int S = k >> 8, nb = k >> 5;
    const long long rb = (long long)S * BB;
    const uint8_t* end = w + (size_t)n * rb;
    const int rounds = (S + KS_WARPS - 1) / KS_WARPS;
    auto stage = [&](int buf) { return ks_smem + (warp * NS + buf) * region; };
    // Where column c's superblock s starts in its staged window (0 but for q6_k).
    auto win = [&](int c, int s) { return (int)(((long long)c * rb + (long long)s * BB) & 15); };
    // Lane l copies column l & 15's pieces (l >> 4) + 2 t of each superblock it stages, then
    // the rows' pieces: 16 of codes, one of code sums and dx's four bytes a row.
    const int lc = lane & 15, lp = lane >> 4;
    const bool lc_live = col0 + lc < n;
    const uint8_t* lcol = w + (size_t)(col0 + lc) * rb;
    auto load = [&](int r) {
        const int s = r * KS_WARPS + warp;
        if (s >= S) return;
        uint8_t* dst = stage(r % NS);
        if (lc_live) {
            const uint8_t* src = lcol + (size_t)s * BB;
            src -= reinterpret_cast<uintptr_t>(src) & 15;  // q6_k: the aligned window
            uint8_t* d = dst + lc * ST;
#pragma unroll
            for (int t = 0; t < (PIECES + 1) / 2; t++) {
                const int p = lp + 2 * t;
                if (p < PIECES) {
                    if constexpr (KT == KT_Q6_K) {
                        cp_async16_upto(d + p * 16, src + p * 16, end);  // the last window may pass the end
                    } else {
                        cp_async16(d + p * 16, src + p * 16);
                    }
                }
            }
        }
        uint8_t* xd = dst + KS_COLS * ST;
        for (int i = lane; i < m * 18; i += 32) {
            const int row = i / 18, c = i - row * 18;
            if (c < 16) {
                cp_async16(xd + row * KS_XS + c * 16, xq + (size_t)row * k + (size_t)s * 256 + c * 16);
            } else if (c == 16) {
                cp_async16(xd + m * KS_XS + row * KS_XD, xs + (size_t)row * nb + (size_t)s * 8);
            } else {
                cp_async4(xd + m * KS_XS + row * KS_XD + 16, dx + (size_t)row * S + s);
            }
        }
    };
#pragma unroll
    for (int r = 0; r < NS - 1; r++) {
        if (r < rounds) load(r);
        cp_async_commit();
    }
    // This lane's B fragment is row g's codes; its outputs are rows ra, ra + 1. Rows past m
    // read row m - 1 (their outputs are dropped; a B column only reaches its own outputs).
    const int ra = 2 * tig;
    const int gx = min(g, m - 1), xa = min(ra, m - 1), xb = min(ra + 1, m - 1);
    float acc = 0.f;  // output e = warp: column g + 8 (warp >> 1), row ra + (warp & 1)
    for (int r = 0; r < rounds; r++) {
        // Every lane is done with the round before, whose stage this load refills (with R > 1
        // no block barrier ends every round).
        __syncwarp();
        if (r + NS - 1 < rounds) load(r + NS - 1);
        cp_async_commit();
        cp_async_wait<NS - 1>();
        __syncwarp();
        const int s = r * KS_WARPS + warp;
        float u[4] = {0.f, 0.f, 0.f, 0.f};
        if (s < S) {
            const uint8_t* st = stage(r % NS);
            const uint8_t* xcodes = st + KS_COLS * ST;
            const uint8_t* xsd = xcodes + m * KS_XS;  // rows' code sums and dx
            const uint8_t* lo = st + g * ST + win(col0 + g, s);
            const uint8_t* hi = st + (g + 8) * ST + win(col0 + g + 8, s);
            const uint8_t* xr = xcodes + gx * KS_XS + 4 * tig;
            int is[4] = {0, 0, 0, 0};
#pragma unroll
            for (int j = 0; j < 8; j++) {
                const uint32_t a[4] = {kword<KT>(lo, j, tig), kword<KT>(hi, j, tig), kword<KT>(lo, j, tig + 4),
                                       kword<KT>(hi, j, tig + 4)};
                const uint32_t x0 = lds32(xr + j * 32), x1 = lds32(xr + j * 32 + 16);
                int sa_lo, sb_lo, sa_hi, sb_hi;
                kscale<KT>(lo, j, &sa_lo, &sb_lo);
                kscale<KT>(hi, j, &sa_hi, &sb_hi);
                if constexpr (KT == KT_Q6_K) {
                    int d0[4], d1[4];
                    mma_k16(d0, a[0], a[1], x0);
                    mma_k16(d1, a[2], a[3], x1);
                    is[0] += sa_lo * d0[0] + sb_lo * d1[0];
                    is[1] += sa_lo * d0[1] + sb_lo * d1[1];
                    is[2] += sa_hi * d0[2] + sb_hi * d1[2];
                    is[3] += sa_hi * d0[3] + sb_hi * d1[3];
                } else {
                    int d[4];
                    mma_k32(d, a, x0, x1);
                    is[0] += sa_lo * d[0];
                    is[1] += sa_lo * d[1];
                    is[2] += sa_hi * d[2];
                    is[3] += sa_hi * d[3];
                }
            }
            // The superblock's terms: rows xa, xb's code sums and dx; columns g, g + 8's d,
            // dmin and mins.
            float d_lo, dm_lo, d_hi, dm_hi;
            kd<KT>(lo, &d_lo, &dm_lo);
            kd<KT>(hi, &d_hi, &dm_hi);
            const float dx0 = *reinterpret_cast<const float*>(xsd + xa * KS_XD + 16);
            const float dx1 = *reinterpret_cast<const float*>(xsd + xb * KS_XD + 16);
            int m00 = 0, m01 = 0, m10 = 0, m11 = 0;  // (column lo / hi, row xa / xb)
            if constexpr (KT != KT_Q6_K) {
                const uint4 xs0 = *reinterpret_cast<const uint4*>(xsd + xa * KS_XD);
                const uint4 xs1 = *reinterpret_cast<const uint4*>(xsd + xb * KS_XD);
                const uint2 ml = kq_mins(lo), mh = kq_mins(hi);
                m00 = kq_msum(xs0, ml), m01 = kq_msum(xs1, ml);
                m10 = kq_msum(xs0, mh), m11 = kq_msum(xs1, mh);
            }
            u[0] = kq_term(is[0], m00, d_lo, dm_lo, dx0);
            u[1] = kq_term(is[1], m01, d_lo, dm_lo, dx1);
            u[2] = kq_term(is[2], m10, d_hi, dm_hi, dx0);
            u[3] = kq_term(is[3], m11, d_hi, dm_hi, dx1);
        }
        // Group r / R of R rounds into buffer (r / R) & 1, slot r % R; once a group is in (a
        // barrier), warp w adds its rounds' terms of output e = w in superblock order. With two
        // buffers, a group's terms are read before the group after next overwrites them.
        const int slot = r % R;
        float* const grp = tsm + ((r / R) & 1) * R * KS_WARPS * 128;
        float* t = grp + slot * KS_WARPS * 128;
#pragma unroll
        for (int e = 0; e < 4; e++) t[(warp * 4 + e) * 32 + lane] = u[e];
        if (slot == R - 1 || r == rounds - 1) {
            __syncthreads();
            for (int sl = 0; sl <= slot; sl++) {
                const float* tt = grp + sl * KS_WARPS * 128;
                const int live = min(KS_WARPS, S - (r - slot + sl) * KS_WARPS);
#pragma unroll
                for (int ww = 0; ww < KS_WARPS; ww++)
                    if (ww < live) acc = __fadd_rn(acc, tt[(ww * 4 + warp) * 32 + lane]);
            }
        }
    }
    const int col = col0 + g + 8 * (warp >> 1), row = ra + (warp & 1);
    if (row < m && col < n) y[(size_t)row * n + col] = acc;
}

#define KQMVM(name, KT, R)                                                                                    \
    extern "C" __global__ void __launch_bounds__(KS_WARPS * 32, KS_MINB)                                      \
        name(float* y, const int8_t* xq, const float* dx, const int16_t* xs, const uint8_t* w, int m, int n,  \
             int k) {                                                                                         \
        qkmvm<KT, R>(y, xq, dx, xs, w, m, n, k);                                                              \
    }

// qkmvm_<t>: a barrier every round; qkmvm_<t>_g2 / _g4: every two / four rounds
// (TANDEM_KQ_SKINNY_GROUP).
KQMVM(qkmvm_q4_k, KT_Q4_K, 1)
KQMVM(qkmvm_q5_k, KT_Q5_K, 1)
KQMVM(qkmvm_q6_k, KT_Q6_K, 1)
KQMVM(qkmvm_q4_k_g2, KT_Q4_K, 2)
KQMVM(qkmvm_q5_k_g2, KT_Q5_K, 2)
KQMVM(qkmvm_q6_k_g2, KT_Q6_K, 2)
KQMVM(qkmvm_q4_k_g4, KT_Q4_K, 4)
KQMVM(qkmvm_q5_k_g4, KT_Q5_K, 4)
KQMVM(qkmvm_q6_k_g4, KT_Q6_K, 4)
