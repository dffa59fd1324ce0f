// Tile configurations and the shared-memory layout of sm90_nvfp4_w4a16_grouped_gemm, the Hopper
// MoE kernel that ships (src/kernels/cuda/sm90/w4a16_grouped_gemm.cu): mma.sync m16n8k16 BF16
// tensor cores, swap-AB (weights are the MMA M, tokens the MMA N), NVFP4 dequantized in registers
// from the kernel weight layout (kernels/cuda/sm90/w4a16_weight_layout.h). One constexpr
// description used by three parties: the kernel carves its dynamic shared memory with these offsets
// and the launcher requests `total_bytes()`; the planner (kernel_families.cpp) enumerates
// kW4A16Configs and sizes them with the same layout; the tests pin the offsets. The host-side
// wording (config names, byte summary, the refusal message) is in plan/w4a16_smem.h.
//
// Two kinds of config:
//  * kStream (decode, 1..32 tokens per expert): each warp owns two adjacent m16 row tiles (32
//    weight rows, kW4A16StreamTilesPerWarp) and streams their codes into its own two rings of
//    `stages` 512 B chunk slots in shared memory (one coalesced 16 B cp.async per lane per tile per
//    64-wide K chunk; a lane only ever reads back its own 16 B, so no barrier for the codes), `stages - 1`
//    chunks of each tile in flight per warp; the activations are the CTA's (stream_cta_x_ring): TMA
//    boxes of block_t rows x 64 k into a ring, issued by the first warp to need them (a ticket), full /
//    empty mbarriers per slot; with 8 / 16 tokens a slot holds a scale group's 8 boxes
//    (stream_x_group_slots, kW4A16StreamXGroupSlots slots), with 32 tokens one box (x_stages slots of
//    kW4A16StreamXRingBytes); scales come a group (8 chunks) ahead in registers; one activation
//    fragment feeds both tiles' MMAs.
//      block_w  rows per CTA: 64, 128 or 256 (2, 4 or 8 warps); block_t 8, 16 or 32 tokens; block_k 64 (one
//      chunk per step); stages = code ring depth in chunks: 4, 8 or 16.
//    Name: "w4a16_stream_m<block_w>n<block_t>_d<stages>".
//    Shared memory, three regions: the activation ring at 0 (slot s at ring_x_offset + s x x_slot_chunks
//    x block_t x 128, box j of a group slot block_t x 128 further, 128B-swizzled as the wgmma x tile,
//    w4a16_wgmma_swizzle), the warps' code rings (ring_offset + w x ring_warp_bytes, tile h's at h x
//    stages x 512), then a full and an empty mbarrier per slot and the issue ticket (4 B, in a 16 B
//    tail) at barriers_offset.
//  * kPipeline (32+ tokens): activations, codes and scales staged through shared memory by a
//    cp.async multi-stage pipeline.
//      block_w 64 or 128 (one m16 row tile per warp); block_t 8, 16, 32 or 64; block_k 128 or 256
//      (2 or 4 chunks); stages 2..6.
//    Name: "w4a16_swapab_m<block_w>n<block_t>k<block_k>_s<stages>".
//    Per stage (each region 128 B aligned, all sizes multiples of 128):
//      x_tile    block_t x block_k bf16        16 B chunks XOR-swizzled by token parity
//      w_tiles   block_w / 16 row tiles x block_k / 64 chunks x 512 B, in the kernel weight layout
//                (a lane reads its own 16 B: conflict-free)
//      w_scales  block_w / 16 row tiles x 32 lanes x 2 (block_k / 64) B: each lane's scale bytes of
//                the stage's chunks (kernel "ue5m3" bytes, not e4m3: w4a16_weight_layout.h), cut
//                from its 16 B of the kernel layout's scale group
//    Once:
//      epilogue  block_t rows x (block_w x 2 + 16) B   bf16 output tile, token-major, rows padded
//                                                      by 16 B so the transposed writes spread over banks
//  * kWgmma (prefill, and dense Linears at 64 tokens: past the H200's ridge point): Hopper wgmma
//    m64nNk16 with both operands in shared memory (SS), two consumer warpgroups of block_w / 2 weight
//    rows each (1 or 2 m64 blocks: m64 block j, rows 64 j .., is warpgroup j % 2's; warp w of the CTA
//    owns row tiles w and, with 256 rows, w + 8) and a producer warpgroup (warps 0-3, before the
//    consumers; its first thread issues the TMA loads of each stage). Each consumer warp dequantizes
//    its own row tiles (16 rows each, the same registers as the mma.sync kernels) and stores them as
//    bf16 in natural K order into a 128B-swizzled K-major A tile, so the weight
//    layout's K permutation never reaches the MMA; the activations come 128B-swizzled by TMA.
//      block_w 128 or 256; block_t (tokens, the wgmma N) 32, 64, 128 or 256 (block_w / 128 x block_t
//      <= 256: the accumulators); block_k 64
//      (one chunk per stage); stages 4 or 8 (up to `stages` chunks in flight: the producer refills the
//      slot of chunk i - stages once every consumer warp has released it, after its wgmma of that
//      chunk completed).
//    Name: "w4a16_wgmma_m<block_w>n<block_t>_s<stages>".
//    Per stage (x_tile 1024 B aligned, the 128B-swizzle atom; stage_stride a multiple of 1024):
//      x_tile    block_t rows x 128 B (64 bf16), 16 B unit u of row r at r x 128 + (u ^ (r & 7)) x 16:
//                one TMA 2D tile load (box 64 k x block_t rows, SWIZZLE_128B writes exactly this)
//      w_tiles   block_w / 16 row tiles x 512 B of codes (the kernel weight layout; one TMA 2D load of
//                the CTA's row tiles, a lane reads back its own 16 B)
//    Once:
//      a_tiles   kWgmmaABuffers x block_w rows x 128 B bf16, the same swizzle (the dequantized weights;
//                4 buffers: the one chunk i writes was last read by the wgmma of chunk i - 4, which
//                every warp waited for before the barrier of chunk i - 2; 4, a power of 2 like the
//                stage counts, so that a chunk's buffer and slot follow from its place in the scale
//                group at compile time)
//      mbarriers two per stage: full (both TMA loads landed: expect-tx of block_t x 128 + block_w x 32 B)
//                and empty (the 8 consumer warps released the stage)
//    Scales come through registers (a lane's 16 B per 8 chunks, one group ahead). The epilogue tile
//    (block_t rows x (block_w x 2 + 16) B) reuses the stage region from offset 0 after the main loop
//    (every copy drained, every wgmma done), so it adds no bytes; check() requires it to fit there.
// Header-only constexpr, host + device; depends only on plan/smem_layout.h. Tested by
// tests/plan/test_layouts.cpp (offsets pinned per shipped config) and
// tests/kernels/test_cuda_w4a16_host.cpp (the kernel's carve against the planner's sizing).
#pragma once

