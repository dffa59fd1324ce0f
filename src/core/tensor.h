// Host tensor types: a non-owning typed view (TensorView) over bytes someone else owns (an mmap,
// a vector), and an owning f32 matrix helper used by the CPU reference. Shapes are int64, row-major.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"

namespace fp4moe {

using Shape = std::vector<int64_t>;

inline int64_t shape_numel(const Shape& s) {
  int64_t n = 1;
  for (int64_t d : s) n *= d;
  return n;
}

// "[2, 16, 4096]"
std::string shape_to_string(const Shape& s);

// Non-owning view of a row-major tensor of any DType.
struct TensorView {
  DType dtype = DType::kU8;
  Shape shape;
  std::span<const uint8_t> bytes;

  int64_t numel() const { return shape_numel(shape); }
  int64_t dim(int i) const { return shape.at(static_cast<size_t>(i)); }
  int rank() const { return static_cast<int>(shape.size()); }

  // Typed access; checks that the element size matches the dtype width.
  template <typename T>
  std::span<const T> as() const {
    FP4MOE_CHECK(static_cast<int>(sizeof(T) * 8) == dtype_bits(dtype))
        << "tensor of dtype " << dtype_name(dtype) << " read as a " << sizeof(T) * 8 << "-bit type";
    return {reinterpret_cast<const T*>(bytes.data()), bytes.size() / sizeof(T)};
  }
};

}  // namespace fp4moe
