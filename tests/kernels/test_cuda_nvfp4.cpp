// GPU NVFP4 dequantization (src/kernels/cuda/nvfp4_dequant.cu) against the CPU reference
// format::nvfp4_dequantize_bf16, bit for bit, on fresh random data: real MoE shapes (GLM-5 expert
// gate/up [2048, 6144] and down [6144, 2048]), ragged and tiny shapes, and an empty matrix.
// Also FP4MOE_CUDA_CHECK's message and the launcher's argument checks (these need no GPU).
// Label gpu; without a usable GPU the GPU cases skip with the reason.
// Run: test_cuda_nvfp4 (FP4MOE_TEST_SEED=<n> replays a seed).
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "core/error.h"
#include "format/nvfp4.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device.h"
#include "kernels/cuda/moe/device_buffer.h"
#include "kernels/cuda/nvfp4_dequant.h"
#include "kernels/cuda_test_util.h"
#include "testing/testing.h"

namespace fp4moe::cuda {
namespace {

using gpu_test::device_alloc;

struct Case {
  int64_t n_rows;
  int64_t n_cols;
};

std::string describe(const Case& c, float gs) {
  return "N=" + std::to_string(c.n_rows) + ", K=" + std::to_string(c.n_cols) +
         ", global_scale=" + std::to_string(gs);
}

// Runs the kernel on `w` and compares every output with the CPU reference bit for bit.
void expect_matches_cpu(const format::Nvfp4View& w, const std::string& what) {
  const size_t n_out = static_cast<size_t>(w.n_rows * w.n_cols);
  std::vector<uint16_t> expected(n_out);
  format::nvfp4_dequantize_bf16(w, expected);

  auto d_packed = device_alloc<uint8_t>(w.packed.size());
  auto d_scales = device_alloc<uint8_t>(w.scales.size());
  auto d_out = device_alloc<__nv_bfloat16>(n_out);
  FP4MOE_CUDA_CHECK(cudaMemcpy(d_packed.get(), w.packed.data(), w.packed.size(), cudaMemcpyHostToDevice));
  FP4MOE_CUDA_CHECK(cudaMemcpy(d_scales.get(), w.scales.data(), w.scales.size(), cudaMemcpyHostToDevice));
  // Poison the output so that an element the kernel skips shows up.
  FP4MOE_CUDA_CHECK(cudaMemset(d_out.get(), 0xFF, std::max<size_t>(n_out, 1) * 2));
  nvfp4_dequant_to_bf16(d_packed.get(), d_scales.get(), w.global_scale, w.n_rows, w.n_cols,
                        d_out.get(), nullptr);
  FP4MOE_CUDA_CHECK(cudaDeviceSynchronize());
  std::vector<uint16_t> got(n_out);
  FP4MOE_CUDA_CHECK(cudaMemcpy(got.data(), d_out.get(), n_out * 2, cudaMemcpyDeviceToHost));

  int64_t mismatches = 0;
  for (size_t i = 0; i < n_out; ++i) {
    if (got[i] != expected[i]) {
      if (mismatches < 5) {
        ADD_FAILURE() << what << ": [" << i / w.n_cols << ", " << i % w.n_cols << "] GPU bf16 0x"
                      << std::hex << got[i] << " (" << bf16_to_f32(got[i]) << ") vs CPU 0x"
                      << expected[i] << " (" << bf16_to_f32(expected[i]) << ")" << std::dec;
      }
      ++mismatches;
    }
  }
  EXPECT_EQ(mismatches, 0) << what << ": " << mismatches << " of " << n_out << " elements differ";
}

const std::vector<Case> kCases = {
    {1, 16},      // one block
    {3, 48},      // K/16 = 3: scale columns not a multiple of 4
    {200, 48},    // ragged rows (not a multiple of 128)
    {129, 1040},  // odd everything
    {7, 6144},    // a few tokens' worth of hidden size
    {2048, 6144}, // GLM-5 routed expert gate/up_proj [I, H]
    {6144, 2048}, // GLM-5 routed expert down_proj [H, I]
};

TEST(CudaNvfp4Dequant, RandomCodesAndScalesMatchCpuBitForBit) {
  SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(testing::test_seed() ^ 0xC0DAull);
  std::uniform_real_distribution<float> exponent(-24.0f, 4.0f);
  for (const Case& c : kCases) {
    format::Nvfp4Matrix m;
    m.n_rows = c.n_rows;
    m.n_cols = c.n_cols;
    m.packed.resize(static_cast<size_t>(c.n_rows * c.n_cols / 2));
    m.scales.resize(static_cast<size_t>(c.n_rows * c.n_cols / 16));
    for (uint8_t& b : m.packed) b = static_cast<uint8_t>(rng());
    for (uint8_t& s : m.scales) s = static_cast<uint8_t>(rng() % 0x7F);  // every finite positive code
    m.global_scale = std::exp2(exponent(rng));
    expect_matches_cpu(m.view(), "random codes " + describe(c, m.global_scale));
  }
}

TEST(CudaNvfp4Dequant, QuantizedWeightsMatchCpuBitForBit) {
  SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(testing::test_seed() ^ 0xBEEFull);
  std::normal_distribution<float> normal(0.0f, 0.02f);
  for (const Case& c : kCases) {
    std::vector<float> x(static_cast<size_t>(c.n_rows * c.n_cols));
    for (float& v : x) v = normal(rng);
    const format::Nvfp4Matrix m = format::nvfp4_quantize(x, c.n_rows, c.n_cols);
    expect_matches_cpu(m.view(), "quantized " + describe(c, m.global_scale));
  }
}

TEST(CudaNvfp4Dequant, EmptyMatrixLaunchesNothing) {
  SKIP_WITHOUT_GPU();
  // N = 0: no launch, no pointer dereference, no error.
  nvfp4_dequant_to_bf16(nullptr, nullptr, 1.0f, 0, 64, nullptr, nullptr);
  FP4MOE_CUDA_CHECK(cudaDeviceSynchronize());
}

// The argument checks run before any CUDA call, so they are exercised on every machine.
TEST(CudaNvfp4Dequant, RejectsBadArguments) {
  alignas(16) uint8_t buf[64] = {};
  auto* out = reinterpret_cast<__nv_bfloat16*>(buf);
  try {
    nvfp4_dequant_to_bf16(buf, buf, 1.0f, 2, 40, out, nullptr);
    ADD_FAILURE() << "K=40 accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("N=2, K=40"), std::string::npos) << e.what();
  }
  try {
    nvfp4_dequant_to_bf16(buf + 4, buf, 1.0f, 1, 16, out, nullptr);
    ADD_FAILURE() << "misaligned packed pointer accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("8-byte"), std::string::npos) << e.what();
  }
  try {
    nvfp4_dequant_to_bf16(nullptr, buf, 1.0f, 1, 16, out, nullptr);
    ADD_FAILURE() << "null packed pointer accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("null pointer"), std::string::npos) << e.what();
  }
}

TEST(CudaCheck, MessageNamesErrorCallAndPlace) {
  const std::string msg =
      fp4moe::testing::error_of([] { FP4MOE_CUDA_CHECK(static_cast<cudaError_t>(cudaErrorInvalidValue)); });
  EXPECT_NE(msg.find("cudaErrorInvalidValue"), std::string::npos) << msg;
  EXPECT_NE(msg.find("static_cast<cudaError_t>(cudaErrorInvalidValue)"), std::string::npos) << msg;
  EXPECT_NE(msg.find("test_cuda_nvfp4.cpp:"), std::string::npos) << msg;
  EXPECT_NE(msg.find("device"), std::string::npos) << msg;
}

// Out of device memory: the message names the bytes asked for and the device's free memory, and the
// error is cleared (the next CUDA call works).
TEST(CudaCheck, OutOfMemoryNamesTheBytesAndTheFreeMemory) {
  SKIP_WITHOUT_GPU();
  const std::string msg = fp4moe::testing::error_of([] { DeviceBuffer b(size_t{1} << 50); });  // 1 PiB
  EXPECT_NE(msg.find("cudaErrorMemoryAllocation"), std::string::npos) << msg;
  EXPECT_NE(msg.find("cudaMalloc of 1125899906842624 B (1073741824 MiB)"), std::string::npos) << msg;
  EXPECT_NE(msg.find(" MiB free of "), std::string::npos) << msg;
  DeviceBuffer ok(1024);
  EXPECT_FALSE(ok.empty());
  FP4MOE_CUDA_CHECK(cudaDeviceSynchronize());
}

TEST(CudaDevice, AvailabilityExplainsItself) {
  std::string why = "stale";
  const bool available = cuda_device_available(&why);
  if (available) {
    EXPECT_TRUE(why.empty()) << why;
    int device = -1;
    FP4MOE_CUDA_CHECK(cudaGetDevice(&device));
    std::printf("[fp4moe] %s, built for sm %s\n", cuda_device_description(device).c_str(),
                cuda_built_sm_list());
  } else {
    EXPECT_FALSE(why.empty());
    EXPECT_NE(why, "stale");
    std::printf("[fp4moe] no usable GPU: %s\n", why.c_str());
  }
}

}  // namespace
}  // namespace fp4moe::cuda
