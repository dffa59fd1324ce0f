// The GPU table and the runtime override (see gpu_table.h). Capacities follow CCCL's
// arch_traits.h (opt-in = per-SM - 1 KiB, 1 KiB reserved per block for cc >= 8.0) and CUTLASS's
// *_smem_capacity_bytes; the H200 row was measured (../shared/spec/smem-and-tiles.md §1). Peak
// rates and bandwidths are vendor spec-sheet numbers (dense, no sparsity) and only feed the cost
// model and the decode economics. Tested by tests/plan/test_gpu_table.cpp.
#include "plan/gpu_table.h"

#include <algorithm>
#include <cctype>
#include <sstream>

#include "core/error.h"

#if defined(FP4MOE_HAVE_CUDA)
#include <cuda_runtime.h>
#endif

namespace fp4moe::plan {
namespace {

constexpr uint32_t kKiB = 1024;
constexpr uint32_t kAmpere = kMmaSync;
constexpr uint32_t kAda = kMmaSync | kFp8;
constexpr uint32_t kHopper = kMmaSync | kWgmma | kTma | kFp8;
constexpr uint32_t kBlackwellDc = kMmaSync | kTcgen05 | kBlockScaledFp4 | kTma | kFp8;
constexpr uint32_t kBlackwellRtx = kMmaSync | kBlockScaledFp4 | kTma | kFp8;

GpuSpec row(const char* name, const char* product, int sm, uint32_t per_sm_kib, int n_sms, uint32_t features,
            double bf16, double fp4, double gbps, const char* source) {
  GpuSpec g;
  g.name = name;
  g.product = product;
  g.sm = sm;
  g.smem_per_sm = per_sm_kib * kKiB;
  g.smem_optin_per_block = (per_sm_kib - 1) * kKiB;  // CCCL: opt-in = per-SM - 1 KiB
  g.smem_reserved_per_block = 1024;                  // reserved_shared_memory_per_block, cc >= 8.0
  g.n_sms = n_sms;
  g.features = features;
  g.bf16_dense_tflops = bf16;
  g.fp4_dense_tflops = fp4;
  g.hbm_gbps = gbps;
  g.source = source;
  return g;
}

std::vector<GpuSpec> build_table() {
  return {
      row("a100", "NVIDIA A100 SXM 80GB", 80, 164, 108, kAmpere, 312, 0, 2039, "CCCL sm_80; A100 datasheet"),
      row("rtx-3090", "NVIDIA GeForce RTX 3090", 86, 100, 82, kAmpere, 71, 0, 936, "CCCL sm_86; GA102 whitepaper"),
      row("rtx-4090", "NVIDIA GeForce RTX 4090", 89, 100, 128, kAda, 165, 0, 1008, "CCCL sm_89; AD102 whitepaper"),
      row("l40s", "NVIDIA L40S", 89, 100, 142, kAda, 362, 0, 864, "CCCL sm_89; L40S datasheet"),
      row("h100", "NVIDIA H100 SXM", 90, 228, 132, kHopper, 989, 0, 3350, "cutlass sm90_smem_capacity_bytes; H100 datasheet"),
      row("h200", "NVIDIA H200", 90, 228, 132, kHopper, 989, 0, 4800,
          "measured on an H200 (optin 232448, per-SM 233472, reserved 1024); H200 datasheet"),
      row("b200", "NVIDIA B200", 100, 228, 148, kBlackwellDc, 2250, 9000, 8000,
          "cutlass sm100_smem_capacity_bytes; HGX B200 datasheet (per GPU, dense)"),
      row("gb200", "NVIDIA GB200 (per GPU)", 100, 228, 148, kBlackwellDc, 2500, 10000, 8000,
          "cutlass sm100_smem_capacity_bytes; GB200 NVL72 datasheet (per GPU, dense); SM count as B200"),
      row("b300", "NVIDIA B300 (Blackwell Ultra)", 103, 228, 160, kBlackwellDc, 2500, 15000, 8000,
          "CCCL sm_103 = sm_100; Blackwell Ultra announcement (160 SMs, 15 PF dense NVFP4)"),
      row("rtx-pro-6000", "NVIDIA RTX PRO 6000 Blackwell", 120, 100, 188, kBlackwellRtx, 500, 2000, 1792,
          "cutlass sm120_smem_capacity_bytes; device reports opt-in 101376 (NVIDIA/cutlass#2692); datasheet"),
      row("rtx-5090", "NVIDIA GeForce RTX 5090", 120, 100, 170, kBlackwellRtx, 209.5, 1676, 1792,
          "CCCL sm_120; deviceQuery 102400 per SM; GB202 whitepaper"),
      row("gb10", "NVIDIA DGX Spark GB10", 121, 100, 48, kBlackwellRtx, 125, 500, 273,
          "CCCL sm_121 = sm_120; optin 101376 (QwenLM/FlashQLA#4); DGX Spark datasheet (1 PF sparse FP4)"),
  };
}

std::string normalize(std::string_view s) {
  std::string out;
  for (char c : s) out.push_back(c == '_' || c == ' ' ? '-' : static_cast<char>(std::tolower(static_cast<unsigned char>(c))));
  return out;
}

// Aliases to canonical names.
std::string canonical(const std::string& n) {
  if (n == "dgx-spark" || n == "spark") return "gb10";
  if (n == "rtx-pro-6000-blackwell" || n == "rtxpro6000" || n == "pro6000") return "rtx-pro-6000";
  if (n == "5090") return "rtx-5090";
  if (n == "4090") return "rtx-4090";
  if (n == "gb300") return "b300";
  return n;
}

}  // namespace

std::string GpuSpec::sm_name() const { return "sm_" + std::to_string(sm); }

std::string GpuSpec::features_string() const {
  std::string s;
  auto add = [&](GpuFeature f, const char* n) {
    if (!has(f)) return;
    if (!s.empty()) s += ' ';
    s += n;
  };
  add(kMmaSync, "mma.sync");
  add(kWgmma, "wgmma");
  add(kTcgen05, "tcgen05");
  add(kBlockScaledFp4, "block-scaled-fp4");
  add(kTma, "tma");
  add(kFp8, "fp8");
  return s;
}

const std::vector<GpuSpec>& gpu_table() {
  static const std::vector<GpuSpec> table = build_table();
  return table;
}

std::optional<GpuSpec> find_gpu(std::string_view name) {
  const std::string n = canonical(normalize(name));
  for (const GpuSpec& g : gpu_table()) {
    if (g.name == n) return g;
  }
  // Arch names: sm-120, sm120, 120, and nvcc's arch-specific sm_90a / sm_100a / sm_120f (the same chip's table).
  std::string digits = n;
  if (digits.rfind("sm-", 0) == 0) digits = digits.substr(3);
  else if (digits.rfind("sm", 0) == 0) digits = digits.substr(2);
  if (digits.size() >= 3 && (digits.back() == 'a' || digits.back() == 'f')) digits.pop_back();
  if (!digits.empty() && digits.size() <= 6 &&
      std::all_of(digits.begin(), digits.end(), [](char c) { return std::isdigit(static_cast<unsigned char>(c)); })) {
    const int sm = std::stoi(digits);
    for (const GpuSpec& g : gpu_table()) {
      if (g.sm == sm) return g;
    }
  }
  return std::nullopt;
}

std::string gpu_names() {
  std::ostringstream os;
  for (const GpuSpec& g : gpu_table()) os << g.name << " (" << g.sm_name() << "), ";
  os << "dgx-spark = gb10, or an arch such as sm_90, sm_100, sm_103, sm_120, sm_121";
  return os.str();
}

GpuSpec require_gpu(std::string_view name) {
  std::optional<GpuSpec> g = find_gpu(name);
  if (!g) FP4MOE_FAIL() << "unknown GPU '" << name << "'; known: " << gpu_names();
  return *g;
}

ResolvedGpu merge_runtime(const GpuSpec& base, const RuntimeGpu& rt) {
  ResolvedGpu out;
  out.spec = base;
  out.from_runtime = true;
  auto merge = [&](const char* field, auto& table_value, auto runtime_value) {
    if (table_value != runtime_value) {
      std::ostringstream os;
      os << field << ": table " << table_value << ", runtime " << runtime_value << " (using the runtime's)";
      out.disagreements.push_back(os.str());
      table_value = runtime_value;
    }
  };
  merge("sm", out.spec.sm, rt.sm);
  merge("smem_per_sm", out.spec.smem_per_sm, rt.smem_per_sm);
  merge("smem_optin_per_block", out.spec.smem_optin_per_block, rt.smem_optin_per_block);
  merge("smem_reserved_per_block", out.spec.smem_reserved_per_block, rt.smem_reserved_per_block);
  merge("smem_default_per_block", out.spec.smem_default_per_block, rt.smem_default_per_block);
  merge("n_sms", out.spec.n_sms, rt.n_sms);
  out.spec.product = rt.name;
  return out;
}

ResolvedGpu resolve_runtime_gpu(const RuntimeGpu& rt) {
  const std::string runtime_name = normalize(rt.name);
  // Longest product key contained in the runtime name ("nvidia-h200" contains "h200").
  const GpuSpec* best = nullptr;
  for (const GpuSpec& g : gpu_table()) {
    const bool contains = runtime_name.find(g.name) != std::string::npos;
    if (contains && g.sm == rt.sm && (best == nullptr || g.name.size() > best->name.size())) best = &g;
  }
  if (best == nullptr) {
    for (const GpuSpec& g : gpu_table()) {
      if (g.sm == rt.sm) {
        best = &g;
        break;
      }
    }
  }
  if (best != nullptr) return merge_runtime(*best, rt);
  GpuSpec unknown;
  unknown.name = runtime_name;
  unknown.source = "runtime only (no table row for this arch)";
  ResolvedGpu out = merge_runtime(unknown, rt);
  out.disagreements.clear();
  return out;
}

std::optional<RuntimeGpu> query_runtime_gpu(int device, std::string* why) {
#if defined(FP4MOE_HAVE_CUDA)
  cudaDeviceProp prop{};
  const cudaError_t err = cudaGetDeviceProperties(&prop, device);
  if (err != cudaSuccess) {
    if (why != nullptr) {
      *why = std::string("no GPU: cudaGetDeviceProperties(device ") + std::to_string(device) + ") failed: " +
             cudaGetErrorName(err) + " (" + cudaGetErrorString(err) + ")";
    }
    return std::nullopt;
  }
  RuntimeGpu rt;
  rt.name = prop.name;
  rt.sm = prop.major * 10 + prop.minor;
  rt.smem_per_sm = static_cast<uint32_t>(prop.sharedMemPerMultiprocessor);
  rt.smem_optin_per_block = static_cast<uint32_t>(prop.sharedMemPerBlockOptin);
  rt.smem_reserved_per_block = static_cast<uint32_t>(prop.reservedSharedMemPerBlock);
  rt.smem_default_per_block = static_cast<uint32_t>(prop.sharedMemPerBlock);
  rt.n_sms = prop.multiProcessorCount;
  return rt;
#else
  (void)device;
  if (why != nullptr) *why = "no GPU: fp4moe was built without CUDA";
  return std::nullopt;
#endif
}

}  // namespace fp4moe::plan
