// The layouts are device-includable: a kernel carves its shared memory with the same constexpr
// description the planner sizes it with, and static_asserts it against the arch limit. Compiled
// (not run) as part of test_plan_cutlass_check; layout_device_offsets() reports what the device
// side computed so the test can compare it with the host.
#include <cuda_runtime.h>

#include "plan/layout_cutlass.h"
#include "plan/layout_sm90_w4a16.h"

namespace fp4moe::plan::cutlass_check {
namespace {

// The shipped pipeline config w4a16_swapab_m128n16k256_s4 (config id 7), as the kernel instantiates it.
constexpr W4A16Layout kDecode = W4A16Layout::make(kW4A16Configs[7]);
static_assert(kDecode.fits(kSm90SmemOptinBytes), "the config must fit sm_90");
static_assert(kDecode.w_tiles(1) % 128 == 0, "cp.async destinations are 128-aligned");
static_assert(w4a16_ctas_per_sm(kDecode.config, kDecode.total_bytes()) == 2, "__launch_bounds__ min blocks");
static_assert(model_cutlass_sm120({128, 128, 128, OperandKind::kNvfp4, EpilogueFusion::kNone, false}, kCutlassB46b16d).layout.total_bytes ==
              89088);

__global__ void carve(uint32_t* out) {
  extern __shared__ __align__(128) uint8_t smem[];
  constexpr W4A16Layout l = kDecode;
  out[0] = static_cast<uint32_t>(reinterpret_cast<uintptr_t>(smem + l.x_tile(1)) - reinterpret_cast<uintptr_t>(smem));
  out[1] = static_cast<uint32_t>(reinterpret_cast<uintptr_t>(smem + l.w_scales(2)) - reinterpret_cast<uintptr_t>(smem));
  out[2] = l.total_bytes();
  out[3] = l.epilogue_offset;
}

}  // namespace

// Host-side view of the same numbers (the kernel is compiled, not launched: CI has no GPU).
void layout_device_offsets(uint32_t out[4]) {
  (void)&carve;
  out[0] = kDecode.x_tile(1);
  out[1] = kDecode.w_scales(2);
  out[2] = kDecode.total_bytes();
  out[3] = kDecode.layout.offset_of("epilogue tile (bf16 block_t x block_w, rows +16 B)");
}

}  // namespace fp4moe::plan::cutlass_check
