// The per-token checks of the fused "normalize, rotate, append to a cache" kernels (mla_decode.cu's latent
// append, dsa_indexer.cu's key append; a warp a token), in the order of the launches they replace (rope_bf16,
// then the cache append), so they set the same error flags. Tested through those kernels
// (tests/kernels/test_cuda_mla_fusions.cpp: a bad position and a bad slot against the separate launches).
#pragma once

#include <cstdint>

#include "kernels/cuda/ops/device_errors.h"

namespace fp4moe::cuda {

struct FusedAppendTarget {
  int64_t pos;   // positions[t]
  bool pos_ok;   // inside the RoPE table [0, n_positions): else the row stays unrotated
  int64_t slot;  // the token's cache slot, or -1: skip it
};

// Token t: its position (lane 0 flags kDeviceErrorRopePosition when outside the table) and its slot (-1, a
// padded token, skipped; past the cache: lane 0 flags kDeviceErrorKvSlot, skipped).
__device__ __forceinline__ FusedAppendTarget fused_append_target(const int32_t* __restrict__ positions,
                                                                 int64_t n_positions, const int32_t* __restrict__ slots,
                                                                 int64_t n_slots, int64_t t, int lane,
                                                                 uint32_t* error_flag) {
  FusedAppendTarget r;
  r.pos = positions[t];
  r.pos_ok = r.pos >= 0 && r.pos < n_positions;
  if (!r.pos_ok && lane == 0) atomicOr(error_flag, kDeviceErrorRopePosition);
  r.slot = slots[t];
  if (r.slot >= n_slots) {
    if (lane == 0) atomicOr(error_flag, kDeviceErrorKvSlot);
    r.slot = -1;
  } else if (r.slot < 0) {
    r.slot = -1;
  }
  return r;
}

}  // namespace fp4moe::cuda
