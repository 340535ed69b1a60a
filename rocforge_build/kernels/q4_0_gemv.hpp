// Q4_0 GEMV: y[m] = sum_k W[m][k] * x[k], W in ggml's Q4_0 format (the LLM decode inner loop).
//
// A Q4_0 block holds 32 weights in 18 bytes: an fp16 scale d, then 16 bytes qs; byte j carries
// weight j in its low nibble and weight j+16 in its high nibble; weight = (q - 8) * d.  A row of
// k weights is k/32 consecutive blocks; rows follow each other (a ggml tensor, row-major).
//
// As in llama.cpp's decode path (mul_mat_vec_q), x is first quantized to 8 bits per block of 32
// (scale dx = max|x|/127, xq = rint(x/dx)), so each block is an integer dot product done four
// bytes at a time (dp4a / v_dot4):  sum_j (q_j - 8) * xq_j * d * dx.
//
// Blocks are 18 bytes, so a lane cannot load its block with wide aligned loads.  Each wave
// instead streams a chunk of `wave` blocks per row with coalesced 32-bit loads into LDS, then
// every lane decodes one block from LDS.  A wave works on RF_GEMV_ROWS rows at once, so the x
// values a lane loads are reused across rows.  Needs k % 64 == 0 (rows start 4-byte aligned).
#pragma once
#include "rf_portability.h"

#define RF_Q4_0_BLOCK 32
#define RF_Q4_0_BYTES 18
#define RF_GEMV_THREADS 256
#ifndef RF_GEMV_ROWS
#define RF_GEMV_ROWS 8
#endif

// Signed 8-bit dot product of four byte lanes, accumulated: c + sum_i a.i * b.i.
__device__ __forceinline__ int rf_dp4a(int a, int b, int c) {
#if defined(RF_CUDA)
  return __dp4a(a, b, c);
#elif (defined(__gfx1100__) || defined(__gfx1101__) || defined(__gfx1102__) ||      \
       defined(__gfx1103__) || defined(__gfx1150__) || defined(__gfx1151__) ||      \
       defined(__gfx1152__) || defined(__gfx1153__) || defined(__gfx1200__) ||      \
       defined(__gfx1201__)) && __has_builtin(__builtin_amdgcn_sudot4)
  return __builtin_amdgcn_sudot4(true, a, true, b, c, false);  // RDNA3/4: v_dot4_i32_iu8
#elif (defined(__gfx906__) || defined(__gfx908__) || defined(__gfx90a__) ||         \
       defined(__gfx940__) || defined(__gfx941__) || defined(__gfx942__) ||         \
       defined(__gfx950__) || defined(__gfx1011__) || defined(__gfx1012__) ||       \
       defined(__gfx1030__) || defined(__gfx1031__) || defined(__gfx1032__) ||      \
       defined(__gfx1033__) || defined(__gfx1034__) || defined(__gfx1035__) ||      \
       defined(__gfx1036__)) && __has_builtin(__builtin_amdgcn_sdot4)
  return __builtin_amdgcn_sdot4(a, b, c, false);  // v_dot4_i32_i8
#else
  const signed char* pa = reinterpret_cast<const signed char*>(&a);
  const signed char* pb = reinterpret_cast<const signed char*>(&b);
  return c + pa[0] * pb[0] + pa[1] * pb[1] + pa[2] * pb[2] + pa[3] * pb[3];
#endif
}

// x (k floats) -> xq (k int8), per block of 32: dx = max|x| / 127 and sum(xq).
__global__ void rf_quantize_q8_kernel(const float* __restrict__ x, signed char* __restrict__ xq,
                                      float* __restrict__ dx, int* __restrict__ xsum, int k) {
  const int b = blockIdx.x * blockDim.x + threadIdx.x;
  if (b >= k / RF_Q4_0_BLOCK) return;
  const float* xb = x + (long long)b * RF_Q4_0_BLOCK;
  float amax = 0.0f;
  for (int j = 0; j < RF_Q4_0_BLOCK; ++j) amax = fmaxf(amax, fabsf(xb[j]));
  const float d = amax / 127.0f;
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  int sum = 0;
  for (int j = 0; j < RF_Q4_0_BLOCK; ++j) {
    const int q = (int)rintf(xb[j] * id);
    xq[(long long)b * RF_Q4_0_BLOCK + j] = (signed char)q;
    sum += q;
  }
  dx[b] = d;
  xsum[b] = sum;
}

