// Q4_0 GEMV: y[m] = sum_k W[m][k] * x[k], W in ggml's Q4_0 format (the LLM decode inner loop).
//
// A Q4_0 block holds 32 weights in 18 bytes: an fp16 scale d, then 16 bytes qs; byte j carries
// weight j in its low nibble and weight j+16 in its high nibble; weight = (q - 8) * d.  A row of
// k weights is k/32 consecutive blocks; rows follow each other (a ggml tensor, row-major).
//
// As in llama.cpp's decode path (mul_mat_vec_q), x is quantized to 8 bits per block of 32
// (scale dx = max|x|/127, xq = rint(x/dx)), so each block is an integer dot product done four
// bytes at a time (dp4a / v_dot4):  sum_j (q_j - 8) * xq_j * d * dx.
//
// One kernel does both.  Each workgroup first quantizes all of x into shared memory (LDS):
// k int8 values, then per block dx and sum(xq) -- 1.25 bytes per element of x, read once per
// workgroup from the L2.  The grid is persistent (as many workgroups as fit at once), so that
// is paid once per workgroup, not once per row group.
//
// Then every wave works on its own: it takes tasks of RF_GEMV_ROWS rows (task = global wave id,
// stepping by the number of waves in the grid) and streams each row in chunks of `wave` blocks.
// Blocks are 18 bytes, so a lane cannot load its own block with wide aligned loads: the wave
// loads a chunk with coalesced 32-bit loads (all rows of the task at once, so they are in flight
// together), passes it through a per-wave LDS buffer one row at a time, and every lane decodes
// one block.  The loads of the next chunk (or of the next task's first chunk) are issued before
// the current one is decoded, so memory is busy while the ALUs are.  Waves only synchronise with
// themselves (rf_wave_sync), never with the other waves of the workgroup.
// Needs k % 64 == 0 (rows start 4-byte aligned) and 1.25 * k bytes of LDS (rf_gemv_smem).
#pragma once
#include "rf_portability.h"

#define RF_Q4_0_BLOCK 32
#define RF_Q4_0_BYTES 18
#define RF_GEMV_THREADS 256
#ifndef RF_GEMV_ROWS
#define RF_GEMV_ROWS 4
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

// Dynamic LDS of the GEMV for a row length k: xq (k bytes), dx (nb floats), sum(xq) (nb ints).
static inline size_t rf_gemv_smem(int k) {
  return (size_t)k + (size_t)(k / RF_Q4_0_BLOCK) * (sizeof(float) + sizeof(int));
}
// Static LDS: one chunk-row staging buffer per wave (RF_GEMV_THREADS blocks of 18 bytes).
#define RF_GEMV_STAGE_BYTES (RF_GEMV_THREADS * RF_Q4_0_BYTES)

// The loads of one chunk (the same blocks of RF_GEMV_ROWS rows), VEC words (4 bytes) per load:
// VEC = 4 (16-byte loads) needs every row to start 16-byte aligned (k % 256 == 0), VEC = 1
// only 4-byte aligned (k % 64 == 0).  Lane l loads vectors l, l + WAVE, ... of the chunk.
template <int WAVE, int VEC, int NV>
__device__ __forceinline__ void rf_gemv_load(unsigned int (&words)[RF_GEMV_ROWS][NV * VEC],
                                             const unsigned char* __restrict__ w, int task,
                                             int chunk, int lane, int nb, long long row_bytes,
                                             int m) {
  const int c0 = chunk * WAVE;
  const int nvec = min(WAVE, nb - c0) * RF_Q4_0_BYTES / (4 * VEC);  // exact: see the callers
#pragma unroll
  for (int r = 0; r < RF_GEMV_ROWS; ++r) {
    const int row = min(task * RF_GEMV_ROWS + r, m - 1);  // rows past the end: row m-1, unused
    const unsigned char* src = w + (long long)row * row_bytes + (long long)c0 * RF_Q4_0_BYTES;
#pragma unroll
    for (int u = 0; u < NV; ++u) {
      const int i = lane + u * WAVE;
      if constexpr (VEC == 4) {
        const uint4 v = i < nvec ? reinterpret_cast<const uint4*>(src)[i] : make_uint4(0, 0, 0, 0);
        words[r][4 * u] = v.x; words[r][4 * u + 1] = v.y;
        words[r][4 * u + 2] = v.z; words[r][4 * u + 3] = v.w;
      } else {
        words[r][u] = i < nvec ? reinterpret_cast<const unsigned int*>(src)[i] : 0u;
      }
    }
  }
}