#include <cstdint>

#include "plan/smem_layout.h"

namespace fp4moe::plan {

inline constexpr uint32_t kSm90SmemOptinBytes = 232448;  // cudaDevAttrMaxSharedMemoryPerBlockOptin on sm_90

enum class W4A16Kind : uint32_t { kPipeline = 0, kStream = 1, kWgmma = 2 };

// The kind that issues wgmma (sm_90a only; two warpgroups of m64 blocks).
FP4MOE_HD constexpr bool w4a16_is_wgmma(W4A16Kind k) { return k == W4A16Kind::kWgmma; }

struct W4A16Config {
  uint32_t block_w = 128;  // weight rows per CTA (MMA M)
  uint32_t block_t = 16;   // tokens per CTA (MMA N)
  uint32_t block_k = 256;  // K per stage (kStream: 64)
  uint32_t stages = 4;     // pipeline stages (kStream: code ring depth in chunks)
  W4A16Kind kind = W4A16Kind::kPipeline;

  // kPipeline: one m16 row tile per warp; kStream: kW4A16StreamTilesPerWarp; kWgmma: always two
  // warpgroups (block_w / 128 row tiles per warp).
  FP4MOE_HD constexpr uint32_t n_warps() const;
  FP4MOE_HD constexpr uint32_t n_threads() const { return n_warps() * 32; }
};

// kStream with a slot a chunk (32 tokens; stream_x_stages): the CTA ring's bytes, at least `stages` slots. A
// slot is refilled once every warp released it, so with more slots than chunks in flight (stages - 1)
// the slowest warp may trail the fastest by x_stages - stages + 1 chunks before a refill waits for it.
inline constexpr uint32_t kW4A16StreamXRingBytes = 16384;
// kStream with 8 or 16 tokens on the CTA's activation ring: a slot holds a scale group's 8 chunks (one
// full wait, one ticket and one release a group: per chunk they cost the issue-bound n8 step ~30%
// more instructions), kW4A16StreamXGroupSlots slots, the next group's boxes issued at a group's start.
inline constexpr uint32_t kW4A16StreamXGroupSlots = 2;
inline constexpr uint32_t kW4A16StreamXGroupChunks = 8;  // kW4A16ScaleGroup (the kernel static_asserts it)
// m16 row tiles a kStream warp owns (adjacent: 32 weight rows). 2, not 1: the activation fragments
// it loads feed both tiles' MMAs and the two dequant chains overlap; at 16 tokens per expert 1.24x
// (gate_up) / 1.10x (down) faster, equal at 1-8 (H200, BENCHMARKS.md 2026-12-04 thirteenth session).
inline constexpr uint32_t kW4A16StreamTilesPerWarp = 2;

FP4MOE_HD constexpr uint32_t W4A16Config::n_warps() const {
  if (kind == W4A16Kind::kWgmma) return 12;  // a producer warpgroup + two consumer warpgroups
  return kind == W4A16Kind::kStream ? block_w / (16 * kW4A16StreamTilesPerWarp) : block_w / 16;
}
// kWgmma: dequantized A tiles in flight (see the file comment) and the 128B-swizzle atom.
inline constexpr uint32_t kWgmmaABuffers = 4;  // a power of 2 (w4a16_wgmma.cu)
inline constexpr uint32_t kWgmmaSwizzleAtom = 1024;  // 8 rows x 128 B

// kWgmma tiles (x_tile, a_tiles): byte offset of 16 B unit `unit16` (0..7: k = 8 unit16 .. + 7) of row
// `row`, K-major, 128B-swizzled (the wgmma canonical layout, CuTe's Layout_K_SW128_Atom for bf16; the
// tile base is 1024 B aligned). Checked against CuTe by tests/kernels/test_wgmma_layout_host.cpp.
FP4MOE_HD constexpr uint32_t w4a16_wgmma_swizzle(uint32_t row, uint32_t unit16) {
  return row * 128 + ((unit16 ^ (row & 7u)) << 4);
}

// The wgmma shared-memory matrix descriptor of such a tile at shared address `addr` (+ 32 B per k16
// step inside the 128 B row): start address >> 4 in bits 0..13, leading byte offset 1 (unused by
// swizzled K-major layouts), stride byte offset 1024 >> 4 (8 rows of 128 B to the next 8) in bits
// 32..45, base offset 0, layout type 1 (SWIZZLE_128B) in bits 62..63 (PTX ISA "Matrix Descriptor
// Format"; checked against CuTe's GmmaDescriptor by tests/kernels/test_wgmma_layout_host.cpp).
// Split in two 32-bit halves: the high word is the same for every tile (stride, layout type), the low
// word is the address field plus the leading byte offset, so a tile's descriptor at a constant offset
// from another's is the other's low word + offset / 16 (the 14-bit address field of a shared address
// below 256 KB does not carry into bit 16).
inline constexpr uint32_t kWgmmaDescHi = (kWgmmaSwizzleAtom >> 4) | (1u << 30);
FP4MOE_HD constexpr uint32_t w4a16_wgmma_desc_lo(uint32_t addr) { return ((addr & 0x3FFFFu) >> 4) | (1u << 16); }
FP4MOE_HD constexpr uint64_t w4a16_wgmma_desc_of_lo(uint32_t lo) { return (uint64_t{kWgmmaDescHi} << 32) | lo; }
FP4MOE_HD constexpr uint64_t w4a16_wgmma_desc(uint32_t addr) { return w4a16_wgmma_desc_of_lo(w4a16_wgmma_desc_lo(addr)); }

// kStream: the activations by TMA boxes into a ring of the CTA (full / empty mbarriers, the boxes issued
// by the first warp there), every token count: 32 tokens a slot a chunk (H100, twenty-fifth session:
// 10-23% faster than each lane's cp.async into its warp's rings, whose 32 B loads of each row, shared-memory
// wavefronts and L1 reads bounded it); 8 and 16 tokens a slot a scale group (W4A16Layout::
// stream_x_group_slots: with a slot a chunk the per-chunk barrier work made the issue-bound n8 step ~30%
// longer and 1-8 tokens 20-28% slower; a slot a group: 1-8 tokens level, 16 tokens 2-4% faster, H100,
// twenty-sixth session).
FP4MOE_HD constexpr bool w4a16_stream_cta_x_ring(const W4A16Config& c) { return c.kind == W4A16Kind::kStream; }

// Registers per thread a config is compiled for (kStream: the chunk's activation fragments, 8
// registers per 8 tokens, and the row tiles' accumulators, 4 per tile per 8 tokens, plus ~72 for the
// rest (two chunks' A fragments): 88 for n8, 104 for n16; n32, one n8 tile's fragments at a time, 112;
// kPipeline: 64).
FP4MOE_HD constexpr uint32_t w4a16_register_budget(const W4A16Config& c) {
  // kWgmma: a consumer thread's accumulators (block_w / 128 x block_t / 2 f32) plus ~64 for the rest,
  // at most 255 (w4a16_wgmma_consumer_regs: what setmaxnreg gives the consumers must cover it).
  if (c.kind == W4A16Kind::kWgmma) {
    const uint32_t acc = c.block_w / 128 * c.block_t / 2;
    return acc + 64 > 255 ? 255 : acc + 64;
  }
  if (c.kind != W4A16Kind::kStream) return 64;
  // The CTA's activation ring: one n8 tile's fragments live at a time (8 registers), loaded before its MMAs
  // (ptxas: m128n32 115, m256n32 110).
  if (c.block_t == 32) return 72 + 8 + 4 * kW4A16StreamTilesPerWarp * (c.block_t / 8);
  return 72 + (8 + 4 * kW4A16StreamTilesPerWarp) * (c.block_t / 8);
}

// CTAs per SM the kernel is compiled for (__launch_bounds__ min blocks, which caps registers at
// 65536 / (ctas x threads)): as many as the shared memory allows (228 KB per SM, 1 KB reserved per
// CTA) and the register budget allows. Decode tiles are latency-bound: more resident warps hide the
// load -> dequant -> MMA chains.
// kWgmma: registers a thread at launch with `ctas` CTAs of 384 threads a SM (ptxas' cap, a multiple
// of 8), and after setmaxnreg: the producer warpgroup kWgmmaProducerRegs, the two consumer warpgroups
// what that frees (12 L = 4 x 40 + 8 C; a multiple of 8, at most 256).
inline constexpr uint32_t kWgmmaProducerRegs = 40;
FP4MOE_HD constexpr uint32_t w4a16_wgmma_launch_regs(uint32_t ctas) {
  const uint32_t l = 65536 / (ctas * 384) / 8 * 8;
  return l > 255 ? 248 : l;
}
FP4MOE_HD constexpr uint32_t w4a16_wgmma_consumer_regs_at(uint32_t ctas) {
  const uint32_t l = w4a16_wgmma_launch_regs(ctas);
  const uint32_t c = (12 * l - 4 * kWgmmaProducerRegs) / 8 / 8 * 8;
  return c > 256 ? 256 : c;
}

FP4MOE_HD constexpr uint32_t w4a16_ctas_per_sm(const W4A16Config& c, uint32_t smem_bytes) {
  const uint32_t by_smem = sm90_ctas_per_sm_by_smem(smem_bytes);
  // kWgmma: 2 when the consumers' registers at 2 CTAs (after setmaxnreg) cover the budget, else 1.
  const uint32_t by_regs = c.kind == W4A16Kind::kWgmma
                               ? (w4a16_wgmma_consumer_regs_at(2) >= w4a16_register_budget(c) ? 2 : 1)
                               : 65536 / (c.n_threads() * w4a16_register_budget(c));
  const uint32_t n = by_smem < by_regs ? by_smem : by_regs;
  return n < 1 ? 1 : n;
}
FP4MOE_HD constexpr uint32_t w4a16_wgmma_consumer_regs(const W4A16Config& c, uint32_t smem_bytes) {
  return w4a16_wgmma_consumer_regs_at(w4a16_ctas_per_sm(c, smem_bytes));
}

struct W4A16Layout {
  static constexpr uint32_t kMinStages = 2;
  static constexpr uint32_t kMaxStages = 6;
  static constexpr uint32_t kEpilogueRowPad = 16;

