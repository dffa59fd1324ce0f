// SmemLayout: a constexpr, device-includable description of one kernel's shared memory as a flat
// list of named regions (offset, bytes, alignment). Every kernel family in src/plan/layout_*.h
// builds one of these from its tile config; the planner sizes launches with `total_bytes`, and a
// kernel carves its dynamic shared memory with `offset_of(...)` of the very same object, so the
// bytes are computed once (docs/planner.md, "One definition of each fact").
//
// Nested C++ structs (CUTLASS's SharedStorage) are modelled with open_struct()/close_struct():
// close_struct rounds the running size up to the struct's alignment and records the tail padding
// as a region named "<struct> padding", so that a breakdown always sums to total_bytes.
//
// Header-only, no std::string, no allocation: usable in __device__ code and in static_asserts.
// Tested by tests/plan/test_layouts.cpp.
#pragma once

#include <cstdint>
#include <cstdio>
#include <cstdlib>

#if defined(__CUDACC__)
#define FP4MOE_HD __host__ __device__
#else
#define FP4MOE_HD
#endif

namespace fp4moe::plan {

FP4MOE_HD constexpr uint32_t round_up(uint32_t x, uint32_t align) {
  return align <= 1 ? x : (x + align - 1) / align * align;
}
FP4MOE_HD constexpr uint32_t max_u32(uint32_t a, uint32_t b) { return a > b ? a : b; }
FP4MOE_HD constexpr uint32_t min_u32(uint32_t a, uint32_t b) { return a < b ? a : b; }

// sm_90's shared memory an SM and the part reserved for each resident CTA (the H100 / H200 rows of gpu_table.cpp:
// cudaDevAttrMaxSharedMemoryPerMultiprocessor 233,472 B, cudaDevAttrReservedSharedMemoryPerBlock 1,024 B): how many
// CTAs of smem_bytes dynamic shared memory one SM holds, for the planners that fill n_sms x that many slots. A
// compile-time copy of those table rows (static_asserts need constexpr); test_gpu_table pins them equal.
inline constexpr uint32_t kSm90SmemPerSmBytes = 233472;
inline constexpr uint32_t kSm90SmemReservedPerCtaBytes = 1024;
FP4MOE_HD constexpr uint32_t sm90_ctas_per_sm_by_smem(uint32_t smem_bytes) {
  return kSm90SmemPerSmBytes / (smem_bytes + kSm90SmemReservedPerCtaBytes);
}

// What a region holds; lets the planner group regions into the "stages x stage + epilogue +
// overhead" summary without string compares.
enum class RegionKind : uint8_t {
  kStageOperand,  // per-stage operand / scale-factor tiles (scales with the stage count)
  kEpilogue,      // epilogue staging tiles and fusion storage
  kBarrier,       // mbarriers / pipeline storage
  kScheduler,     // tile-scheduler responses and pointers
  kDescriptor,    // TMA descriptors held in shared memory
  kPadding,       // alignment and struct tail padding
};

struct SmemRegion {
  const char* name = "";
  uint32_t offset = 0;
  uint32_t bytes = 0;
  uint32_t align = 1;
  RegionKind kind = RegionKind::kPadding;
  bool in_epilogue_storage = false;  // part of CollectiveEpilogue::SharedStorage (CUTLASS models)
};

struct SmemLayout {
  static constexpr int kMaxRegions = 64;
  static constexpr int kMaxDepth = 6;

  SmemRegion regions[kMaxRegions]{};
  int n_regions = 0;
  uint32_t total_bytes = 0;  // size of the whole storage (after close of the outermost struct)

  // Struct nesting: alignment seen so far inside each open struct, and its name.
  uint32_t open_align[kMaxDepth]{};
  const char* open_name[kMaxDepth]{};
  int depth = 0;