template <int VEC>
__global__ void __launch_bounds__(RF_GEMV_THREADS)
rf_q4_0_gemv_kernel(const unsigned char* __restrict__ w, const float* __restrict__ x,
                    float* __restrict__ y, int m, int k) {
  constexpr int WAVE = RF_DEVICE_WAVE;
  constexpr int NWAVES = RF_GEMV_THREADS / WAVE;
  constexpr int CHUNK_WORDS = WAVE * RF_Q4_0_BYTES / 4;
  constexpr int NV = (CHUNK_WORDS / VEC + WAVE - 1) / WAVE;  // loads per lane per row
  constexpr int WPL = NV * VEC;                               // words per lane per row
  __shared__ unsigned int stage[NWAVES][CHUNK_WORDS] __attribute__((aligned(16)));
  extern __shared__ int4 rf_gemv_dyn[];

  const int nb = k / RF_Q4_0_BLOCK;
  int4* xq_s = rf_gemv_dyn;                                         // 2 int4 per block
  float* dx_s = reinterpret_cast<float*>(rf_gemv_dyn + 2 * nb);     // nb
  int* xs_s = reinterpret_cast<int*>(dx_s + nb);                    // nb

  // 1. x -> int8 in LDS, one block of 32 per thread at a time (the whole workgroup).
  for (int b = threadIdx.x; b < nb; b += RF_GEMV_THREADS) {
    const float4* xb = reinterpret_cast<const float4*>(x) + (long long)b * 8;
    float4 v[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) v[i] = xb[i];
    float amax = 0.0f;
#pragma unroll
    for (int i = 0; i < 8; ++i)
      amax = fmaxf(amax, fmaxf(fmaxf(fabsf(v[i].x), fabsf(v[i].y)),
                               fmaxf(fabsf(v[i].z), fabsf(v[i].w))));
    const float d = amax / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    int q[8], sum = 0;
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const int q0 = (int)rintf(v[i].x * id), q1 = (int)rintf(v[i].y * id);
      const int q2 = (int)rintf(v[i].z * id), q3 = (int)rintf(v[i].w * id);
      sum += q0 + q1 + q2 + q3;
      q[i] = (q0 & 0xFF) | ((q1 & 0xFF) << 8) | ((q2 & 0xFF) << 16) | ((unsigned)(q3 & 0xFF) << 24);
    }
    xq_s[2 * b] = make_int4(q[0], q[1], q[2], q[3]);
    xq_s[2 * b + 1] = make_int4(q[4], q[5], q[6], q[7]);
    dx_s[b] = d;
    xs_s[b] = sum;
  }
  __syncthreads();  // the only workgroup barrier: from here on every wave is on its own

  const int lane = threadIdx.x % WAVE;
  const int wave = threadIdx.x / WAVE;
  const long long row_bytes = (long long)nb * RF_Q4_0_BYTES;
  const int nchunks = (nb + WAVE - 1) / WAVE;
  const int ntasks = (m + RF_GEMV_ROWS - 1) / RF_GEMV_ROWS;
  const int stride = gridDim.x * NWAVES;
  int task = blockIdx.x * NWAVES + wave;
  if (task >= ntasks) return;
  int chunk = 0;

  unsigned int words[RF_GEMV_ROWS][WPL];
  rf_gemv_load<WAVE, VEC, NV>(words, w, task, 0, lane, nb, row_bytes, m);
  float acc[RF_GEMV_ROWS];
