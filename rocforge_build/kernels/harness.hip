// rocforge-kernels: the host harness shared by every kernel and both platforms.
//
//   rocforge-kernels info
//   rocforge-kernels run KERNEL --dir DIR [--iters N] [--n N] [--m M] [--k K] [--scalar S]
//
// `run` reads its inputs from raw little-endian files in DIR (written by rocforge with NumPy),
// times the kernel with device events, writes the result back to DIR and prints one JSON line
// with the per-iteration times.  rocforge checks the result against a NumPy reference.
// Kernels: memcpy (the runtime's device-to-device copy, the reference), copy, triad,
// q4_0_gemv, gemm_f16.
#include "rf_portability.h"
#include "bandwidth.hpp"
#include "q4_0_gemv.hpp"
#include "gemm_f16.hpp"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#define RF_WARMUP 2

static std::string json_escape(const std::string& s) {
  std::string out;
  for (const char ch : s) {
    if (ch == '"' || ch == '\\') out += '\\';
    if ((unsigned char)ch < 0x20) continue;
    out += ch;
  }
  return out;
}

static void fail(const char* what, const std::string& detail) {
  std::printf("{\"ok\": false, \"error\": \"%s: %s\"}\n", json_escape(what).c_str(),
              json_escape(detail).c_str());
  std::exit(2);
}