  W4A16Config config{};
  SmemLayout layout{};
  uint32_t x_tile_offset = 0, w_tiles_offset = 0, w_scales_offset = 0;  // stage 0
  uint32_t stage_stride = 0;                                             // bytes between stages
  uint32_t x_tile_bytes = 0, w_tiles_bytes = 0, w_scales_bytes = 0;      // one stage
  uint32_t epilogue_offset = 0, epilogue_row_bytes = 0, epilogue_bytes = 0;
  uint32_t ring_offset = 0, ring_warp_bytes = 0;  // kStream: warp w's rings at ring_offset + w * ring_warp_bytes
  uint32_t ring_x_offset = 0;                     // kStream: the CTA's activation ring, from smem
  uint32_t x_stages = 0;       // kStream with the CTA's activation ring: its slots (else 0)
  uint32_t x_slot_chunks = 0;  // and the chunks a slot holds (1, or a scale group's 8)
  uint32_t a_tiles_offset = 0, a_tile_bytes = 0;  // kWgmma: A buffer b at a_tiles_offset + b * a_tile_bytes
  uint32_t barriers_offset = 0;  // kWgmma: full[stages], empty[stages]; kStream CTA ring: full, empty[x_stages], ticket
  const char* invalid_reason = nullptr;  // non-null: the config cannot be built (the rule broken)

