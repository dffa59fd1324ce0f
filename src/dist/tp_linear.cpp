// Column- and row-parallel Linears: weight slicing (F32/BF16/NVFP4) and the two forwards.
// See tp_linear.h. Tested by tests/dist/test_tp_linear.cpp.
#include "dist/tp_linear.h"

#include <cstring>

#include "core/error.h"

namespace fp4moe::dist {

namespace {

using kernels::cpu::WeightFormat;
constexpr int64_t kBlock = 16;  // NVFP4 elements per e4m3 block scale

void check_range(const char* what, Range r, int64_t n, const LinearWeight& w) {
  FP4MOE_CHECK(r.begin >= 0 && r.begin < r.end && r.end <= n)
      << w.describe() << ": " << what << " [" << r.begin << ", " << r.end << ") is empty or outside [0, " << n << ")";
}

}  // namespace

LinearWeight slice_rows(const LinearWeight& w, Range rows) {
  check_range("row slice", rows, w.out_features, w);
  const int64_t n = rows.size();
  const int64_t in = w.in_features;
  std::vector<float> bias;
  if (w.has_bias()) bias.assign(w.bias.begin() + rows.begin, w.bias.begin() + rows.end);
  switch (w.format) {
    case WeightFormat::kF32:
      return LinearWeight::from_f32(n, in, {w.f32.begin() + rows.begin * in, w.f32.begin() + rows.end * in},
                                    std::move(bias));
    case WeightFormat::kBF16:
      return LinearWeight::from_bf16(n, in, {w.bf16.begin() + rows.begin * in, w.bf16.begin() + rows.end * in},
                                     std::move(bias));
    case WeightFormat::kNVFP4: {
      const int64_t row_bytes = in / 2, row_scales = in / kBlock;
      return LinearWeight::from_nvfp4(
          n, in, {w.packed.begin() + rows.begin * row_bytes, w.packed.begin() + rows.end * row_bytes},
          {w.scales.begin() + rows.begin * row_scales, w.scales.begin() + rows.end * row_scales}, w.global_scale,
          w.input_scale, std::move(bias));
    }
  }
  FP4MOE_FAIL() << "slice_rows: unknown weight format " << static_cast<int>(w.format);
  return {};
}

LinearWeight slice_cols(const LinearWeight& w, Range cols, bool keep_bias) {
  check_range("column slice", cols, w.in_features, w);
  const int64_t out = w.out_features, in = w.in_features, n = cols.size();
  std::vector<float> bias = keep_bias ? w.bias : std::vector<float>{};
  switch (w.format) {
    case WeightFormat::kF32: {
      std::vector<float> v(static_cast<size_t>(out * n));
      for (int64_t r = 0; r < out; ++r) {
        std::memcpy(v.data() + r * n, w.f32.data() + r * in + cols.begin, static_cast<size_t>(n) * 4);
      }
      return LinearWeight::from_f32(out, n, std::move(v), std::move(bias));
    }
    case WeightFormat::kBF16: {
      std::vector<uint16_t> v(static_cast<size_t>(out * n));
      for (int64_t r = 0; r < out; ++r) {
        std::memcpy(v.data() + r * n, w.bf16.data() + r * in + cols.begin, static_cast<size_t>(n) * 2);
      }
      return LinearWeight::from_bf16(out, n, std::move(v), std::move(bias));
    }
    case WeightFormat::kNVFP4: {
      FP4MOE_CHECK(cols.begin % kBlock == 0 && cols.end % kBlock == 0)
          << w.describe() << ": NVFP4 column slice [" << cols.begin << ", " << cols.end
          << ") must start and end at multiples of the 16-element block (its e4m3 scale covers 16 columns)";
      std::vector<uint8_t> packed(static_cast<size_t>(out * n / 2));
      std::vector<uint8_t> scales(static_cast<size_t>(out * n / kBlock));
      for (int64_t r = 0; r < out; ++r) {
        std::memcpy(packed.data() + r * n / 2, w.packed.data() + r * in / 2 + cols.begin / 2, static_cast<size_t>(n / 2));
        std::memcpy(scales.data() + r * n / kBlock, w.scales.data() + r * in / kBlock + cols.begin / kBlock,
                    static_cast<size_t>(n / kBlock));
      }
      return LinearWeight::from_nvfp4(out, n, std::move(packed), std::move(scales), w.global_scale, w.input_scale,
                                      std::move(bias));
    }
  }
  FP4MOE_FAIL() << "slice_cols: unknown weight format " << static_cast<int>(w.format);
  return {};
}

std::vector<float> take_columns(const float* x, int64_t m, int64_t n, Range cols) {
  FP4MOE_CHECK(m >= 0 && cols.begin >= 0 && cols.begin <= cols.end && cols.end <= n)
      << "take_columns: [" << cols.begin << ", " << cols.end << ") of a [" << m << ", " << n << "] matrix";
  std::vector<float> out(static_cast<size_t>(m * cols.size()));
  for (int64_t r = 0; r < m; ++r) {
    std::memcpy(out.data() + r * cols.size(), x + r * n + cols.begin, static_cast<size_t>(cols.size()) * 4);
  }
  return out;
}

ColumnParallelLinear ColumnParallelLinear::shard(const LinearWeight& full, int tp_size, int rank) {
  ColumnParallelLinear c;
  c.out_range = column_parallel_rows(full.out_features, tp_size, rank);
  c.out_features = full.out_features;
  c.local = slice_rows(full, c.out_range);
  return c;
}

void ColumnParallelLinear::forward(const float* x, int64_t m, float* y_local) const {
  kernels::cpu::linear_forward(local, x, m, y_local);
}

void ColumnParallelLinear::forward_gather(const float* x, int64_t m, float* y, Communicator& comm) const {
  const int64_t n_local = out_range.size();
  const int world = comm.world_size();
  FP4MOE_CHECK(n_local * world == out_features)
      << "ColumnParallelLinear: " << world << " ranks x " << n_local << " rows != " << out_features << " output features";
  std::vector<float> mine(static_cast<size_t>(m * n_local));
  forward(x, m, mine.data());
  std::vector<float> all(static_cast<size_t>(m * out_features));
  comm.all_gather(mine.data(), all.data(), m * n_local * 4);
  // all = [world][m][n_local] -> y [m][world * n_local]; rank p's block is rows [p*n_local, ...).
  for (int p = 0; p < world; ++p) {
    for (int64_t r = 0; r < m; ++r) {
      std::memcpy(y + r * out_features + p * n_local, all.data() + (p * m + r) * n_local,
                  static_cast<size_t>(n_local) * 4);
    }
  }
}

RowParallelLinear RowParallelLinear::shard(const LinearWeight& full, int tp_size, int rank) {
  RowParallelLinear l;
  l.in_range = row_parallel_cols(full.in_features, tp_size, rank, full.format == WeightFormat::kNVFP4);
  l.in_features = full.in_features;
  l.local = slice_cols(full, l.in_range, /*keep_bias=*/rank == 0);
  return l;
}

void RowParallelLinear::forward(const float* x_local, int64_t m, float* y, Communicator& comm) const {
  kernels::cpu::linear_forward(local, x_local, m, y);
  comm.all_reduce_sum(y, m * local.out_features);
}

}  // namespace fp4moe::dist
