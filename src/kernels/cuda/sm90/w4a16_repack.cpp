// Host repack of NVFP4 expert weights between the checkpoint layout and the kernel layout of
// sm90_nvfp4_w4a16_grouped_gemm (the layout is described in w4a16_weight_layout.h): codes permuted
// into the lanes' words, e4m3 scales turned into the kernel's scale bytes, one task per (expert,
// 16-row tile) on all host threads. Needs no GPU.
// Tested by tests/kernels/test_cuda_w4a16_host.cpp (round trip, every code in every position).
#include <algorithm>
#include <atomic>
#include <cstring>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "core/error.h"
#include "kernels/cuda/sm90/w4a16_weight_layout.h"
#include "plan/w4a16_smem.h"

namespace fp4moe::cuda::sm90 {

namespace {

void check_shape(int64_t n_experts, int64_t n, int64_t k, const char* what) {
  FP4MOE_CHECK(n_experts >= 1 && n > 0 && k > 0)
      << "w4a16 repack of " << what << ": E=" << n_experts << ", N=" << n << ", K=" << k << " must be positive";
  for (const std::string& refusal : {plan::w4a16_k_refusal(k), plan::w4a16_n_refusal(n)}) {
    FP4MOE_CHECK(refusal.empty()) << "w4a16 repack of " << what << ": " << refusal;
  }
}

// Byte offsets of (row, k) in the kernel layout: the code's lane word and the scale byte.
struct Addr {
  int64_t code_word_byte;  // offset of the 4-byte word holding the code
  W4A16CodeSlot slot;
  int64_t scale_byte;      // offset of the scale of (row, block k / 16)
};

Addr address(int64_t e, int64_t row, int64_t k, int64_t row_tiles, int64_t k_chunks, int64_t k_groups) {
  const int64_t rt = row / kW4A16TileRows, r = row % kW4A16TileRows;
  const int64_t kc = k / kW4A16ChunkK, kl = k % kW4A16ChunkK;
  const W4A16CodeSlot slot = w4a16_code_slot(static_cast<uint32_t>(r), static_cast<uint32_t>(kl));
  Addr a{};
  a.slot = slot;
  a.code_word_byte = ((e * row_tiles + rt) * k_chunks + kc) * kW4A16TileBytes + slot.lane * 16 + slot.word * 4;
  const int64_t kg = kc / kW4A16ScaleGroup, j = kc % kW4A16ScaleGroup;
  a.scale_byte = ((e * row_tiles + rt) * k_groups + kg) * kW4A16TileBytes + slot.lane * 16 + 2 * j + (r >> 3);
  return a;
}

uint32_t load_u32(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}
void store_u32(uint8_t* p, uint32_t v) { std::memcpy(p, &v, 4); }

// The code of output slot (j, half) of a lane word: the inverse of w4a16_place_code.
uint32_t read_code(uint32_t word, uint32_t j, uint32_t half) {
  const uint32_t base = 16 * half;
  const uint32_t positions[4] = {base + 6, base + 7, base + 8, base + 15};
  uint32_t code = 0;
  for (uint32_t b = 0; b < 4; ++b) {
    const uint32_t src = (positions[b] + w4a16_rotation(j, positions[b])) % 32;
    code |= ((word >> src) & 1u) << b;
  }
  return code;
}

// fn(0 .. n-1) on up to hardware_concurrency threads (the repack of a 256-expert layer is ~10^9
// code placements). fn must not throw.
void parallel_tasks(int64_t n, const std::function<void(int64_t)>& fn) {
  const int64_t n_threads = std::min<int64_t>(std::max(1u, std::thread::hardware_concurrency()), n);
  if (n_threads <= 1) {
    for (int64_t i = 0; i < n; ++i) fn(i);
    return;
  }
  std::atomic<int64_t> next{0};
  auto worker = [&] {
    for (int64_t i = next++; i < n; i = next++) fn(i);
  };
  std::vector<std::thread> threads;
  for (int64_t t = 1; t < n_threads; ++t) threads.emplace_back(worker);
  worker();
  for (std::thread& t : threads) t.join();
}

}  // namespace

void w4a16_repack(const uint8_t* codes, const uint8_t* scales, int64_t n_experts, int64_t n, int64_t k,
                  std::vector<uint8_t>& codes_out, std::vector<uint8_t>& scales_out, const char* what) {
  check_shape(n_experts, n, k, what);
  const int64_t row_tiles = w4a16_row_tiles(n), k_chunks = w4a16_k_chunks(k), k_groups = w4a16_k_groups(k);
  codes_out.assign(static_cast<size_t>(w4a16_codes_bytes(n_experts, n, k)), 0);
  scales_out.assign(static_cast<size_t>(w4a16_scales_bytes(n_experts, n, k)), 0);
  // Check every scale first, serially, so the first bad block is the one named whatever the threads do.
  for (int64_t e = 0; e < n_experts; ++e) {
    for (int64_t row = 0; row < n; ++row) {
      const uint8_t* scale_row = scales + (e * n + row) * (k / 16);
      for (int64_t b = 0; b < k / 16; ++b) {
        const uint8_t sc = scale_row[b];
        FP4MOE_CHECK((sc & 0x7Fu) != 0x7Fu)
            << "w4a16 repack of " << what << ": expert " << e << ", row " << row << ", block " << b
            << " (k " << 16 * b << ".." << 16 * b + 15 << ") has a NaN e4m3 scale (0x" << std::hex
            << static_cast<int>(sc) << std::dec << ")";
        FP4MOE_CHECK((sc & 0x80u) == 0)
            << "w4a16 repack of " << what << ": expert " << e << ", row " << row << ", block " << b
            << " (k " << 16 * b << ".." << 16 * b + 15 << ") has a negative e4m3 scale (0x" << std::hex
            << static_cast<int>(sc) << std::dec << "; NVFP4 block scales are UE4M3, sign bit 0)";
      }
    }
  }
  // One task per (expert, 16-row tile): a tile's lane words and scale bytes belong to it alone, so
  // the tasks write disjoint bytes and the result does not depend on the thread count.
  parallel_tasks(n_experts * row_tiles, [&](int64_t task) {
    const int64_t e = task / row_tiles, rt = task % row_tiles;
    const int64_t row_end = std::min<int64_t>(n, (rt + 1) * kW4A16TileRows);
    for (int64_t row = rt * kW4A16TileRows; row < row_end; ++row) {
      const uint8_t* code_row = codes + (e * n + row) * (k / 2);
      const uint8_t* scale_row = scales + (e * n + row) * (k / 16);
      for (int64_t kk = 0; kk < k; ++kk) {
        const uint8_t byte = code_row[kk / 2];
        const uint8_t sc = scale_row[kk / 16];
        // A zero scale becomes scale byte 0, whose word is finite (2^107): zero codes keep the
        // products exactly 0.
        const uint32_t code = sc == 0 ? 0u : (kk % 2 == 0) ? (byte & 0x0Fu) : (byte >> 4);
        const Addr a = address(e, row, kk, row_tiles, k_chunks, k_groups);
        uint8_t* w = codes_out.data() + a.code_word_byte;
        store_u32(w, w4a16_place_code(load_u32(w), a.slot.j, a.slot.half, code));
        if (kk % 16 == 0) scales_out[static_cast<size_t>(a.scale_byte)] = static_cast<uint8_t>(w4a16_scale_byte(sc));
      }
    }
  });
}

void w4a16_repack_gate_up(const uint8_t* gate_codes, const uint8_t* gate_scales, const uint8_t* up_codes,
                          const uint8_t* up_scales, int64_t n_experts, int64_t inter, int64_t k,
                          std::vector<uint8_t>& codes_out, std::vector<uint8_t>& scales_out, const char* what) {
  FP4MOE_CHECK(inter > 0 && inter % 8 == 0)
      << "w4a16 repack of " << what << ": I=" << inter << " must be a positive multiple of 8 (gate/up rows are "
      << "interleaved by 8; I % 8 = " << inter % 8 << ")";
  check_shape(n_experts, 2 * inter, k, what);
  // Interleave rows in blocks of 8 (gate block b, up block b, ...) in the checkpoint layout, then repack.
  const int64_t cb = k / 2, sb = k / 16;
  std::vector<uint8_t> codes(static_cast<size_t>(n_experts * 2 * inter * cb)), scales(static_cast<size_t>(n_experts * 2 * inter * sb));
  for (int64_t e = 0; e < n_experts; ++e) {
    for (int64_t r = 0; r < 2 * inter; ++r) {
      const int64_t block = r / 16, within = r % 16;
      const bool up = within >= 8;
      const int64_t src_row = e * inter + block * 8 + (within % 8);
      const uint8_t* c = (up ? up_codes : gate_codes) + src_row * cb;
      const uint8_t* s = (up ? up_scales : gate_scales) + src_row * sb;
      std::memcpy(codes.data() + (e * 2 * inter + r) * cb, c, static_cast<size_t>(cb));
      std::memcpy(scales.data() + (e * 2 * inter + r) * sb, s, static_cast<size_t>(sb));
    }
  }
  w4a16_repack(codes.data(), scales.data(), n_experts, 2 * inter, k, codes_out, scales_out, what);
}

void w4a16_unpack(const uint8_t* codes, const uint8_t* scales, int64_t n_experts, int64_t n, int64_t k,
                  std::vector<uint8_t>& codes_out, std::vector<uint8_t>& scales_out) {
  check_shape(n_experts, n, k, "weight");
  const int64_t row_tiles = w4a16_row_tiles(n), k_chunks = w4a16_k_chunks(k), k_groups = w4a16_k_groups(k);
  codes_out.assign(static_cast<size_t>(n_experts * n * (k / 2)), 0);
  scales_out.assign(static_cast<size_t>(n_experts * n * (k / 16)), 0);
  for (int64_t e = 0; e < n_experts; ++e) {
    for (int64_t row = 0; row < n; ++row) {
      uint8_t* code_row = codes_out.data() + (e * n + row) * (k / 2);
      for (int64_t kk = 0; kk < k; ++kk) {
        const Addr a = address(e, row, kk, row_tiles, k_chunks, k_groups);
        const uint32_t code = read_code(load_u32(codes + a.code_word_byte), a.slot.j, a.slot.half);
        code_row[kk / 2] |= static_cast<uint8_t>(kk % 2 == 0 ? code : code << 4);
        if (kk % 16 == 0) {
          uint32_t e4m3 = 0;
          const uint8_t b = scales[a.scale_byte];
          FP4MOE_CHECK(w4a16_scale_byte_to_e4m3(b, e4m3))
              << "w4a16 unpack: expert " << e << ", row " << row << ", block " << kk / 16 << " (k " << kk << ".."
              << kk + 15 << ") has scale byte 0x" << std::hex << static_cast<int>(b) << std::dec
              << ", which no e4m3 scale maps to (w4a16_scale_byte)";
          scales_out[static_cast<size_t>((e * n + row) * (k / 16) + kk / 16)] = static_cast<uint8_t>(e4m3);
        }
      }
    }
  }
}

}  // namespace fp4moe::cuda::sm90
