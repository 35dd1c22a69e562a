// The chain's walk, shared by tmma.cu (mma.sync) and tmma_wg.cu (wgmma): steps of 32 values
// cut into segments of L = min(TM_MAXL, max(1, steps / TM_WARPS)) steps, partition p taking
// the segments p, p + TM_WARPS, ... in order (tmma.cu's header has the whole chain).
#pragma once

#define TM_WARPS 8
#define TM_MAXL 8

// The chain's shape for rows of k values: its 32-value steps, L steps a segment, nseg segments.
struct TmChain {
    int steps, L, nseg;
    __device__ explicit TmChain(int k)
        : steps(k >> 5), L(min(TM_MAXL, max(1, (k >> 5) / TM_WARPS))), nseg((steps + L - 1) / L) {}
};

// The steps in the chain's order: partition p, its segments p, p + 8, ..., each segment's steps.
// start_at walks partitions p0 .. pe - 1 only (a split call's block).
struct TgSteps {
    int p, seg, i, L, nseg, steps, pe;
    __device__ void start(int L_, int nseg_, int steps_) { start_at(L_, nseg_, steps_, 0, TM_WARPS); }
    __device__ void start(const TmChain& c) { start_at(c.L, c.nseg, c.steps, 0, TM_WARPS); }
    __device__ void start_at(const TmChain& c, int p0, int pe_) { start_at(c.L, c.nseg, c.steps, p0, pe_); }
    __device__ void start_at(int L_, int nseg_, int steps_, int p0, int pe_) {
        L = L_, nseg = nseg_, steps = steps_, p = p0, seg = p0, i = 0, pe = pe_;
        skip();
    }
    __device__ void skip() {  // past empty partitions
        while (p < pe && seg >= nseg) seg = ++p;
    }
    __device__ bool done() const { return p >= pe; }
    __device__ int step() const { return seg * L + i; }
    __device__ void next() {
        if (++i < min(L, steps - seg * L)) return;
        i = 0;
        seg += TM_WARPS;
        if (seg >= nseg) {
            seg = ++p;
            skip();
        }
    }
};