  FP4MOE_HD constexpr uint32_t total_bytes() const { return layout.total_bytes; }
  FP4MOE_HD constexpr bool valid() const { return invalid_reason == nullptr; }
  FP4MOE_HD constexpr bool fits(uint32_t capacity) const { return valid() && total_bytes() <= capacity; }

  FP4MOE_HD constexpr uint32_t x_tile(uint32_t stage) const { return x_tile_offset + stage * stage_stride; }
  FP4MOE_HD constexpr uint32_t w_tiles(uint32_t stage) const { return w_tiles_offset + stage * stage_stride; }
  FP4MOE_HD constexpr uint32_t w_scales(uint32_t stage) const { return w_scales_offset + stage * stage_stride; }
  // kStream, bytes from a warp's code rings to lane 0's 16 B of row tile h's codes in slot `slot`; lane L's
  // are 16 L further.
  FP4MOE_HD constexpr uint32_t ring_code_slot(uint32_t h, uint32_t slot) const {
    return (h * config.stages + slot) * 512;
  }
  // kStream: bytes from smem to the CTA activation ring's slot `slot` (x_slot_chunks boxes of block_t rows
  // x 128 B, each 128B-swizzled: w4a16_wgmma_swizzle).
  FP4MOE_HD constexpr uint32_t cta_x_slot(uint32_t slot) const {
    return ring_x_offset + slot * x_slot_chunks * config.block_t * 128;
  }
  // ... and to box `box` of that slot (a slot a scale group: chunk box of the group; else box 0).
  FP4MOE_HD constexpr uint32_t cta_x_box(uint32_t slot, uint32_t box) const {
    return cta_x_slot(slot) + box * config.block_t * 128;
  }

