// Error bits the model kernels set in a device-side uint32_t instead of trapping (a trap would kill
// the context and, inside a CUDA graph, the whole server). A kernel that finds bad input (a token
// id outside the vocabulary, a position outside the RoPE table, a KV slot or block id outside the
// pool, a sequence longer than its block table) ORs its bit into the flag, writes zeros / skips the
// element, and carries on; the host reads the flag after the step (one 4-byte copy, together with
// the sampled tokens) and fails with describe_device_errors(). Header-only; the bit texts are
// checked by tests/kernels/test_cuda_ops_host.cpp.
#pragma once

#include <cstdint>
#include <string>

namespace fp4moe::cuda {

enum DeviceErrorBit : uint32_t {
  kDeviceErrorTokenId = 1u << 0,       // embedding: id outside [0, vocab)
  kDeviceErrorRopePosition = 1u << 1,  // rope: position outside [0, n_positions)
  kDeviceErrorKvSlot = 1u << 2,        // kv append: slot >= n_blocks * page_size
  kDeviceErrorKvBlock = 1u << 3,       // attention: block id outside [0, n_blocks)
  kDeviceErrorSeqLen = 1u << 4,        // attention: seq_len < q_len, or > blocks * page_size, or > splits
  kDeviceErrorKeySelection = 1u << 5,  // MLA/DSA: a selected key outside [0, pos], or bad selection offsets
};

// "token id out of range | KV block id out of range" for the bits set in `flags` ("none" for 0).
inline std::string describe_device_errors(uint32_t flags) {
  if (flags == 0) return "none";
  static constexpr struct {
    uint32_t bit;
    const char* text;
  } kTexts[] = {
      {kDeviceErrorTokenId, "token id outside the vocabulary (embedding)"},
      {kDeviceErrorRopePosition, "position outside the RoPE table (rope)"},
      {kDeviceErrorKvSlot, "KV slot outside the cache pool (kv append)"},
      {kDeviceErrorKvBlock, "KV block id outside the cache pool (attention)"},
      {kDeviceErrorSeqLen, "sequence length inconsistent with q length, block table or splits (attention)"},
      {kDeviceErrorKeySelection, "DSA key selection outside the query's causal range or malformed (MLA / indexer)"},
  };
  std::string s;
  uint32_t known = 0;
  for (const auto& t : kTexts) {
    known |= t.bit;
    if (flags & t.bit) s += (s.empty() ? "" : " | ") + std::string(t.text);
  }
  if (flags & ~known) s += (s.empty() ? "" : " | ") + std::string("unknown bits 0x") + [](uint32_t v) {
    static const char* kHex = "0123456789abcdef";
    std::string h;
    for (int i = 28; i >= 0; i -= 4) h += kHex[(v >> i) & 0xF];
    return h;
  }(flags & ~known);
  return s;
}

}  // namespace fp4moe::cuda
