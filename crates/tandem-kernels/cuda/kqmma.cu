// K-quant matmuls (Q4_K, Q5_K, Q6_K) with 8-bit activations, row-invariant for every call
// size: y [m, n] f32 = x [m, k] . W [n, k]^T, W in GGML K-quant rows (superblocks of 256
// values: q4_k 144 bytes, q5_k 176, q6_k 210; the layouts in qunits.cuh).
//
// q8k_quantize_rows: the activations by superblock of 256 values, as candle's (and the CPU
//   kernels') Q8K: the value of largest magnitude v (the first of equals) sets iscale =
//   -127 / v, a code is round(iscale x) (halves away from zero) clamped to -128..127, the
//   scale dx = 1 / iscale; and each 32-value sub-block's code sum xs (an int16).
//   q8k_quantize_rows_gated does the same for silu(g) * u (a gated MLP's down projection).
// The chain of an output (r, c) is fixed by k alone:
//   - superblock s (256 values): exact integer dot products of the weight codes with the
//     activation codes per sub-block (32 values; q6_k per 16-value half), weighted by the
//     sub-blocks' integer scales: I = sum_j sc_j isum_j (q6_k: over its 16 halves), and for
//     q4_k / q5_k the mins' term M = sum_j m_j xs_j; integers, so their order is free (every
//     partial sum stays below 2^31: |I| < 2^27); then one float term
//       T_s = (fma(float(I), d, -(float(M) dmin))) dx_s   (q6_k: (float(I) d) dx_s)
//     with the superblock's f16 d (and dmin) and the activation superblock's dx_s;
//   - y = (((0 + T_0) + T_1) + ...) + T_{S-1}, superblock after superblock.
//   Every float step is an explicit _rn intrinsic, so no contraction can differ between
//   kernels. Per output and 32 values the chain is one or two integer multiply-adds (and a
//   fourth of a dp2a), where a float chain per sub-block took five operations: the kernels
//   here were bound by it.
// qkmv_<t>_<R> (calls of 1..R rows: decode, verifies, small batches): a warp per output
//   column; in a round the warp takes eight superblocks, lane group g (lanes 4g..4g+3) the
//   g-th, lane q of it sub-blocks 2q and 2q + 1 (f_2q + f_2q+1); two xor shuffles add the four
//   pairs in T's order on all four lanes, the groups leave their T in shared memory, and lane
//   i adds the round's eight T of row i to that row's sum in order (one lane per row, rather
//   than every lane every row's: 16% off a 4-row call on the H200). The weights come into shared memory by cp.async, a round (one contiguous stretch
//   of the row, or for q6_k, whose rows start on any even address, the 16-byte aligned window
//   around it) at a time, KV_STAGES rounds in flight; copies stop at the matrix's last byte.
// qkgemm_<t>_<NT> (more rows: batches, prefill): a block per KG_BN = 64 output columns x NT
//   rows, eight warps of 16 columns x NT / 2 rows each; superblock by superblock, the block's
//   64 weight rows and NT activation rows are staged in shared memory by cp.async (the next
//   superblock's while this one is computed), the integer dot products come from int8
//   mma.sync (m16n8k32; m16n8k16 for q6_k's 16-value halves), and each warp runs the chain
//   for its outputs.
// kqgemm.cu's qkgemm64_<t> (64+ rows: prefill) runs the same chain on bigger tiles, and
// kqskinny.cu's qkmvm_<t> (2-8 rows by default: verify steps) on int8 mma over 16 columns.
// All give a row the same bits whatever else shares the call (check-device checks it).
#include "q8act.cuh"
#include "kquant.cuh"

