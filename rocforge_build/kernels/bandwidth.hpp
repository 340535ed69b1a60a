// Memory-bandwidth probe: STREAM-style copy (c = a) and triad (a = b + s*c) over float32 arrays.
//
// Each thread moves RF_BW_UNROLL float4 values spaced one block apart, so a wave reads and writes
// whole contiguous lines and every thread keeps several loads in flight.  The tail that does not
// fill a float4 is handled by scalar code in block 0.
#pragma once
#include "rf_portability.h"

#ifndef RF_BW_UNROLL
#define RF_BW_UNROLL 4
#endif
#define RF_BW_THREADS 256

__global__ void __launch_bounds__(RF_BW_THREADS)
rf_copy_kernel(const float* __restrict__ a, float* __restrict__ c, long long n) {
  const long long n4 = n / 4;
  const float4* __restrict__ a4 = reinterpret_cast<const float4*>(a);
  float4* __restrict__ c4 = reinterpret_cast<float4*>(c);
  const long long base = (long long)blockIdx.x * (RF_BW_THREADS * RF_BW_UNROLL) + threadIdx.x;
  float4 v[RF_BW_UNROLL];
#pragma unroll
  for (int u = 0; u < RF_BW_UNROLL; ++u) {
    const long long i = base + (long long)u * RF_BW_THREADS;
    if (i < n4) v[u] = a4[i];
  }
#pragma unroll
  for (int u = 0; u < RF_BW_UNROLL; ++u) {
    const long long i = base + (long long)u * RF_BW_THREADS;
    if (i < n4) c4[i] = v[u];
  }
  if (blockIdx.x == 0) {
    for (long long i = n4 * 4 + threadIdx.x; i < n; i += RF_BW_THREADS) c[i] = a[i];
  }
}

__global__ void __launch_bounds__(RF_BW_THREADS)
rf_triad_kernel(float* __restrict__ a, const float* __restrict__ b, const float* __restrict__ c,
                float s, long long n) {
  const long long n4 = n / 4;
  float4* __restrict__ a4 = reinterpret_cast<float4*>(a);
  const float4* __restrict__ b4 = reinterpret_cast<const float4*>(b);
  const float4* __restrict__ c4 = reinterpret_cast<const float4*>(c);
  const long long base = (long long)blockIdx.x * (RF_BW_THREADS * RF_BW_UNROLL) + threadIdx.x;
  float4 vb[RF_BW_UNROLL], vc[RF_BW_UNROLL];
#pragma unroll
  for (int u = 0; u < RF_BW_UNROLL; ++u) {
    const long long i = base + (long long)u * RF_BW_THREADS;
    if (i < n4) { vb[u] = b4[i]; vc[u] = c4[i]; }
  }
#pragma unroll
  for (int u = 0; u < RF_BW_UNROLL; ++u) {
    const long long i = base + (long long)u * RF_BW_THREADS;
    if (i < n4) {
      float4 r;
      r.x = vb[u].x + s * vc[u].x;
      r.y = vb[u].y + s * vc[u].y;
      r.z = vb[u].z + s * vc[u].z;
      r.w = vb[u].w + s * vc[u].w;
      a4[i] = r;
    }
  }
  if (blockIdx.x == 0) {
    for (long long i = n4 * 4 + threadIdx.x; i < n; i += RF_BW_THREADS) a[i] = b[i] + s * c[i];
  }
}

static inline unsigned rf_bw_blocks(long long n) {
  const long long per_block = (long long)RF_BW_THREADS * RF_BW_UNROLL;
  const long long n4 = n / 4;
  const long long blocks = (n4 + per_block - 1) / per_block;
  return (unsigned)(blocks > 0 ? blocks : 1);
}
