// Tensor-parallel Linears on the CPU, built on kernels/cpu/linear.h:
//  - ColumnParallelLinear keeps output rows [out_range) of W [out, in] (and of the bias); each
//    rank computes its slice of y; forward_gather all-gathers the full y. Every output element is
//    the same dot product as unsharded, so the result is bit-identical.
//  - RowParallelLinear keeps input columns [in_range) of W; each rank multiplies its slice of x's
//    columns and the partial outputs are all-reduced (summed in rank order). The bias is added on
//    rank 0 only, before the all-reduce.
// NVFP4 weights slice along K only at multiples of 16 elements, taking their e4m3 block scales
// with them (one scale per 16 columns); other boundaries are refused naming the numbers.
// Tested by tests/dist/test_tp_linear.cpp (sharded vs unsharded Linear, F32/BF16/NVFP4, 2-4 ranks).
#pragma once

#include <cstdint>
#include <vector>

#include "dist/communicator.h"
#include "dist/sharding.h"
#include "kernels/cpu/linear.h"

namespace fp4moe::dist {

using kernels::cpu::LinearWeight;

// Output rows [rows.begin, rows.end) of w (with their bias entries and, for NVFP4, block scales).
LinearWeight slice_rows(const LinearWeight& w, Range rows);
// Input columns [cols.begin, cols.end) of w. keep_bias: the slice carries w's bias (give it to
// exactly one rank of a row-parallel group). NVFP4: both ends must be multiples of 16.
LinearWeight slice_cols(const LinearWeight& w, Range cols, bool keep_bias);

// Columns [cols) of a row-major x [m, n] (a rank's input of a row-parallel Linear).
std::vector<float> take_columns(const float* x, int64_t m, int64_t n, Range cols);

struct ColumnParallelLinear {
  Range out_range;     // rows of the full W this rank keeps
  int64_t out_features = 0;  // of the full W
  LinearWeight local;  // [out_range.size(), in]

  static ColumnParallelLinear shard(const LinearWeight& full, int tp_size, int rank);
  // y_local[m, out_range.size()] = x[m, in] W_local^T (+ bias slice). No communication.
  void forward(const float* x, int64_t m, float* y_local) const;
  // y[m, out_features]: forward, then an all-gather of every rank's slice (collective).
  void forward_gather(const float* x, int64_t m, float* y, Communicator& comm) const;
};

struct RowParallelLinear {
  Range in_range;      // columns of the full W this rank keeps
  int64_t in_features = 0;  // of the full W
  LinearWeight local;  // [out, in_range.size()], bias on rank 0 only

  static RowParallelLinear shard(const LinearWeight& full, int tp_size, int rank);
  // y[m, out] = sum over ranks of x_local[m, in_range.size()] W_local^T (+ bias on rank 0):
  // the local product, then an all-reduce (collective; y is the same on every rank).
  void forward(const float* x_local, int64_t m, float* y, Communicator& comm) const;
};

}  // namespace fp4moe::dist