// One warp per superblock of 256 values (lane l: values 8 l .. 8 l + 7, in sub-block l / 4):
// codes, the scale and the sub-blocks' code sums (integers: no order).
template <bool GATED>
__device__ __forceinline__ void q8k_quantize(int8_t* __restrict__ xq, float* __restrict__ dx,
                                             int16_t* __restrict__ xs, const float* __restrict__ x,
                                             long long ldx, const float* __restrict__ u, long long ldu, int m,
                                             int k) {
    const int S = k >> 8;
    const long long sbi = (long long)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    const int lane = threadIdx.x & 31;
    if (sbi >= (long long)m * S) return;  // the whole warp
    float v[8];
    if constexpr (GATED) {
        const long long r = sbi / S, c = (sbi - r * S) * 256 + lane * 8;
#pragma unroll
        for (int i = 0; i < 8; i++) v[i] = gated_act(x, ldx, u, ldu, r, c + i);
    } else {
        const float* p = x + sbi * 256 + lane * 8;  // scalar loads: x may start anywhere
#pragma unroll
        for (int i = 0; i < 8; i++) v[i] = __ldg(p + i);
    }
    // The first value of largest magnitude: the warp's largest |v| (a max has no order), then
    // the lowest lane holding it, and that lane's first such value.
    float amax = 0.f;
#pragma unroll
    for (int i = 0; i < 8; i++) amax = fmaxf(amax, fabsf(v[i]));
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
    float mine = 0.f;
    bool has = false;
#pragma unroll
    for (int i = 7; i >= 0; i--) {
        if (fabsf(v[i]) == amax) {
            mine = v[i];
            has = true;
        }
    }
    const unsigned holders = __ballot_sync(0xffffffffu, has);
    const float vmax = __shfl_sync(0xffffffffu, mine, holders ? __ffs(holders) - 1 : 0);
    uint32_t w[2] = {0u, 0u};
    int sum = 0;
    float d = 0.f;
    if (amax > 0.f) {
        const float iscale = __fdiv_rn(-127.f, vmax);
#pragma unroll
        for (int i = 0; i < 8; i++) {
            const int q = (int)fminf(fmaxf(roundf(__fmul_rn(iscale, v[i])), -128.f), 127.f);
            sum += q;
            w[i >> 2] |= (uint32_t)(q & 0xFF) << (8 * (i & 3));
        }
        d = __frcp_rn(iscale);  // 1 / iscale, correctly rounded
    }
    *reinterpret_cast<uint2*>(xq + sbi * 256 + lane * 8) = make_uint2(w[0], w[1]);
    sum += __shfl_xor_sync(0xffffffffu, sum, 1);
    sum += __shfl_xor_sync(0xffffffffu, sum, 2);
    if ((lane & 3) == 0) xs[sbi * 8 + (lane >> 2)] = (int16_t)sum;
    if (lane == 0) dx[sbi] = d;
}

extern "C" __global__ void q8k_quantize_rows(int8_t* __restrict__ xq, float* __restrict__ dx,
                                             int16_t* __restrict__ xs, const float* __restrict__ x, int m, int k) {
    q8k_quantize<false>(xq, dx, xs, x, k, x, 0, m, k);
}

// q8k_quantize_rows of silu(g) * u (gated_act), the same codes, scales and sums as
// silu_mul_rows followed by q8k_quantize_rows.
extern "C" __global__ void q8k_quantize_rows_gated(int8_t* __restrict__ xq, float* __restrict__ dx,
                                                   int16_t* __restrict__ xs, const float* __restrict__ g,
                                                   long long ldg, const float* __restrict__ u, long long ldu, int m,
                                                   int k) {
    q8k_quantize<true>(xq, dx, xs, g, ldg, u, ldu, m, k);
}

// ---------------------------------------------------------------------------------------
// qkmv: a warp per output column.
#define KV_WARPS 4
#define KV_STAGES 2