  // Appends a region at the next offset aligned to `align`; gaps become padding regions.
  FP4MOE_HD constexpr uint32_t add(const char* name, uint32_t bytes, uint32_t align, RegionKind kind,
                                   bool in_epilogue_storage = false) {
    const uint32_t offset = round_up(total_bytes, align);
    if (offset != total_bytes) push("alignment padding", total_bytes, offset - total_bytes, 1, RegionKind::kPadding, in_epilogue_storage);
    push(name, offset, bytes, align, kind, in_epilogue_storage);
    total_bytes = offset + bytes;
    for (int i = 0; i < depth; ++i) open_align[i] = max_u32(open_align[i], align);
    return offset;
  }

  // Starts a nested struct whose own alignment is at least `align` (cute::aligned_struct<align>).
  FP4MOE_HD constexpr void open_struct(const char* name, uint32_t align) {
    const uint32_t offset = round_up(total_bytes, align);
    if (offset != total_bytes) push("alignment padding", total_bytes, offset - total_bytes, 1, RegionKind::kPadding);
    total_bytes = offset;
    open_name[depth] = name;
    open_align[depth] = align;
    ++depth;
  }

  // Ends the innermost struct: its size is rounded up to the largest member alignment. Returns the
  // struct's alignment so a caller can report it. An empty struct member (C++ gives it 1 byte) is
  // modelled by the caller as add("...", 1, 1, ...).
  FP4MOE_HD constexpr uint32_t close_struct(bool in_epilogue_storage = false) {
    --depth;
    const uint32_t align = open_align[depth];
    const uint32_t end = round_up(total_bytes, align);
    if (end != total_bytes) push(open_name[depth], total_bytes, end - total_bytes, 1, RegionKind::kPadding, in_epilogue_storage);
    total_bytes = end;
    if (depth > 0) open_align[depth - 1] = max_u32(open_align[depth - 1], align);
    return align;
  }

  FP4MOE_HD constexpr const SmemRegion* find(const char* name) const {
    for (int i = 0; i < n_regions; ++i) {
      if (equal(regions[i].name, name)) return &regions[i];
    }
    return nullptr;
  }
  // Offset of a named region; UINT32_MAX when absent (a constexpr caller can static_assert on it).
  FP4MOE_HD constexpr uint32_t offset_of(const char* name) const {
    const SmemRegion* r = find(name);
    return r == nullptr ? UINT32_MAX : r->offset;
  }
  FP4MOE_HD constexpr uint32_t bytes_of_kind(RegionKind kind) const {
    uint32_t sum = 0;
    for (int i = 0; i < n_regions; ++i) sum += regions[i].kind == kind ? regions[i].bytes : 0;
    return sum;
  }

 private:
  FP4MOE_HD constexpr void push(const char* name, uint32_t offset, uint32_t bytes, uint32_t align, RegionKind kind,
                                bool in_epilogue_storage = false) {
    if (n_regions < kMaxRegions) {
      regions[n_regions] = SmemRegion{name, offset, bytes, align, kind, in_epilogue_storage};
      ++n_regions;
    } else {
      overflow();
    }
  }
  // Not constexpr on purpose: reaching it in a constant expression is a compile error. At run time
  // it is a bug in a layout function (64 regions is far above any family's count).
  FP4MOE_HD static void overflow() {
#if defined(__CUDA_ARCH__)
    __trap();
#else
    std::fprintf(stderr, "fp4moe: SmemLayout: more than %d regions (raise SmemLayout::kMaxRegions)\n", kMaxRegions);
    std::abort();
#endif
  }
  FP4MOE_HD static constexpr bool equal(const char* a, const char* b) {
    while (*a != '\0' && *a == *b) {
      ++a;
      ++b;
    }
    return *a == *b;
  }
};

// Sizes of CUTLASS/CuTe objects that live in shared memory (cutlass/arch/barrier.h,
// cute/arch/copy_sm90_desc.hpp). Shared by every model so each appears once.
inline constexpr uint32_t kMbarrierBytes = 8;         // ClusterBarrier / ClusterTransactionBarrier: one uint64_t
inline constexpr uint32_t kTmaDescriptorBytes = 128;  // cute::TmaDescriptor (CUtensorMap), alignas(64), 128 B
inline constexpr uint32_t kSwizzle128Align = 1024;    // a 128B-swizzled TMA tile repeats every 8 rows x 128 B

}  // namespace fp4moe::plan