__global__ void __launch_bounds__(RF_GEMV_THREADS)
rf_q4_0_gemv_kernel(const unsigned char* __restrict__ w, const signed char* __restrict__ xq,
                    const float* __restrict__ dx, const int* __restrict__ xsum,
                    float* __restrict__ y, int m, int k) {
  constexpr int WAVE = RF_DEVICE_WAVE;
  constexpr int NWAVES = RF_GEMV_THREADS / WAVE;
  constexpr int CHUNK_WORDS = WAVE * RF_Q4_0_BYTES / 4;
  constexpr int WORDS_PER_LANE = (CHUNK_WORDS + WAVE - 1) / WAVE;
  __shared__ unsigned int stage[NWAVES][RF_GEMV_ROWS][CHUNK_WORDS];

  const int lane = threadIdx.x % WAVE;
  const int wave = threadIdx.x / WAVE;
  const int nb = k / RF_Q4_0_BLOCK;
  const long long row_bytes = (long long)nb * RF_Q4_0_BYTES;
  const int row0 = (blockIdx.x * NWAVES + wave) * RF_GEMV_ROWS;

  float acc[RF_GEMV_ROWS];
#pragma unroll
  for (int r = 0; r < RF_GEMV_ROWS; ++r) acc[r] = 0.0f;

  // Every wave of the block runs the same number of chunks (same k), so the barriers match.
  for (int c0 = 0; c0 < nb; c0 += WAVE) {
    const int nblk = min(WAVE, nb - c0);  // even: nb and WAVE are
    const int nwords = nblk * RF_Q4_0_BYTES / 4;
    const bool active = lane < nblk;
    const int b = c0 + lane;

    int xv[8];
    float xd = 0.0f;
    int xs = 0;
    if (active) {
      const int4* x4 = reinterpret_cast<const int4*>(xq + (long long)b * RF_Q4_0_BLOCK);
      const int4 lo = x4[0], hi = x4[1];
      xv[0] = lo.x; xv[1] = lo.y; xv[2] = lo.z; xv[3] = lo.w;
      xv[4] = hi.x; xv[5] = hi.y; xv[6] = hi.z; xv[7] = hi.w;
      xd = dx[b];
      xs = xsum[b];
    }
    // All loads of the chunk first (into registers, so they are in flight together), then the
    // LDS stores: a load-store loop would wait out the memory latency once per word.
    unsigned int words[RF_GEMV_ROWS][WORDS_PER_LANE];
#pragma unroll
    for (int r = 0; r < RF_GEMV_ROWS; ++r) {
      const int row = min(row0 + r, m - 1);  // rows past the end load row m-1, never stored
      const unsigned int* src = reinterpret_cast<const unsigned int*>(
          w + (long long)row * row_bytes + (long long)c0 * RF_Q4_0_BYTES);
#pragma unroll
      for (int u = 0; u < WORDS_PER_LANE; ++u) {
        const int i = lane + u * WAVE;
        words[r][u] = i < nwords ? src[i] : 0u;
      }
    }
#pragma unroll
    for (int r = 0; r < RF_GEMV_ROWS; ++r)
#pragma unroll
      for (int u = 0; u < WORDS_PER_LANE; ++u) {
        const int i = lane + u * WAVE;
        if (i < nwords) stage[wave][r][i] = words[r][u];
      }
    __syncthreads();
    if (active) {
#pragma unroll
      for (int r = 0; r < RF_GEMV_ROWS; ++r) {
        const unsigned short* blk = reinterpret_cast<const unsigned short*>(
            reinterpret_cast<const unsigned char*>(&stage[wave][r][0]) + lane * RF_Q4_0_BYTES);
        const float d = rf_half_bits_to_float(blk[0]);
        int dot = 0;
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          // qs bytes 4i..4i+3: low nibbles are weights 4i.., high nibbles weights 16+4i..
          const int q = (int)((unsigned int)blk[1 + 2 * i] | ((unsigned int)blk[2 + 2 * i] << 16));
          dot = rf_dp4a(q & 0x0F0F0F0F, xv[i], dot);
          dot = rf_dp4a((q >> 4) & 0x0F0F0F0F, xv[4 + i], dot);
        }
        acc[r] += d * xd * (float)(dot - 8 * xs);
      }
    }
    __syncthreads();
  }
#pragma unroll
  for (int r = 0; r < RF_GEMV_ROWS; ++r) {
    const float v = rf_wave_sum(acc[r]);
    if (lane == 0 && row0 + r < m) y[row0 + r] = v;
  }
}

static inline unsigned rf_gemv_blocks(int m, int wave) {
  const int rows_per_block = (RF_GEMV_THREADS / wave) * RF_GEMV_ROWS;
  return (unsigned)((m + rows_per_block - 1) / rows_per_block);
}