#define CHECK(call)                                                  \
  do {                                                               \
    hipError_t err_ = (call);                                        \
    if (err_ != hipSuccess) fail(#call, hipGetErrorString(err_));    \
  } while (0)

static std::vector<char> read_file(const std::string& path, size_t expect) {
  FILE* f = std::fopen(path.c_str(), "rb");
  if (!f) fail("cannot open input", path);
  std::vector<char> buf(expect);
  const size_t got = expect ? std::fread(buf.data(), 1, expect, f) : 0;
  const bool extra = std::fgetc(f) != EOF;
  std::fclose(f);
  if (got != expect || extra) fail("input has the wrong size", path);
  return buf;
}

static void write_file(const std::string& path, const void* data, size_t bytes) {
  FILE* f = std::fopen(path.c_str(), "wb");
  if (!f || std::fwrite(data, 1, bytes, f) != bytes) fail("cannot write output", path);
  std::fclose(f);
}

static void* upload(const std::string& path, size_t bytes) {
  std::vector<char> host = read_file(path, bytes);
  void* dev = nullptr;
  CHECK(hipMalloc(&dev, bytes ? bytes : 1));
  if (bytes) CHECK(hipMemcpy(dev, host.data(), bytes, hipMemcpyHostToDevice));
  return dev;
}

static void download(const std::string& path, const void* dev, size_t bytes) {
  std::vector<char> host(bytes);
  CHECK(hipMemcpy(host.data(), dev, bytes, hipMemcpyDeviceToHost));
  write_file(path, host.data(), bytes);
}

static void* alloc(size_t bytes) {
  void* dev = nullptr;
  CHECK(hipMalloc(&dev, bytes ? bytes : 1));
  CHECK(hipMemset(dev, 0, bytes ? bytes : 1));
  return dev;
}

// Time `launch` RF_WARMUP + iters times, each timed iteration with its own event pair.
template <typename F>
static std::vector<float> timed(int iters, F launch) {
  hipEvent_t start, stop;
  CHECK(hipEventCreate(&start));
  CHECK(hipEventCreate(&stop));
  for (int i = 0; i < RF_WARMUP; ++i) launch();
  CHECK(hipGetLastError());
  CHECK(hipDeviceSynchronize());
  std::vector<float> ms;
  for (int i = 0; i < iters; ++i) {
    CHECK(hipEventRecord(start, 0));
    launch();
    CHECK(hipEventRecord(stop, 0));
    CHECK(hipEventSynchronize(stop));
    CHECK(hipGetLastError());
    float t = 0.0f;
    CHECK(hipEventElapsedTime(&t, start, stop));
    ms.push_back(t);
  }
  CHECK(hipEventDestroy(start));
  CHECK(hipEventDestroy(stop));
  return ms;
}

__global__ void rf_info_kernel(int* out) {
  if (threadIdx.x == 0 && blockIdx.x == 0) {
    out[0] = RF_DEVICE_WAVE;
    out[1] = RF_GEMM_PATH;
  }
}

struct Args {
  std::string kernel, dir;
  long long n = 0;
  int m = 0, k = 0, iters = 20;
  float scalar = 3.0f;
};

static Args parse(int argc, char** argv) {
  Args a;
  if (argc < 3) fail("usage", "rocforge-kernels info | run KERNEL --dir DIR [options]");
  a.kernel = argv[2];
  for (int i = 3; i < argc; ++i) {
    const std::string opt = argv[i];
    if (i + 1 >= argc) fail("option needs a value", opt);
    const char* v = argv[++i];
    if (opt == "--dir") a.dir = v;
    else if (opt == "--n") a.n = std::atoll(v);
    else if (opt == "--m") a.m = std::atoi(v);
    else if (opt == "--k") a.k = std::atoi(v);
    else if (opt == "--iters") a.iters = std::atoi(v);
    else if (opt == "--scalar") a.scalar = (float)std::atof(v);
    else fail("unknown option", opt);
  }
  if (a.dir.empty()) fail("missing option", "--dir");
  if (a.iters < 1) fail("bad option", "--iters must be >= 1");
  return a;
}

static void print_times(const Args& a, const std::vector<float>& ms) {
  std::printf("{\"ok\": true, \"kernel\": \"%s\", \"ms\": [", a.kernel.c_str());
  for (size_t i = 0; i < ms.size(); ++i) std::printf("%s%.6f", i ? ", " : "", ms[i]);
  std::printf("]}\n");
}

static int cmd_info() {
  int count = 0;
  CHECK(hipGetDeviceCount(&count));
  if (count < 1) fail("no GPU", "the runtime sees no device");
  hipDeviceProp_t p;
  CHECK(hipGetDeviceProperties(&p, 0));
  int* d = (int*)alloc(2 * sizeof(int));
  rf_info_kernel<<<1, 64>>>(d);
  CHECK(hipGetLastError());
  int h[2] = {0, 0};
  CHECK(hipMemcpy(h, d, sizeof(h), hipMemcpyDeviceToHost));
  CHECK(hipFree(d));
  int runtime = 0;
  CHECK(hipRuntimeGetVersion(&runtime));
#if defined(RF_AMD)
  std::string arch = p.gcnArchName;
  const size_t colon = arch.find(':');
  if (colon != std::string::npos) arch = arch.substr(0, colon);
#else
  std::string arch = "sm_" + std::to_string(p.major) + std::to_string(p.minor);
#endif
  std::printf(
      "{\"ok\": true, \"platform\": \"%s\", \"device\": \"%s\", \"arch\": \"%s\", "
      "\"compute_units\": %d, \"warp_size\": %d, \"device_wave_size\": %d, \"gemm_path\": %d, "
      "\"memory_bytes\": %llu, \"runtime_version\": %d}\n",
      RF_PLATFORM, p.name, arch.c_str(), p.multiProcessorCount, p.warpSize, h[0], h[1],
      (unsigned long long)p.totalGlobalMem, runtime);
  return 0;
}

static int cmd_run(const Args& a) {
  hipDeviceProp_t p;
  CHECK(hipGetDeviceProperties(&p, 0));
  const int wave = p.warpSize;
  const std::string dir = a.dir + "/";
  std::vector<float> ms;
  if (a.kernel == "memcpy" || a.kernel == "copy") {
    const size_t bytes = (size_t)a.n * sizeof(float);
    float* src = (float*)upload(dir + "a.bin", bytes);
    float* dst = (float*)alloc(bytes);
    if (a.kernel == "memcpy") {
      ms = timed(a.iters, [&] { CHECK(hipMemcpy(dst, src, bytes, hipMemcpyDeviceToDevice)); });
    } else {
      const unsigned blocks = rf_bw_blocks(a.n);
      ms = timed(a.iters, [&] { rf_copy_kernel<<<blocks, RF_BW_THREADS>>>(src, dst, a.n); });
    }
    download(dir + "out.bin", dst, bytes);
    CHECK(hipFree(src));
    CHECK(hipFree(dst));
  } else if (a.kernel == "triad") {
    const size_t bytes = (size_t)a.n * sizeof(float);
    float* b = (float*)upload(dir + "b.bin", bytes);
    float* c = (float*)upload(dir + "c.bin", bytes);
    float* out = (float*)alloc(bytes);
    const unsigned blocks = rf_bw_blocks(a.n);
    const float s = a.scalar;
    ms = timed(a.iters, [&] { rf_triad_kernel<<<blocks, RF_BW_THREADS>>>(out, b, c, s, a.n); });
    download(dir + "out.bin", out, bytes);
    CHECK(hipFree(b));
    CHECK(hipFree(c));
    CHECK(hipFree(out));
  } else if (a.kernel == "q4_0_gemv") {
    if (a.m < 1 || a.k < 64 || a.k % 64) fail("bad shape", "q4_0_gemv needs m >= 1 and k % 64 == 0");
    const size_t wbytes = (size_t)a.m * (a.k / RF_Q4_0_BLOCK) * RF_Q4_0_BYTES;
    const size_t smem = rf_gemv_smem(a.k);
#if defined(RF_CUDA)
    const size_t smem_max = p.sharedMemPerBlockOptin;
#else
    const size_t smem_max = p.sharedMemPerBlock;
#endif
    if (smem + RF_GEMV_STAGE_BYTES > smem_max)
      fail("bad shape", "q4_0_gemv keeps x (1.25 bytes per element) in shared memory: k = " +
                            std::to_string(a.k) + " needs " +
                            std::to_string(smem + RF_GEMV_STAGE_BYTES) + " bytes, the GPU has " +
                            std::to_string(smem_max));
    unsigned char* w = (unsigned char*)upload(dir + "w.bin", wbytes);
    float* x = (float*)upload(dir + "x.bin", (size_t)a.k * sizeof(float));
    float* y = (float*)alloc((size_t)a.m * sizeof(float));
    // one kernel: 16-byte weight loads where the rows allow them, 4-byte loads otherwise
    void (*kernel)(const unsigned char*, const float*, float*, int, int) =
        rf_gemv_wide(a.k) ? rf_q4_0_gemv_kernel<4> : rf_q4_0_gemv_kernel<1>;
#if defined(RF_CUDA)
    if (smem > 48 * 1024)  // CUDA's default limit for dynamic shared memory; opt in above it
      CHECK(hipFuncSetAttribute(kernel, hipFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
#endif
    int per_cu = 0;
    CHECK(hipOccupancyMaxActiveBlocksPerMultiprocessor(&per_cu, kernel, RF_GEMV_THREADS, smem));
    const unsigned blocks = rf_gemv_blocks(a.m, wave, p.multiProcessorCount, per_cu);
    // timed: one kernel, quantizing x (as llama.cpp does before each mat-vec) and the GEMV
    ms = timed(a.iters, [&] { kernel<<<blocks, RF_GEMV_THREADS, smem>>>(w, x, y, a.m, a.k); });
    download(dir + "out.bin", y, (size_t)a.m * sizeof(float));
    CHECK(hipFree(w));
    CHECK(hipFree(x));
    CHECK(hipFree(y));
  } else if (a.kernel == "gemm_f16") {
    if (a.m % 64 || a.n % 64 || a.k % 64 || a.m < 64 || a.n < 64 || a.k < 64)
      fail("bad shape", "gemm_f16 needs m, n, k multiples of 64");
    const int m = a.m, n = (int)a.n, k = a.k;
    __half* A = (__half*)upload(dir + "a.bin", (size_t)m * k * sizeof(__half));
    __half* B = (__half*)upload(dir + "b.bin", (size_t)k * n * sizeof(__half));
    float* C = (float*)alloc((size_t)m * n * sizeof(float));
    const dim3 grid(n / RF_GEMM_TILE, m / RF_GEMM_TILE);
    ms = timed(a.iters, [&] { rf_gemm_f16_kernel<<<grid, RF_GEMM_THREADS>>>(A, B, C, m, n, k); });
    download(dir + "out.bin", C, (size_t)m * n * sizeof(float));
    CHECK(hipFree(A));
    CHECK(hipFree(B));
    CHECK(hipFree(C));
  } else {
    fail("unknown kernel", a.kernel);
  }
  print_times(a, ms);
  return 0;
}

int main(int argc, char** argv) {
  if (argc >= 2 && std::strcmp(argv[1], "info") == 0) return cmd_info();
  if (argc >= 2 && std::strcmp(argv[1], "run") == 0) return cmd_run(parse(argc, argv));
  fail("usage", "rocforge-kernels info | run KERNEL --dir DIR [options]");
  return 2;
}
