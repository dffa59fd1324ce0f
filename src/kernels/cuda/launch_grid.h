// The grid of a grid-stride kernel launch, one definition for the ops kernels: ceil(work / per_cta)
// CTAs, at least 1 (an empty launch still validates its arguments on the device) and at most
// max_ctas (the kernel's loop covers what a capped grid leaves). Host-only, no CUDA headers needed.
#pragma once

#include <algorithm>
#include <cstdint>

namespace fp4moe::cuda {

inline constexpr int64_t kGridStrideMaxCtas = int64_t{1} << 20;

inline int grid_stride_ctas(int64_t work, int64_t per_cta, int64_t max_ctas = kGridStrideMaxCtas) {
  return static_cast<int>(std::clamp<int64_t>((work + per_cta - 1) / per_cta, 1, max_ctas));
}

}  // namespace fp4moe::cuda
