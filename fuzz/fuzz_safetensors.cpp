// libFuzzer target for the safetensors header parser: any byte string either parses into a header
// whose tensors tile the data buffer exactly, or raises fp4moe::Error. Anything else (a crash, an
// ASan/UBSan report, another exception type, a broken invariant) is a finding.
//   cmake -S . -B build -DFP4MOE_FUZZ=ON && cmake --build build --target fuzz_safetensors
//   build/fuzz/bin/fuzz_safetensors -dict=fuzz/safetensors.dict build/fuzz/work/safetensors
//   fuzz/corpus/safetensors
// CTest runs it for $FP4MOE_FUZZ_SECONDS (default 60) as fuzz_safetensors_bounded.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <span>

#include "core/error.h"
#include "format/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  fp4moe::format::SafetensorsHeader header;
  try {
    header = fp4moe::format::parse_safetensors(std::span<const uint8_t>(data, size), "fuzz-input");
  } catch (const fp4moe::Error&) {
    return 0;  // rejected with a message: the expected outcome for almost every input
  }
  // Accepted: check what the reader promises its callers.
  if (header.data_start < 8 || header.data_start > size) std::abort();
  uint64_t expect_begin = 0;
  for (const fp4moe::format::TensorInfo& t : header.tensors) {
    if (t.begin != expect_begin || t.end < t.begin) std::abort();
    const int64_t numel = t.numel();
    if (numel < 0) std::abort();
    const auto bits = static_cast<unsigned __int128>(numel) * fp4moe::dtype_bits(t.dtype);
    if (bits % 8 != 0 || bits / 8 != t.nbytes()) std::abort();
    if (t.nbytes() > 0) {
      // Touch the first and last byte of the tensor: ASan flags any read outside the input.
      volatile uint8_t first = data[header.data_start + t.begin];
      volatile uint8_t last = data[header.data_start + t.end - 1];
      (void)first;
      (void)last;
    }
    expect_begin = t.end;
  }
  if (header.data_start + expect_begin != size) std::abort();
  return 0;
}