#pragma unroll
  for (int r = 0; r < RF_GEMV_ROWS; ++r) acc[r] = 0.0f;

  for (;;) {
    // what comes next: the next chunk of this task, or the first chunk of the next task
    int next_task = task, next_chunk = chunk + 1;
    if (next_chunk == nchunks) {
      next_chunk = 0;
      next_task += stride;
    }
    const bool more = next_task < ntasks;
    unsigned int next[RF_GEMV_ROWS][WPL];
    if (more) rf_gemv_load<WAVE, VEC, NV>(next, w, next_task, next_chunk, lane, nb, row_bytes, m);

    // decode the current chunk while those loads are in flight
    const int c0 = chunk * WAVE;
    const int nblk = min(WAVE, nb - c0);
    const int nwords = nblk * RF_Q4_0_BYTES / 4;
    const bool active = lane < nblk;
    int xv[8];
    float xd = 0.0f;
    int xs = 0;
    if (active) {
      const int4 lo = xq_s[2 * (c0 + lane)], hi = xq_s[2 * (c0 + lane) + 1];
      xv[0] = lo.x; xv[1] = lo.y; xv[2] = lo.z; xv[3] = lo.w;
      xv[4] = hi.x; xv[5] = hi.y; xv[6] = hi.z; xv[7] = hi.w;
      xd = dx_s[c0 + lane];
      xs = xs_s[c0 + lane];
    }
#pragma unroll
    for (int r = 0; r < RF_GEMV_ROWS; ++r) {
      rf_wave_sync();  // every lane is done reading the previous row from the buffer
#pragma unroll
      for (int u = 0; u < NV; ++u) {
        const int i = lane + u * WAVE;
        if (i * VEC < nwords) {
          if constexpr (VEC == 4)
            reinterpret_cast<uint4*>(&stage[wave][0])[i] =
                make_uint4(words[r][4 * u], words[r][4 * u + 1], words[r][4 * u + 2],
                           words[r][4 * u + 3]);
          else
            stage[wave][i] = words[r][u];
        }
      }
      rf_wave_sync();
      if (active) {
        const unsigned short* blk = reinterpret_cast<const unsigned short*>(
            reinterpret_cast<const unsigned char*>(&stage[wave][0]) + lane * RF_Q4_0_BYTES);
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
    if (chunk == nchunks - 1) {  // the task's rows are complete
      const int row0 = task * RF_GEMV_ROWS;
#pragma unroll
      for (int r = 0; r < RF_GEMV_ROWS; ++r) {
        const float v = rf_wave_sum(acc[r]);
        if (lane == 0 && row0 + r < m) y[row0 + r] = v;
        acc[r] = 0.0f;
      }
    }
    if (!more) break;
    task = next_task;
    chunk = next_chunk;
#pragma unroll
    for (int r = 0; r < RF_GEMV_ROWS; ++r)
#pragma unroll
      for (int u = 0; u < WPL; ++u) words[r][u] = next[r][u];
  }
}

// 16-byte loads of the weights when every row starts 16-byte aligned: 8 blocks are 144 bytes,
// so k % 256 == 0 (then every chunk, the last included, is a whole number of 16-byte vectors).
#ifndef RF_GEMV_WIDE
#define RF_GEMV_WIDE 1
#endif
static inline bool rf_gemv_wide(int k) { return RF_GEMV_WIDE && k % 256 == 0; }

// Persistent grid: as many workgroups as are resident at once (occupancy x compute units), and
// never more than there are tasks for.
static inline unsigned rf_gemv_blocks(int m, int wave, int compute_units, int per_cu) {
  const int waves = RF_GEMV_THREADS / wave;
  const int tasks = (m + RF_GEMV_ROWS - 1) / RF_GEMV_ROWS;
  const int needed = (tasks + waves - 1) / waves;
  const int resident = compute_units * (per_cu > 0 ? per_cu : 1);
  return (unsigned)(needed < resident ? needed : resident);
}