// Lane q's codes of sub-blocks 2q and 2q + 1 (eight words each) from its group's staged
// superblock, read as whole runs rather than word by word.
template <int KT>
__device__ __forceinline__ void kq_lane_codes(const uint8_t* sb, int q, uint32_t (&c)[2][8]) {
    if constexpr (KT == KT_Q4_K || KT == KT_Q5_K) {
        constexpr int QS = KT == KT_Q4_K ? 16 : 48;
        const uint4* p = reinterpret_cast<const uint4*>(sb + QS + 32 * q);  // 16-byte aligned
        const uint4 a = p[0], b = p[1];
        const uint32_t raw[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
        uint32_t hb[8];
        if constexpr (KT == KT_Q5_K) {
            const uint4* h = reinterpret_cast<const uint4*>(sb + 16);
            const uint4 ha = h[0], hb4 = h[1];
            hb[0] = ha.x, hb[1] = ha.y, hb[2] = ha.z, hb[3] = ha.w;
            hb[4] = hb4.x, hb[5] = hb4.y, hb[6] = hb4.z, hb[7] = hb4.w;
        }
#pragma unroll
        for (int i = 0; i < 8; i++) {
            c[0][i] = raw[i] & 0x0F0F0F0Fu;
            c[1][i] = (raw[i] >> 4) & 0x0F0F0F0Fu;
            if constexpr (KT == KT_Q5_K) {
                c[0][i] |= ((hb[i] >> (2 * q)) & 0x01010101u) << 4;
                c[1][i] |= ((hb[i] >> (2 * q + 1)) & 0x01010101u) << 4;
            }
        }
    } else {
        // Sub-blocks 2q, 2q + 1: half q / 2, parts 2 (q & 1) and 2 (q & 1) + 1: the low
        // nibbles of ql bytes 0..31 and 32..63 of the half (shifted by 4 (q & 1)), the 2-bit
        // fields 4 (q & 1) and 4 (q & 1) + 2 of its qh bytes.
        const int half = q >> 1, ls = 4 * (q & 1);
        uint32_t l0[8], l1[8], h[8];
        lds_run<8>(sb + half * 64, l0);
        lds_run<8>(sb + half * 64 + 32, l1);
        lds_run<8>(sb + 128 + half * 32, h);
#pragma unroll
        for (int i = 0; i < 8; i++) {
            c[0][i] = __vsub4(((l0[i] >> ls) & 0x0F0F0F0Fu) | (((h[i] >> ls) & 0x03030303u) << 4), 0x20202020u);
            c[1][i] = __vsub4(((l1[i] >> ls) & 0x0F0F0F0Fu) | (((h[i] >> (ls + 2)) & 0x03030303u) << 4), 0x20202020u);
        }
    }
}

// Lane q's share of one row's superblock sums: I over sub-blocks 2q, 2q + 1 (q6_k: their
// four halves) and, for q4_k / q5_k, M over the same two (xsw: the row's code sums of the
// pair, mw: the pair's mins as bytes 0 and 1). x codes as four 16-byte loads.
template <int KT>
__device__ __forceinline__ int2 kq_pair(const uint32_t (&c)[2][8], const int (&sa)[2], const int (&sb_)[2],
                                        const uint4 (&xa)[4], uint32_t xsw, uint32_t mw) {
    const uint32_t x[2][8] = {{xa[0].x, xa[0].y, xa[0].z, xa[0].w, xa[1].x, xa[1].y, xa[1].z, xa[1].w},
                              {xa[2].x, xa[2].y, xa[2].z, xa[2].w, xa[3].x, xa[3].y, xa[3].z, xa[3].w}};
    int isum = 0;
#pragma unroll
    for (int t = 0; t < 2; t++) {
        if constexpr (KT == KT_Q6_K) {
            int lo = 0, hi = 0;
#pragma unroll
            for (int i = 0; i < 4; i++) lo = __dp4a((int)c[t][i], (int)x[t][i], lo);
#pragma unroll
            for (int i = 4; i < 8; i++) hi = __dp4a((int)c[t][i], (int)x[t][i], hi);
            isum += sa[t] * lo + sb_[t] * hi;
        } else {
            int sd = 0;
#pragma unroll
            for (int i = 0; i < 8; i++) sd = __dp4a((int)c[t][i], (int)x[t][i], sd);
            isum += sa[t] * sd;
        }
    }
    const int msum = KT == KT_Q6_K ? 0 : __dp2a_lo((int)xsw, (int)mw, 0);
    return make_int2(isum, msum);
}

template <int KT, int R, bool PRE>
__device__ void qkmv(float* __restrict__ y, const int8_t* __restrict__ xq, const float* __restrict__ dx,
                     const int16_t* __restrict__ xs, const uint8_t* __restrict__ w, int m, int n, int k) {
    constexpr int BB = kq_bytes<KT>();
    constexpr int ROUND = 8 * BB;
    // A round's copy is the 16-byte aligned window around it (q6_k rows start on any even
    // address), plus room for lds_run's read past the last byte.
    __shared__ __align__(16) uint8_t stage[KV_WARPS][KV_STAGES][ROUND + 32];
    // Each row's eight superblock terms of a round, for the lane that sums that row.
    __shared__ __align__(16) float tsm[KV_WARPS][R][8];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int col = blockIdx.x * KV_WARPS + warp;
    if (col >= n) return;  // the whole warp
    const int g = lane >> 2, q = lane & 3;
    const int S = k >> 8, nb = k >> 5;
    const int rounds = (S + 7) >> 3;
    const uint8_t* row = w + (size_t)col * S * BB;
    const int o = (int)(reinterpret_cast<uintptr_t>(row) & 15);  // 0 but for q6_k
    const uint8_t* end = w + (size_t)n * S * BB;
    const int rows = min(m, R);
    auto load = [&](int r) {
        const int pieces = (o + min(8, S - r * 8) * BB + 15) >> 4;
        const uint8_t* src = row - o + (size_t)r * ROUND;  // ROUND is a multiple of 16
        for (int i = lane; i < pieces; i += 32) cp_async16_upto(stage[warp][r % KV_STAGES] + i * 16, src + i * 16, end);
    };
#pragma unroll
    for (int r = 0; r < KV_STAGES; r++) {
        if (r < rounds) load(r);
        cp_async_commit();
    }
    // Lane i < R keeps row i's sum.
    float acc = 0.f;
    for (int r = 0; r < rounds; r++) {
        const int s = r * 8 + g;
        const bool live = s < S;
        const int b0 = s * 8 + 2 * q;
        auto load_x = [&](int i, uint4(&xo)[4], float& dxo, uint32_t& xso) {
            if (live && i < rows) {
                const uint4* xp = reinterpret_cast<const uint4*>(xq + (size_t)i * k + (size_t)b0 * 32);
#pragma unroll
                for (int v = 0; v < 4; v++) xo[v] = __ldg(xp + v);
                dxo = __ldg(dx + (size_t)i * S + s);
                xso = __ldg(reinterpret_cast<const uint32_t*>(xs + (size_t)i * nb + b0));  // b0, nb even
            } else {
#pragma unroll
                for (int v = 0; v < 4; v++) xo[v] = make_uint4(0, 0, 0, 0);
                dxo = 0.f;
                xso = 0u;
            }
        };
        uint4 xa[PRE ? R : 1][4];
        float dxa[PRE ? R : 1];
        uint32_t xsa[PRE ? R : 1];
        if constexpr (PRE) {
#pragma unroll
            for (int i = 0; i < R; i++) load_x(i, xa[i], dxa[i], xsa[i]);
        }
        cp_async_wait<KV_STAGES - 1>();
        __syncwarp();
        const uint8_t* sb = stage[warp][r % KV_STAGES] + o + g * BB;
        uint32_t c[2][8];
        int sa[2] = {0, 0}, sm[2] = {0, 0};
        float d = 0.f, dmin = 0.f;
        if (live) {
            kq_lane_codes<KT>(sb, q, c);
            kscale<KT>(sb, 2 * q, &sa[0], &sm[0]);
            kscale<KT>(sb, 2 * q + 1, &sa[1], &sm[1]);
            kd<KT>(sb, &d, &dmin);
        } else {
#pragma unroll
            for (int i = 0; i < 8; i++) c[0][i] = c[1][i] = 0u;
        }
        const uint32_t mw = (uint32_t)sm[0] | ((uint32_t)sm[1] << 8);  // q4_k / q5_k: the pair's mins
        __syncwarp();  // every lane has read this stage: it may be refilled
        if (r + KV_STAGES < rounds) load(r + KV_STAGES);
        cp_async_commit();
#pragma unroll
        for (int i = 0; i < R; i++) {
            int2 sums;
            float dxi;
            if constexpr (PRE) {
                sums = kq_pair<KT>(c, sa, sm, xa[i], xsa[i], mw);
                dxi = dxa[i];
            } else {
                uint4 xl[4];
                uint32_t sl;
                load_x(i, xl, dxi, sl);
                sums = kq_pair<KT>(c, sa, sm, xl, sl, mw);
            }
            // The group's four lanes' integer sums (exact, any order), then its term.
            sums.x += __shfl_xor_sync(0xffffffffu, sums.x, 1);
            sums.x += __shfl_xor_sync(0xffffffffu, sums.x, 2);
            if constexpr (KT != KT_Q6_K) {
                sums.y += __shfl_xor_sync(0xffffffffu, sums.y, 1);
                sums.y += __shfl_xor_sync(0xffffffffu, sums.y, 2);
            }
            if (q == 0) tsm[warp][i][g] = kq_term(sums.x, sums.y, d, dmin, dxi);
        }
        __syncwarp();
        // The round's superblocks into each row's sum, in order: lane i adds row i's.
        if (lane < R) {
            const float4 lo = *reinterpret_cast<const float4*>(&tsm[warp][lane][0]);
            const float4 hi = *reinterpret_cast<const float4*>(&tsm[warp][lane][4]);
            const float tg[8] = {lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w};
            const int live_sb = S - r * 8;
            if (live_sb >= 8) {
#pragma unroll
                for (int gg = 0; gg < 8; gg++) acc = __fadd_rn(acc, tg[gg]);
            } else {
#pragma unroll
                for (int gg = 0; gg < 8; gg++)
                    if (gg < live_sb) acc = __fadd_rn(acc, tg[gg]);
            }
        }
    }
    if (lane < rows) y[(size_t)lane * n + col] = acc;
}

// ---------------------------------------------------------------------------------------
// qkgemm: a block per KG_BN columns x NT rows.
#define KG_BN 64
#define KG_XS 272  // bytes per staged activation row: 256 codes + 16 of padding (no bank conflicts)

template <int KT, int NT>
__device__ void qkgemm(float* __restrict__ y, const int8_t* __restrict__ xq, const float* __restrict__ dx,
                       const int16_t* __restrict__ xs, const uint8_t* __restrict__ w, int m, int n, int k) {
    constexpr int BB = kq_bytes<KT>(), ST = kq_stride<KT>();
    constexpr int WR = NT / 2;  // rows per warp
    constexpr int NJ = WR / 8;  // m16n8 tiles per warp
    __shared__ __align__(16) uint8_t wsm[2][KG_BN * ST + 16];
    __shared__ __align__(16) uint8_t xsm[2][NT * KG_XS];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int g = lane >> 2, tig = lane & 3;
    const int wc = warp & 3, wr = warp >> 2;
    const int row0 = blockIdx.x * NT, col0 = blockIdx.y * KG_BN;
    const int S = k >> 8, nb = k >> 5;
    const long long rb = (long long)S * BB;
    const uint8_t* end = w + (size_t)n * rb;
    // Where column c's superblock s starts in its staged window.
    auto win = [&](int c, int s) { return (int)(((long long)c * rb + (long long)s * BB) & 15); };
    auto load = [&](int s, int buf) {
        constexpr int pieces = ST / 16;
        for (int i = threadIdx.x; i < KG_BN * pieces; i += blockDim.x) {
            const int r = i / pieces, c = i - r * pieces;
            const int col = col0 + r;
            if (col < n) {
                const long long off = (long long)col * rb + (long long)s * BB;
                cp_async16_upto(wsm[buf] + r * ST + c * 16, w + (size_t)(off - (off & 15)) + c * 16, end);
            }
        }
        for (int i = threadIdx.x; i < NT * 16; i += blockDim.x) {
            const int r = i >> 4, c = i & 15;
            const int row = row0 + r;
            if (row < m) cp_async16(xsm[buf] + r * KG_XS + c * 16, xq + (size_t)row * k + (size_t)s * 256 + c * 16);
        }
    };
    load(0, 0);
    cp_async_commit();
    float acc[NJ][4];
#pragma unroll
    for (int jj = 0; jj < NJ; jj++) acc[jj][0] = acc[jj][1] = acc[jj][2] = acc[jj][3] = 0.f;
    const int wrow0 = row0 + wr * WR;
    for (int s = 0; s < S; s++) {
        if (s + 1 < S) load(s + 1, (s + 1) & 1);
        cp_async_commit();
        cp_async_wait<1>();
        __syncthreads();
        const int c_lo = col0 + wc * 16 + g;
        const uint8_t* lo = wsm[s & 1] + (wc * 16 + g) * ST + win(c_lo, s);          // column g's superblock
        const uint8_t* hi = wsm[s & 1] + (wc * 16 + g + 8) * ST + win(c_lo + 8, s);  // column g + 8's
        const uint8_t* xb = xsm[s & 1] + (wr * WR + g) * KG_XS + tig * 4;
        float d_lo, dm_lo, d_hi, dm_hi;
        kd<KT>(lo, &d_lo, &dm_lo);
        kd<KT>(hi, &d_hi, &dm_hi);
        int isum[NJ][4];
#pragma unroll
        for (int jj = 0; jj < NJ; jj++) isum[jj][0] = isum[jj][1] = isum[jj][2] = isum[jj][3] = 0;
#pragma unroll
        for (int j = 0; j < 8; j++) {
            int sa_lo, sb_lo, sa_hi, sb_hi;
            kscale<KT>(lo, j, &sa_lo, &sb_lo);
            kscale<KT>(hi, j, &sa_hi, &sb_hi);
            // The A fragments: values 4 tig .. 4 tig + 3 and 16 + 4 tig .. of columns g, g + 8
            // (q6_k: the first pair is the k16 mma of values 0..15, the second of 16..31).
            const uint32_t a[4] = {kword<KT>(lo, j, tig), kword<KT>(hi, j, tig), kword<KT>(lo, j, tig + 4),
                                   kword<KT>(hi, j, tig + 4)};
#pragma unroll
            for (int jj = 0; jj < NJ; jj++) {
                if (wrow0 + jj * 8 < m) {
                    // This lane's B fragment: row rbase + g, values 4 tig .. and 16 + 4 tig ..
                    const uint8_t* xr = xb + jj * 8 * KG_XS + j * 32;
                    const uint32_t x0 = lds32(xr), x1 = lds32(xr + 16);
                    if constexpr (KT == KT_Q6_K) {
                        int d0[4], d1[4];
                        mma_k16(d0, a[0], a[1], x0);
                        mma_k16(d1, a[2], a[3], x1);
                        isum[jj][0] += sa_lo * d0[0] + sb_lo * d1[0];
                        isum[jj][1] += sa_lo * d0[1] + sb_lo * d1[1];
                        isum[jj][2] += sa_hi * d0[2] + sb_hi * d1[2];
                        isum[jj][3] += sa_hi * d0[3] + sb_hi * d1[3];
                    } else {
                        int d[4];
                        mma_k32(d, a, x0, x1);
                        isum[jj][0] += sa_lo * d[0];
                        isum[jj][1] += sa_lo * d[1];
                        isum[jj][2] += sa_hi * d[2];
                        isum[jj][3] += sa_hi * d[3];
                    }
                }
            }
        }
        uint2 mw_lo = make_uint2(0u, 0u), mw_hi = make_uint2(0u, 0u);
        if constexpr (KT != KT_Q6_K) {
            mw_lo = kq_mins(lo);
            mw_hi = kq_mins(hi);
        }
#pragma unroll
        for (int jj = 0; jj < NJ; jj++) {
            const int rbase = wrow0 + jj * 8;
            if (rbase < m) {
                const int r0 = rbase + tig * 2, r1 = r0 + 1;
                const float dx0 = r0 < m ? __ldg(dx + (size_t)r0 * S + s) : 0.f;
                const float dx1 = r1 < m ? __ldg(dx + (size_t)r1 * S + s) : 0.f;
                int m0[2] = {0, 0}, m1[2] = {0, 0};
                if constexpr (KT != KT_Q6_K) {
                    const uint4 z = make_uint4(0u, 0u, 0u, 0u);
                    const uint4 xs0 = r0 < m ? __ldg(reinterpret_cast<const uint4*>(xs + (size_t)r0 * nb + s * 8)) : z;
                    const uint4 xs1 = r1 < m ? __ldg(reinterpret_cast<const uint4*>(xs + (size_t)r1 * nb + s * 8)) : z;
                    m0[0] = kq_msum(xs0, mw_lo), m1[0] = kq_msum(xs1, mw_lo);
                    m0[1] = kq_msum(xs0, mw_hi), m1[1] = kq_msum(xs1, mw_hi);
                }
                acc[jj][0] = __fadd_rn(acc[jj][0], kq_term(isum[jj][0], m0[0], d_lo, dm_lo, dx0));
                acc[jj][1] = __fadd_rn(acc[jj][1], kq_term(isum[jj][1], m1[0], d_lo, dm_lo, dx1));
                acc[jj][2] = __fadd_rn(acc[jj][2], kq_term(isum[jj][2], m0[1], d_hi, dm_hi, dx0));
                acc[jj][3] = __fadd_rn(acc[jj][3], kq_term(isum[jj][3], m1[1], d_hi, dm_hi, dx1));
            }
        }
        __syncthreads();  // every warp is done with this stage before it is refilled
    }
#pragma unroll
    for (int jj = 0; jj < NJ; jj++) {
        const int r0 = wrow0 + jj * 8 + tig * 2;
        const int c0 = col0 + wc * 16 + g;
#pragma unroll
        for (int e = 0; e < 4; e++) {
            const int row = r0 + (e & 1), col = c0 + (e >> 1) * 8;
            if (row < m && col < n) y[(size_t)row * n + col] = acc[jj][e];
        }
    }
}

// qkmv_<t>_<R>: the activations of up to two rows loaded before the weights' wait, of more
// rows row by row after it (loading all four rows' before, at 128 registers, measured the same
// on the H200: 9B Q4_K verify of 4 rows 112.7 against 111.5 steps/s).
// MINB: blocks an SM must hold, a register budget (ptxas, sm_90: one row at 72 registers
// holds 28 warps an SM without spilling, where the compiler's own choice, 80, held 24; two
// rows spill below ~90).
#define KQMV(suffix, KT, R, NAME, PRE, MINB)                                                                  \
    extern "C" __global__ void __launch_bounds__(KV_WARPS * 32, MINB)                                        \
        NAME(float* y, const int8_t* xq, const float* dx, const int16_t* xs, const uint8_t* w, int m, int n,  \
             int k) {                                                                                         \
        qkmv<KT, R, PRE>(y, xq, dx, xs, w, m, n, k);                                                         \
    }
#define KQGEMM(suffix, KT, NT)                                                                                \
    extern "C" __global__ void __launch_bounds__(256, 2)                                                      \
        qkgemm_##suffix##_##NT(float* y, const int8_t* xq, const float* dx, const int16_t* xs, const uint8_t* w, \
                               int m, int n, int k) {                                                         \
        qkgemm<KT, NT>(y, xq, dx, xs, w, m, n, k);                                                           \
    }
#define KQ_ALL(suffix, KT)                                                                                    \
    KQMV(suffix, KT, 1, qkmv_##suffix##_1, true, 7) KQMV(suffix, KT, 2, qkmv_##suffix##_2, true, 5)            \
    KQMV(suffix, KT, 4, qkmv_##suffix##_4, false, 7)                                                          \
    KQMV(suffix, KT, 8, qkmv_##suffix##_8, false, 7)                                                          \
    KQGEMM(suffix, KT, 16) KQGEMM(suffix, KT, 32)

KQ_ALL(q4_k, KT_Q4_K)
KQ_ALL(q5_k, KT_Q5_K)
KQ_ALL(q6_k, KT_Q6_K)