  FP4MOE_HD static constexpr bool stream_cta_x_ring(const W4A16Config& c) { return w4a16_stream_cta_x_ring(c); }
  // The 8 / 16-token tiles: a slot a scale group (kW4A16StreamXGroupSlots); 32 tokens: a slot a chunk.
  FP4MOE_HD static constexpr bool stream_x_group_slots(const W4A16Config& c) {
    return stream_cta_x_ring(c) && c.block_t < 32;
  }
  // The 32-token tiles' slots (a slot a chunk): kW4A16StreamXRingBytes worth, at least `stages` (a power of 2
  // either way). The group-slot tiles have kW4A16StreamXGroupSlots.
  FP4MOE_HD static constexpr uint32_t stream_x_stages(const W4A16Config& c) {
    const uint32_t by_bytes = kW4A16StreamXRingBytes / (c.block_t * 128);
    return by_bytes > c.stages ? by_bytes : c.stages;
  }

  // nullptr when the kernel can be instantiated with `c`, else the rule it breaks.
  FP4MOE_HD static constexpr const char* check(const W4A16Config& c) {
    if (c.kind == W4A16Kind::kStream) {
      if (c.block_w != 64 && c.block_w != 128 && c.block_w != 256) {
        return "stream: block_w (weight rows per CTA) must be 64, 128 or 256";
      }
      if (c.block_t != 8 && c.block_t != 16 && c.block_t != 32) return "stream: block_t (tokens, MMA N) must be 8, 16 or 32";
      if (c.block_k != 64) return "stream: block_k must be 64 (one chunk per step)";
      if (c.stages != 4 && c.stages != 8 && c.stages != 16) return "stream: stages (code ring depth) must be 4, 8 or 16";
      return nullptr;
    }
    if (c.kind == W4A16Kind::kWgmma) {
      if (c.block_w != 128 && c.block_w != 256) {
        return "wgmma: block_w (weight rows per CTA) must be 128 or 256 (two warpgroups of 1 or 2 m64 blocks)";
      }
      if (c.block_t != 32 && c.block_t != 64 && c.block_t != 128 && c.block_t != 256) {
        return "wgmma: block_t (tokens, the wgmma N) must be 32, 64, 128 or 256";
      }
      if (c.block_w / 128 * c.block_t > 256) {
        return "wgmma: block_w / 128 x block_t must be <= 256 (f32 accumulators: at most 128 a thread)";
      }
      if (c.block_k != 64) return "wgmma: block_k must be 64 (one chunk per stage)";
      if (c.stages != 4 && c.stages != 8) return "wgmma: stages must be 4 or 8 (a power of 2 dividing the 8-chunk scale group)";
      // The epilogue tile reuses the stage region (see the file comment).
      if (c.block_t * (c.block_w * 2 + kEpilogueRowPad) > c.stages * (c.block_t * 128 + c.block_w * 32)) {
        return "wgmma: the epilogue tile must fit in the stage region it reuses";
      }
      return nullptr;
    }
    if (c.kind != W4A16Kind::kPipeline) return "unknown kind";
    if (c.block_w != 64 && c.block_w != 128) return "block_w (weight rows, MMA M) must be 64 or 128";
    if (c.block_t != 8 && c.block_t != 16 && c.block_t != 32 && c.block_t != 64) {
      return "block_t (tokens, MMA N) must be 8, 16, 32 or 64";
    }
    if (c.block_k != 128 && c.block_k != 256) return "block_k must be 128 or 256";
    if (c.stages < kMinStages || c.stages > kMaxStages) return "stages must be 2..6";
    return nullptr;
  }

