// FP16 GEMM probe: C[M][N] (fp32) = A[M][K] (fp16, row-major) * B[K][N] (fp16, row-major).
//
// One kernel, one launch shape (256 threads, a 64x64 tile of C per block), three bodies chosen at
// compile time for the target being compiled:
//   RF_GEMM_PATH 11: RDNA3/3.5 (gfx11) WMMA, __builtin_amdgcn_wmma_f32_16x16x16_f16_w32
//   RF_GEMM_PATH 12: RDNA4 (gfx12) WMMA, __builtin_amdgcn_wmma_f32_16x16x16_f16_w32_gfx12
//   RF_GEMM_PATH 0:  portable fallback (LDS tiles, fp32 FMA), everything else incl. CUDA
// `rocforge-kernels info` reports the path the device code was built with.
// Needs M, N, K multiples of 64.
#pragma once
#include "rf_portability.h"

#define RF_GEMM_THREADS 256
#define RF_GEMM_TILE 64

#if defined(RF_AMD) && defined(__HIP_DEVICE_COMPILE__) && RF_DEVICE_WAVE == 32
#if defined(__gfx1100__) || defined(__gfx1101__) || defined(__gfx1102__) || defined(__gfx1103__) || \
    defined(__gfx1150__) || defined(__gfx1151__) || defined(__gfx1152__) || defined(__gfx1153__) || \
    defined(__gfx11_generic__)
#if __has_builtin(__builtin_amdgcn_wmma_f32_16x16x16_f16_w32)
#define RF_GEMM_PATH 11
#endif
#elif defined(__gfx1200__) || defined(__gfx1201__) || defined(__gfx12_generic__)
#if __has_builtin(__builtin_amdgcn_wmma_f32_16x16x16_f16_w32_gfx12)
#define RF_GEMM_PATH 12
#endif
#endif
#endif
#ifndef RF_GEMM_PATH
#define RF_GEMM_PATH 0
#endif

#if RF_GEMM_PATH != 0
typedef _Float16 rf_half16 __attribute__((ext_vector_type(16)));
typedef _Float16 rf_half8 __attribute__((ext_vector_type(8)));
typedef float rf_float8 __attribute__((ext_vector_type(8)));
#endif

__global__ void __launch_bounds__(RF_GEMM_THREADS)
rf_gemm_f16_kernel(const __half* __restrict__ a, const __half* __restrict__ b,
                   float* __restrict__ c, int m, int n, int k) {
  const int t = threadIdx.x;
  const int m0 = blockIdx.y * RF_GEMM_TILE;
  const int n0 = blockIdx.x * RF_GEMM_TILE;
#if RF_GEMM_PATH != 0
  // 8 waves of 32: wave w owns rows 16*(w/2).. and two 16x16 fragments at columns 32*(w%2)+{0,16}.
  constexpr int BK = 32;
  __shared__ _Float16 as[RF_GEMM_TILE][BK + 8];
  __shared__ _Float16 bs[BK][RF_GEMM_TILE + 8];
  const int lane = t % 32, wv = t / 32;
  const int fr = 16 * (wv / 2), fc = 32 * (wv % 2);
  const int li = lane % 16, hi = lane / 16;
  rf_float8 acc0 = {}, acc1 = {};
  const _Float16* ah = reinterpret_cast<const _Float16*>(a);
  const _Float16* bh = reinterpret_cast<const _Float16*>(b);
  for (int k0 = 0; k0 < k; k0 += BK) {
    {  // 64x32 of A and 32x64 of B: 8 halves (16 bytes) per thread each
      const int ar = t / 4, ak = (t % 4) * 8;
      *reinterpret_cast<uint4*>(&as[ar][ak]) =
          *reinterpret_cast<const uint4*>(ah + (long long)(m0 + ar) * k + k0 + ak);
      const int br = t / 8, bc = (t % 8) * 8;
      *reinterpret_cast<uint4*>(&bs[br][bc]) =
          *reinterpret_cast<const uint4*>(bh + (long long)(k0 + br) * n + n0 + bc);
    }
    __syncthreads();
#pragma unroll
    for (int ks = 0; ks < BK; ks += 16) {
#if RF_GEMM_PATH == 11
      // gfx11: lane holds row (lane%16) of A and column (lane%16) of B, all 16 k (lanes 16-31
      // repeat lanes 0-15); result element e of a lane is row 2e + lane/16.
      rf_half16 fa, fb0, fb1;
#pragma unroll
      for (int e = 0; e < 16; ++e) {
        fa[e] = as[fr + li][ks + e];
        fb0[e] = bs[ks + e][fc + li];
        fb1[e] = bs[ks + e][fc + 16 + li];
      }
      acc0 = __builtin_amdgcn_wmma_f32_16x16x16_f16_w32(fa, fb0, acc0);
      acc1 = __builtin_amdgcn_wmma_f32_16x16x16_f16_w32(fa, fb1, acc1);
#else
      // gfx12: lane holds 8 k of its row/column, k = 8*(lane/16) + e; result row 8*(lane/16) + e.
      rf_half8 fa, fb0, fb1;
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        fa[e] = as[fr + li][ks + 8 * hi + e];
        fb0[e] = bs[ks + 8 * hi + e][fc + li];
        fb1[e] = bs[ks + 8 * hi + e][fc + 16 + li];
      }
      acc0 = __builtin_amdgcn_wmma_f32_16x16x16_f16_w32_gfx12(fa, fb0, acc0);
      acc1 = __builtin_amdgcn_wmma_f32_16x16x16_f16_w32_gfx12(fa, fb1, acc1);
#endif
    }
    __syncthreads();
  }
#pragma unroll
  for (int e = 0; e < 8; ++e) {
#if RF_GEMM_PATH == 11
    const int row = m0 + fr + 2 * e + hi;
#else
    const int row = m0 + fr + 8 * hi + e;
#endif
    c[(long long)row * n + n0 + fc + li] = acc0[e];
    c[(long long)row * n + n0 + fc + 16 + li] = acc1[e];
  }
#else
  // Portable fallback: 16x16 threads, each computing a 4x4 strided sub-tile in fp32.
  constexpr int BK = 16;
  __shared__ float as[BK][RF_GEMM_TILE + 4];
  __shared__ float bs[BK][RF_GEMM_TILE + 4];
  const int tx = t % 16, ty = t / 16;
  float acc[4][4];
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j) acc[i][j] = 0.0f;
  for (int k0 = 0; k0 < k; k0 += BK) {
    {
      const int ar = t / 4, ak = (t % 4) * 4;  // 64 rows x 16 k of A, stored k-major
      const __half* pa = a + (long long)(m0 + ar) * k + k0 + ak;
#pragma unroll
      for (int i = 0; i < 4; ++i) as[ak + i][ar] = __half2float(pa[i]);
      const int br = t / 16, bc = (t % 16) * 4;  // 16 k x 64 columns of B
      const __half* pb = b + (long long)(k0 + br) * n + n0 + bc;
#pragma unroll
      for (int j = 0; j < 4; ++j) bs[br][bc + j] = __half2float(pb[j]);
    }
    __syncthreads();
#pragma unroll
    for (int kk = 0; kk < BK; ++kk) {
      float av[4], bv[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) av[i] = as[kk][ty + 16 * i];
#pragma unroll
      for (int j = 0; j < 4; ++j) bv[j] = bs[kk][tx + 16 * j];
#pragma unroll
      for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) acc[i][j] += av[i] * bv[j];
    }
    __syncthreads();
  }
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j)
      c[(long long)(m0 + ty + 16 * i) * n + n0 + tx + 16 * j] = acc[i][j];
#endif
}
