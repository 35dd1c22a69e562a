// Exhaustive check of common.cuh's i2f_small (|i| < 2^22) and i2f_24 (|i| < 2^24) against
// __int2float_rn, bit for bit, on the device (the integer GEMMs' chains rest on them being
// exact). Build and run on the GPU machine:
//   nvcc -O3 -std=c++17 -arch=sm_90 -I../cuda -o /tmp/i2f_check i2f_check.cu && /tmp/i2f_check
#include <cstdio>
#include "common.cuh"

__global__ void check(unsigned long long* bad, int lo, int hi, int wide) {
    for (long long j = (long long)blockIdx.x * blockDim.x + threadIdx.x + lo; j < hi;
         j += (long long)gridDim.x * blockDim.x) {
        const int i = (int)j;
        const float got = wide ? i2f_24(i) : i2f_small(i);
        if (__float_as_uint(got) != __float_as_uint(__int2float_rn(i))) atomicAdd(bad, 1ull);
    }
}

int main() {
    unsigned long long* bad;
    cudaMallocManaged(&bad, 2 * sizeof(unsigned long long));
    bad[0] = bad[1] = 0;
    check<<<1024, 256>>>(bad, -(1 << 22) + 1, 1 << 22, 0);
    check<<<1024, 256>>>(bad + 1, -(1 << 24) + 1, 1 << 24, 1);
    cudaDeviceSynchronize();
    printf("i2f_small over |i| < 2^22: %llu mismatches; i2f_24 over |i| < 2^24: %llu mismatches\n", bad[0], bad[1]);
    return (bad[0] || bad[1]) ? 1 : 0;
}