  FP4MOE_HD static constexpr W4A16Layout make(const W4A16Config& c) {
    W4A16Layout out{};
    out.config = c;
    out.invalid_reason = check(c);
    if (out.invalid_reason != nullptr) return out;
    if (stream_cta_x_ring(c)) {
      // The CTA's activation ring (x_slot_chunks TMA boxes of block_t rows x 64 k a slot, 128B-swizzled), the
      // warps' code rings, the slots' full / empty mbarriers and the issue ticket.
      out.x_stages = stream_x_group_slots(c) ? kW4A16StreamXGroupSlots : stream_x_stages(c);
      out.x_slot_chunks = stream_x_group_slots(c) ? kW4A16StreamXGroupChunks : 1;
      out.ring_x_offset = out.layout.add("activation ring (CTA: bf16, 128B-swizzled)",
                                         out.x_stages * out.x_slot_chunks * c.block_t * 128, kWgmmaSwizzleAtom,
                                         RegionKind::kStageOperand);
      out.ring_warp_bytes = kW4A16StreamTilesPerWarp * c.stages * 512;
      out.ring_offset = out.layout.add("code rings (per warp: e2m1 kernel layout)", c.n_warps() * out.ring_warp_bytes,
                                       128, RegionKind::kStageOperand);
      out.barriers_offset = out.layout.add("mbarriers (activation slot full, empty), issue ticket",
                                           out.x_stages * 16 + 16, 8, RegionKind::kBarrier);
      return out;
    }
    if (c.kind == W4A16Kind::kWgmma) {
      // Per stage the activations and the codes; then the A tiles and the mbarriers. The epilogue
      // reuses the stages from offset 0.
      SmemLayout& l = out.layout;
      out.x_tile_bytes = c.block_t * 128;
      out.w_tiles_bytes = c.block_w * 32;
      for (uint32_t s = 0; s < c.stages; ++s) {
        const uint32_t x = l.add("stage x_tile (bf16 activations, 128B-swizzled)", out.x_tile_bytes, kWgmmaSwizzleAtom,
                                 RegionKind::kStageOperand);
        l.add("stage w_tiles (nvfp4 e2m1, kernel layout)", out.w_tiles_bytes, 128, RegionKind::kStageOperand);
        if (s == 1) out.stage_stride = x;
      }
      out.a_tile_bytes = c.block_w * 128;
      out.a_tiles_offset = l.add("a_tiles (bf16 dequantized weights, 128B-swizzled)", kWgmmaABuffers * out.a_tile_bytes,
                                 kWgmmaSwizzleAtom, RegionKind::kStageOperand);
      out.barriers_offset = l.add("mbarriers (stage full, stage empty)", c.stages * 16, 8, RegionKind::kBarrier);
      out.w_tiles_offset = out.x_tile_bytes;
      out.epilogue_row_bytes = c.block_w * 2 + kEpilogueRowPad;
      out.epilogue_bytes = c.block_t * out.epilogue_row_bytes;  // at offset 0, inside the stages
      return out;
    }
    out.x_tile_bytes = c.block_t * c.block_k * 2;
    out.w_tiles_bytes = c.block_w * c.block_k / 2;
    out.w_scales_bytes = c.block_w * c.block_k / 16;
    SmemLayout& l = out.layout;
    for (uint32_t s = 0; s < c.stages; ++s) {
      const uint32_t x = l.add("stage x_tile (bf16 activations)", out.x_tile_bytes, 128, RegionKind::kStageOperand);
      const uint32_t w = l.add("stage w_tiles (nvfp4 e2m1, kernel layout)", out.w_tiles_bytes, 128, RegionKind::kStageOperand);
      const uint32_t sc = l.add("stage w_scales (ue5m3 scale bytes, per lane)", out.w_scales_bytes, 128, RegionKind::kStageOperand);
      if (s == 0) {
        out.x_tile_offset = x;
        out.w_tiles_offset = w;
        out.w_scales_offset = sc;
      } else if (s == 1) {
        out.stage_stride = x - out.x_tile_offset;
      }
    }
    if (c.stages == 1) out.stage_stride = l.total_bytes;
    out.epilogue_row_bytes = c.block_w * 2 + kEpilogueRowPad;
    out.epilogue_bytes = c.block_t * out.epilogue_row_bytes;
    out.epilogue_offset = l.add("epilogue tile (bf16 block_t x block_w, rows +16 B)", out.epilogue_bytes, 128,
                                RegionKind::kEpilogue);
    // Round the whole request to 128 B (the launcher asks for exactly this).
    const uint32_t end = round_up(l.total_bytes, 128);
    if (end != l.total_bytes) l.add("tail padding", end - l.total_bytes, 1, RegionKind::kPadding);
    return out;
  }
};

// The configurations the kernel is compiled for (the planner and autotuner pick among these by
// index). Decode (1..16 tokens per expert) wants the streaming (kStream) configs, 32+ tokens the
// pipelined 32/64-token tiles.
inline constexpr W4A16Kind kStreamKind = W4A16Kind::kStream;
inline constexpr W4A16Config kW4A16Configs[] = {
    {64, 8, 64, 8, kStreamKind},           // w4a16_stream_m64n8_d8
    {128, 8, 64, 4, kStreamKind},          // w4a16_stream_m128n8_d4
    {128, 8, 64, 8, kStreamKind},          // w4a16_stream_m128n8_d8
    {64, 16, 64, 8, kStreamKind},          // w4a16_stream_m64n16_d8
    {128, 16, 64, 4, kStreamKind},         // w4a16_stream_m128n16_d4
    {128, 16, 64, 8, kStreamKind},         // w4a16_stream_m128n16_d8
    {64, 8, 256, 4},                       // w4a16_swapab_m64n8k256_s4
    {128, 16, 256, 4},                     // w4a16_swapab_m128n16k256_s4
    {128, 32, 128, 4},                     // w4a16_swapab_m128n32k128_s4
    {128, 64, 128, 4},                     // w4a16_swapab_m128n64k128_s4
    {64, 64, 128, 4},                      // w4a16_swapab_m64n64k128_s4
    {128, 32, 64, 4, W4A16Kind::kWgmma},   // w4a16_wgmma_m128n32_s4
    {128, 64, 64, 4, W4A16Kind::kWgmma},   // w4a16_wgmma_m128n64_s4
    {128, 128, 64, 4, W4A16Kind::kWgmma},  // w4a16_wgmma_m128n128_s4
    {128, 256, 64, 4, W4A16Kind::kWgmma},  // w4a16_wgmma_m128n256_s4
    {256, 64, 64, 4, W4A16Kind::kWgmma},   // w4a16_wgmma_m256n64_s4
    {256, 128, 64, 4, W4A16Kind::kWgmma},  // w4a16_wgmma_m256n128_s4
    {128, 32, 64, 4, kStreamKind},         // w4a16_stream_m128n32_d4 (17-32 tokens until m256n32; appended: the ids above stay)
    {256, 8, 64, 4, kStreamKind},          // w4a16_stream_m256n8_d4 (1-8 tokens; appended)
    {256, 16, 64, 4, kStreamKind},         // w4a16_stream_m256n16_d4 (9-16 tokens; appended)
    {256, 32, 64, 4, kStreamKind},         // w4a16_stream_m256n32_d4 (17-32 tokens, 8 warps; appended)
};
inline constexpr int kNumW4A16Configs = static_cast<int>(sizeof(kW4A16Configs) / sizeof(kW4A16Configs[0]));

namespace detail {
constexpr bool all_configs_fit() {
  for (const W4A16Config& c : kW4A16Configs) {
    if (!W4A16Layout::make(c).fits(kSm90SmemOptinBytes)) return false;
  }
  return true;
}
}  // namespace detail
static_assert(detail::all_configs_fit(), "a shipped W4A16 config exceeds the sm_90 opt-in shared memory (232448 B)");

}  // namespace fp4moe::plan
