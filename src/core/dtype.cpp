// DType names and widths. See dtype.h.
#include "core/dtype.h"

#include <array>

namespace fp4moe {
namespace {

struct DTypeInfo {
  std::string_view name;
  int bits;
};

constexpr std::array<DTypeInfo, kNumDTypes> kDTypeInfo = {{
    {"BOOL", 8},     {"F4", 4},          {"F6_E2M3", 6},     {"F6_E3M2", 6}, {"U8", 8},
    {"I8", 8},       {"F8_E5M2", 8},     {"F8_E4M3", 8},     {"F8_E8M0", 8}, {"F8_E4M3FNUZ", 8},
    {"F8_E5M2FNUZ", 8}, {"I16", 16},     {"U16", 16},        {"F16", 16},    {"BF16", 16},
    {"I32", 32},     {"U32", 32},        {"F32", 32},        {"C64", 64},    {"F64", 64},
    {"I64", 64},     {"U64", 64},
}};

}  // namespace

int dtype_bits(DType t) { return kDTypeInfo[static_cast<size_t>(t)].bits; }

std::string_view dtype_name(DType t) { return kDTypeInfo[static_cast<size_t>(t)].name; }

std::optional<DType> parse_dtype(std::string_view s) {
  for (size_t i = 0; i < kDTypeInfo.size(); ++i) {
    if (kDTypeInfo[i].name == s) return static_cast<DType>(i);
  }
  return std::nullopt;
}

}  // namespace fp4moe
