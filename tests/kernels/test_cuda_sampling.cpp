// GPU token sampling (kernels/cuda/ops/sampling.h) against its CPU reference engine::sample_from, on
// fresh random rows each run (seed printed by testing::test_seed):
//   - every knob alone and together (temperature, top-k, top-p, min-p), the GLM-5 vocabulary
//     (154,880) and small ones (1, 7, 1,000);
//   - rows with many exact ties (values from a small set: the top-k / top-p boundary falls inside a
//     tied group, which keeps the lowest ids), -inf logits (never drawn), one finite logit;
//   - NaN logits rank as -inf on the GPU (never drawn; the CPU's result is undefined there);
//   - the argument checks.
// Every token must equal the reference's (a difference needs u or top_p within ~1e-15 of a boundary).
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "core/error.h"
#include "engine/sampler.h"
#include "kernels/cuda/ops/sampling.h"
#include "kernels/cuda_test_util.h"
#include "testing/testing.h"

namespace fp4moe::cuda {
namespace {

using gpu_test::device_alloc;
using gpu_test::download;
using gpu_test::upload;

struct Row {
  std::vector<float> z;
  engine::SamplingParams params;
  double u = 0.0;
  std::string what;
};

enum class Shape { kNormal, kTies, kMasked };

std::vector<float> random_row(int64_t V, Shape shape, std::mt19937_64& rng) {
  std::vector<float> z(static_cast<size_t>(V));
  std::normal_distribution<float> normal(0.0f, 3.0f);
  std::uniform_int_distribution<int> level(0, 5);
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  for (auto& x : z) {
    switch (shape) {
      case Shape::kNormal: x = normal(rng); break;
      case Shape::kTies: x = 0.75f * static_cast<float>(level(rng)); break;  // 6 values, big tied groups
      case Shape::kMasked: x = unit(rng) < 0.5 ? -std::numeric_limits<float>::infinity() : normal(rng); break;
    }
  }
  return z;
}

// Samples every row on the GPU (one launch; spec r writes out[n - 1 - r]) and compares each token
// with engine::sample_from's.
void check_rows(const std::vector<Row>& rows, int64_t V) {
  std::vector<float> logits;
  std::vector<SampleSpec> specs;
  for (size_t r = 0; r < rows.size(); ++r) {
    ASSERT_EQ(static_cast<int64_t>(rows[r].z.size()), V);
    logits.insert(logits.end(), rows[r].z.begin(), rows[r].z.end());
    SampleSpec s;
    s.u = rows[r].u;
    s.temperature = rows[r].params.temperature;
    s.top_k = static_cast<int32_t>(rows[r].params.top_k);
    s.top_p = rows[r].params.top_p;
    s.min_p = rows[r].params.min_p;
    s.row = static_cast<int32_t>(r);
    s.out = static_cast<int32_t>(rows.size() - 1 - r);  // out[] in another order than the rows
    specs.push_back(s);
  }
  auto d_logits = upload(logits);
  auto d_specs = upload(specs);
  auto d_out = device_alloc<int32_t>(rows.size());
  sample_rows(d_logits.get(), V, V, d_specs.get(), static_cast<int64_t>(specs.size()), d_out.get(), nullptr);
  FP4MOE_CUDA_CHECK(cudaDeviceSynchronize());
  const std::vector<int32_t> got = download(d_out.get(), rows.size());
  for (size_t r = 0; r < rows.size(); ++r) {
    const Row& row = rows[r];
    const int32_t want = engine::sample_from(row.z.data(), V, row.params, row.u);
    const int32_t g = got[rows.size() - 1 - r];
    EXPECT_EQ(g, want) << row.what << " (row " << r << ", V " << V << ", T " << row.params.temperature << ", top_k "
                       << row.params.top_k << ", top_p " << row.params.top_p << ", min_p " << row.params.min_p
                       << ", u " << row.u << "): GPU z " << (g >= 0 && g < V ? row.z[static_cast<size_t>(g)] : NAN)
                       << ", CPU z " << row.z[static_cast<size_t>(want)];
  }
}

std::vector<Row> random_rows(int64_t V, int n, std::mt19937_64& rng) {
  const double temps[] = {0.3, 0.7, 1.0, 1.6};
  const int64_t top_ks[] = {-1, 2, 5, 50, 1000};
  const double top_ps[] = {1.0, 0.95, 0.9, 0.5, 0.1};
  const double min_ps[] = {0.0, 0.0, 0.05, 0.3};
  const Shape shapes[] = {Shape::kNormal, Shape::kTies, Shape::kMasked};
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  std::vector<Row> rows;
  for (int i = 0; i < n; ++i) {
    Row row;
    const Shape shape = shapes[rng() % 3];
    row.z = random_row(V, shape, rng);
    row.params.temperature = temps[rng() % 4];
    row.params.top_k = top_ks[rng() % 5];
    row.params.top_p = top_ps[rng() % 5];
    row.params.min_p = min_ps[rng() % 4];
    row.u = unit(rng);
    row.what = shape == Shape::kNormal ? "normal" : shape == Shape::kTies ? "ties" : "half -inf";
    if (shape == Shape::kMasked) row.z[static_cast<size_t>(rng() % static_cast<uint64_t>(V))] = 1.0f;  // one finite
    rows.push_back(std::move(row));
  }
  return rows;
}

TEST(CudaSampling, MatchesCpuSamplerOnRandomRows) {
  SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(testing::test_seed());
  for (int64_t V : {int64_t{7}, int64_t{1000}, int64_t{154880}}) {
    check_rows(random_rows(V, V > 100000 ? 48 : 200, rng), V);
    if (::testing::Test::HasFailure()) return;
  }
}

// Each knob alone on one GLM-5-sized row, u swept: the draws cover the kept set.
TEST(CudaSampling, EachKnobAloneSweepsTheKeptSet) {
  SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(testing::test_seed() + 1);
  const int64_t V = 154880;
  const std::vector<float> z = random_row(V, Shape::kNormal, rng);
  std::vector<Row> rows;
  for (int knob = 0; knob < 4; ++knob) {
    for (int i = 0; i < 16; ++i) {
      Row row;
      row.z = z;
      row.u = (i + 0.5) / 16.0;
      row.params.temperature = knob == 0 ? 0.5 : 1.0;
      if (knob == 1) row.params.top_k = 20;
      if (knob == 2) row.params.top_p = 0.8;
      if (knob == 3) row.params.min_p = 0.1;
      row.what = knob == 0 ? "temperature only" : knob == 1 ? "top_k 20" : knob == 2 ? "top_p 0.8" : "min_p 0.1";
      rows.push_back(row);
    }
  }
  check_rows(rows, V);
}

TEST(CudaSampling, EdgeRows) {
  SKIP_WITHOUT_GPU();
  const float inf = std::numeric_limits<float>::infinity();
  std::vector<Row> rows;
  Row one;  // vocabulary of one
  one.z = {0.5f};
  one.u = 0.99;
  check_rows({one}, 1);
  // A tied row: top_k 3 keeps ids 0, 1, 2 of the five tied maxima; u picks among them in id order.
  for (double u : {0.1, 0.4, 0.7, 0.999}) {
    Row r;
    r.z = {1.0f, -inf, 1.0f, 0.0f, 1.0f, 1.0f, 1.0f};
    r.params.top_k = 3;
    r.u = u;
    r.what = "tied maxima, top_k 3";
    rows.push_back(r);
  }
  // top_p inside a tied group: 0.5 of five equal tokens keeps the first three (0.6 >= 0.5).
  for (double u : {0.05, 0.5, 0.95}) {
    Row r;
    r.z = {2.0f, 2.0f, -inf, 2.0f, 2.0f, 2.0f, -5.0f};
    r.params.top_p = 0.5;
    r.u = u;
    r.what = "tied group, top_p 0.5";
    rows.push_back(r);
  }
  // Greedy specs (temperature 0, top_k 1): the lowest id of the maxima.
  Row g;
  g.z = {0.0f, 3.0f, -inf, 3.0f, 1.0f, 2.0f, 3.0f};
  g.params.temperature = 0.0;
  g.what = "temperature 0";
  rows.push_back(g);
  g.params.temperature = 1.0;
  g.params.top_k = 1;
  g.what = "top_k 1";
  rows.push_back(g);
  check_rows(rows, 7);
}

TEST(CudaSampling, NanLogitsAreNeverDrawn) {
  SKIP_WITHOUT_GPU();
  std::vector<float> z(1000, std::numeric_limits<float>::quiet_NaN());
  z[10] = 0.0f;
  z[500] = 0.5f;
  z[999] = -1.0f;
  std::vector<SampleSpec> specs;
  for (int i = 0; i < 64; ++i) {
    SampleSpec s;
    s.u = (i + 0.5) / 64.0;
    s.out = i;
    specs.push_back(s);
  }
  auto d_z = upload(z);
  auto d_specs = upload(specs);
  auto d_out = device_alloc<int32_t>(specs.size());
  sample_rows(d_z.get(), 1000, 1000, d_specs.get(), 64, d_out.get(), nullptr);
  FP4MOE_CUDA_CHECK(cudaDeviceSynchronize());
  for (int32_t t : download(d_out.get(), specs.size())) EXPECT_TRUE(t == 10 || t == 500 || t == 999) << t;
}

TEST(CudaSamplingHost, RefusesBadArguments) {
  const auto message = [](auto&& f) {
    try {
      f();
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  int32_t out = 0;
  const float z = 0.0f;
  const SampleSpec spec;
  EXPECT_NE(message([&] { sample_rows(&z, 0, 1, &spec, 1, &out, nullptr); }).find("vocab=0 (1 .. 2^31-1)"),
            std::string::npos);
  EXPECT_NE(message([&] { sample_rows(&z, 10, 5, &spec, 1, &out, nullptr); }).find("row_stride=5 (>= vocab)"),
            std::string::npos);
  EXPECT_NE(message([&] { sample_rows(nullptr, 10, 10, &spec, 1, &out, nullptr); }).find("null pointer"),
            std::string::npos);
  sample_rows(nullptr, 10, 10, nullptr, 0, nullptr, nullptr);  // nothing to sample: no launch, no error
}

}  // namespace
}  // namespace fp4moe::cuda
