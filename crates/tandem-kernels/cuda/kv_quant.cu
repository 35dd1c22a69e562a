// Encoding KV rows into ggml q8_0 / q4_0 blocks on the device, with the CPU encoder's exact
// arithmetic (kv/dtype.rs: same scale, same rounding, no fused multiply-adds), so a position
// written on the GPU holds the bytes the CPU would write.
// x: [n_rows, hd] f32; out: [n_rows, hd / 32 * block bytes]. One thread per 32-value block.
#include "kv_quant.cuh"

extern "C" __global__ void kv_encode_q8_0(uint8_t* __restrict__ out, const float* __restrict__ x, int n_blocks) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n_blocks) return;
    const float* v = x + (size_t)i * 32;
    uint8_t* b = out + (size_t)i * Q8_BYTES;
    float amax = 0.f;
    for (int j = 0; j < 32; j++) amax = fmaxf(amax, fabsf(v[j]));
    __half d = __float2half_rn(__fdiv_rn(amax, 127.0f));
    float id = amax > 0.f ? __fdiv_rn(127.0f, amax) : 0.f;
    unsigned short bits = __half_as_ushort(d);
    b[0] = bits & 0xff;
    b[1] = bits >> 8;
    for (int j = 0; j < 32; j++) {
        float q = fminf(fmaxf(roundf(__fmul_rn(v[j], id)), -127.f), 127.f);
        b[2 + j] = (uint8_t)(int8_t)q;
    }
}

extern "C" __global__ void kv_encode_q4_0(uint8_t* __restrict__ out, const float* __restrict__ x, int n_blocks) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n_blocks) return;
    const float* v = x + (size_t)i * 32;
    float mx = 0.f;
    for (int j = 0; j < 32; j++)
        if (fabsf(v[j]) > fabsf(mx)) mx = v[j];
    float d = __fdiv_rn(mx, -8.0f);
    float id = d != 0.f ? __fdiv_rn(1.0f, d) : 0.f;
    // The block is built in registers and written as nine 16-bit words (blocks are 18 bytes,
    // so every block starts on an even address): written byte by byte, the scale's low byte
    // came back as zero on the H200 (check-device `kv_encode`), the nibbles intact.
    unsigned short w[9];
    w[0] = __half_as_ushort(__float2half_rn(d));
    for (int j = 0; j < 16; j += 2) {
        unsigned short pair = 0;
        for (int h = 0; h < 2; h++) {
            int lo = (int)__fadd_rn(__fmul_rn(v[j + h], id), 8.5f);
            int hi = (int)__fadd_rn(__fmul_rn(v[j + h + 16], id), 8.5f);
            lo = min(max(lo, 0), 15);
            hi = min(max(hi, 0), 15);
            pair |= (unsigned short)((lo | (hi << 4)) << (8 * h));
        }
        w[1 + j / 2] = pair;
    }
    unsigned short* b = reinterpret_cast<unsigned short*>(out + (size_t)i * Q4_BYTES);
#pragma unroll
    for (int j = 0; j < 9; j++) b[j] = w[j];
}
