// rocforge kernels: the small portability layer.
//
// The kernels and the host harness are written once, in HIP.  On the AMD path this header is
// just <hip/hip_runtime.h>.  On the CUDA path (nvcc) it maps the few HIP names the project uses
// onto the CUDA runtime directly: HIP's own nvidia_detail headers (Debian's HIP 5.2) do not
// compile against CUDA 13, and the project needs nothing more than this list.
#pragma once

#if defined(__HIPCC__) || defined(__HIP__) || defined(__HIP_PLATFORM_AMD__)
#include <hip/hip_runtime.h>
#include <hip/hip_fp16.h>
#define RF_PLATFORM "hip-amd"
#define RF_AMD 1

#elif defined(__CUDACC__)
#include <cuda_runtime.h>
#include <cuda_fp16.h>
#define RF_PLATFORM "cuda"
#define RF_CUDA 1

typedef cudaError_t hipError_t;
typedef cudaEvent_t hipEvent_t;
typedef cudaDeviceProp hipDeviceProp_t;
#define hipSuccess cudaSuccess
#define hipGetErrorString cudaGetErrorString
#define hipGetLastError cudaGetLastError
#define hipGetDeviceCount cudaGetDeviceCount
#define hipGetDeviceProperties cudaGetDeviceProperties
#define hipSetDevice cudaSetDevice
#define hipDeviceSynchronize cudaDeviceSynchronize
#define hipMalloc cudaMalloc
#define hipFree cudaFree
#define hipMemcpy cudaMemcpy
#define hipMemset cudaMemset
#define hipMemcpyHostToDevice cudaMemcpyHostToDevice
#define hipMemcpyDeviceToHost cudaMemcpyDeviceToHost
#define hipMemcpyDeviceToDevice cudaMemcpyDeviceToDevice
#define hipEventCreate cudaEventCreate
#define hipEventDestroy cudaEventDestroy
#define hipEventRecord cudaEventRecord
#define hipEventSynchronize cudaEventSynchronize
#define hipEventElapsedTime cudaEventElapsedTime
#define hipDriverGetVersion cudaDriverGetVersion
#define hipRuntimeGetVersion cudaRuntimeGetVersion
#define hipOccupancyMaxActiveBlocksPerMultiprocessor cudaOccupancyMaxActiveBlocksPerMultiprocessor
#define hipFuncSetAttribute cudaFuncSetAttribute
#define hipFuncAttributeMaxDynamicSharedMemorySize cudaFuncAttributeMaxDynamicSharedMemorySize

#else
#error "rocforge kernels: compile with a HIP compiler (clang -x hip, hipcc) or nvcc -x cu"
#endif

// Wave (warp) size.  Device code: a compile-time constant (the AMD compiler defines it per
// target: 64 on GCN/CDNA, 32 on RDNA unless -mwavefrontsize64).  Host code asks the device.
#if defined(RF_AMD)
#if defined(__AMDGCN_WAVEFRONT_SIZE__)
#define RF_DEVICE_WAVE __AMDGCN_WAVEFRONT_SIZE__
#elif defined(__AMDGCN_WAVEFRONT_SIZE)
#define RF_DEVICE_WAVE __AMDGCN_WAVEFRONT_SIZE
#else
#define RF_DEVICE_WAVE 64  // host pass only: never used in device code
#endif
#else
#define RF_DEVICE_WAVE 32
#endif

// Lane shuffle: HIP's __shfl_down is the whole wave; CUDA wants a lane mask.
template <typename T>
__device__ __forceinline__ T rf_shfl_down(T v, int delta) {
#if defined(RF_CUDA)
  return __shfl_down_sync(0xffffffffu, v, delta);
#else
  return __shfl_down(v, delta);
#endif
}

// Barrier for the lanes of one wave, with their shared-memory (LDS) writes visible to each
// other after it.  CUDA: __syncwarp.  AMD: a wave runs in lockstep, so what is needed is that
// the LDS stores have completed (the release/acquire fences) and that the compiler moves no LDS
// access across the point (wave_barrier); this is how newer HIP implements __syncwarp.
__device__ __forceinline__ void rf_wave_sync() {
#if defined(RF_CUDA)
  __syncwarp();
#else
  __builtin_amdgcn_fence(__ATOMIC_RELEASE, "wavefront");
  __builtin_amdgcn_wave_barrier();
  __builtin_amdgcn_fence(__ATOMIC_ACQUIRE, "wavefront");
#endif
}

// Sum over one wave; lane 0 holds the result.
__device__ __forceinline__ float rf_wave_sum(float v) {
#pragma unroll
  for (int off = RF_DEVICE_WAVE / 2; off > 0; off >>= 1) v += rf_shfl_down(v, off);
  return v;
}

// FP16 -> FP32 from the raw IEEE bits (the same on both paths, no header differences).
__device__ __forceinline__ float rf_half_bits_to_float(unsigned short bits) {
  __half h;
#if defined(RF_CUDA)
  h = __ushort_as_half(bits);
#else
  __builtin_memcpy(&h, &bits, sizeof(bits));
#endif
  return __half2float(h);
}
