// Config names, byte summaries and the refusal message of sm90_nvfp4_w4a16_grouped_gemm (see
// w4a16_smem.h). Tested by tests/plan/test_layouts.cpp and tests/kernels/test_cuda_w4a16_host.cpp.
#include "plan/w4a16_smem.h"

#include <sstream>

#include "format/nvfp4.h"

namespace fp4moe::plan {

std::string w4a16_config_name(const W4A16Config& c) {
  if (c.kind == W4A16Kind::kStream) {
    return "w4a16_stream_m" + std::to_string(c.block_w) + "n" + std::to_string(c.block_t) + "_d" +
           std::to_string(c.stages);
  }
  if (c.kind == W4A16Kind::kWgmma) {
    return "w4a16_wgmma_m" + std::to_string(c.block_w) + "n" + std::to_string(c.block_t) + "_s" + std::to_string(c.stages);
  }
  return "w4a16_swapab_m" + std::to_string(c.block_w) + "n" + std::to_string(c.block_t) + "k" +
         std::to_string(c.block_k) + "_s" + std::to_string(c.stages);
}

std::string w4a16_smem_summary(const W4A16Config& c) {
  const W4A16Layout l = W4A16Layout::make(c);
  std::ostringstream s;
  if (!l.valid()) {
    s << "invalid config (" << l.invalid_reason << ")";
    return s.str();
  }
  if (W4A16Layout::stream_cta_x_ring(c)) {
    if (W4A16Layout::stream_x_group_slots(c)) s << l.x_stages << " slots x ";  // a slot a scale group
    s << (W4A16Layout::stream_x_group_slots(c) ? l.x_slot_chunks : l.x_stages) << " chunks x " << c.block_t * 128
      << " B activations + " << c.n_warps() << " warps x " << c.stages << " chunks x " << kW4A16StreamTilesPerWarp
      << " row tiles x 512 B codes + mbarriers, ticket " << l.total_bytes() - l.barriers_offset << " = "
      << l.total_bytes() << " B";  // the barriers come last
    return s.str();
  }
  if (c.kind == W4A16Kind::kWgmma) {
    s << c.stages << " stages x (x_tile " << l.x_tile_bytes << " + w_tiles " << l.w_tiles_bytes << ") + a_tiles "
      << kWgmmaABuffers << " x " << l.a_tile_bytes << " + mbarriers " << c.stages * 16 << " = " << l.total_bytes()
      << " B (epilogue " << l.epilogue_bytes
      << " reuses the stages)";
    return s.str();
  }
  s << c.stages << " stages x (x_tile " << l.x_tile_bytes << " + w_tiles " << l.w_tiles_bytes << " + w_scales "
    << l.w_scales_bytes << ") + epilogue " << l.epilogue_bytes;
  const uint32_t padding = l.layout.bytes_of_kind(RegionKind::kPadding);
  if (padding != 0) s << " + padding " << padding;
  s << " = " << l.total_bytes() << " B";
  return s.str();
}

namespace {

// "<name>=<v> must be a positive multiple of <multiple> (<why>; <name> % <multiple> = <rest>)", or "" when it is one.
std::string multiple_refusal(const char* name, int64_t v, int64_t multiple, const char* why) {
  if (v > 0 && v % multiple == 0) return "";
  const std::string m = std::to_string(multiple);
  return std::string(name) + "=" + std::to_string(v) + " must be a positive multiple of " + m + " (" + why + "; " +
         name + " % " + m + " = " + std::to_string(v % multiple) + ")";
}

}  // namespace

std::string w4a16_k_refusal(int64_t k) {
  static_assert(kW4A16KMultiple == format::kNvfp4BlockSize, "the kernel's K step is one NVFP4 block");
  return multiple_refusal("K", k, kW4A16KMultiple, "one NVFP4 block");
}

std::string w4a16_n_refusal(int64_t n) { return multiple_refusal("N", n, kW4A16NMultiple, "16 B output stores"); }

std::string w4a16_smem_refusal(const W4A16Config& c, uint32_t smem_limit) {
  const W4A16Layout l = W4A16Layout::make(c);
  std::ostringstream s;
  if (!l.valid()) {
    s << "config " << w4a16_config_name(c) << " cannot be built: " << l.invalid_reason;
  } else if (l.total_bytes() > smem_limit) {
    s << "config " << w4a16_config_name(c) << " needs " << w4a16_smem_summary(c) << " of shared memory > "
      << smem_limit << " B (the device's opt-in limit per block) by " << l.total_bytes() - smem_limit << " B";
  }
  return s.str();
}

}  // namespace fp4moe::plan
