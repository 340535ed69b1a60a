// The fixture's HIP part (FIXTURE_HIP=ON): one kernel and a host entry point, so a build of the
// `hip` backend compiles real device code for CMAKE_HIP_ARCHITECTURES and links it.
#include <hip/hip_runtime.h>

__global__ void fixture_scale_kernel(float *x, float factor, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        x[i] *= factor;
    }
}

extern "C" int fixture_hip_scale(float *device_x, float factor, int n) {
    hipLaunchKernelGGL(fixture_scale_kernel, dim3((n + 255) / 256), dim3(256), 0, 0, device_x,
                       factor, n);
    return hipGetLastError() == hipSuccess ? 0 : 1;
}
