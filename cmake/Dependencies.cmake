# Third-party libraries, all from Debian packages (scripts/setup.sh installs them) except the
# header-only CUTLASS/CuTe, found via -DCUTLASS_DIR or the copy scripts/setup.sh extracts from the
# pinned PyPI wheel nvidia-cutlass into third_party/cutlass.
find_package(nlohmann_json 3.10 REQUIRED)
find_package(CLI11 REQUIRED)
find_package(fmt REQUIRED)
find_package(GTest REQUIRED)
find_package(benchmark REQUIRED)
find_package(Threads REQUIRED)

set(FP4MOE_CUTLASS_VERSION "4.2.0.0" CACHE INTERNAL "pinned nvidia-cutlass version")
set(CUTLASS_DIR "" CACHE PATH "CUTLASS checkout or install (must contain include/cutlass/cutlass.h)")
set(FP4MOE_CUTLASS_INCLUDE "")
foreach(candidate "${CUTLASS_DIR}" "${CMAKE_SOURCE_DIR}/third_party/cutlass")
  if(candidate AND EXISTS "${candidate}/include/cutlass/cutlass.h" AND EXISTS "${candidate}/include/cute/tensor.hpp")
    set(FP4MOE_CUTLASS_INCLUDE "${candidate}/include")
    break()
  endif()
endforeach()
if(FP4MOE_CUTLASS_INCLUDE)
  message(STATUS "fp4moe: CUTLASS headers at ${FP4MOE_CUTLASS_INCLUDE}")
elseif(CUTLASS_DIR)
  message(FATAL_ERROR "fp4moe: -DCUTLASS_DIR=${CUTLASS_DIR} has no include/cutlass/cutlass.h and include/cute/tensor.hpp")
else()
  message(STATUS "fp4moe: CUTLASS headers not found (run scripts/setup.sh, or pass -DCUTLASS_DIR); "
                 "targets that need them are skipped")
endif()

# PCRE2 (8-bit) and utf8proc for the tokenizer. Found by header + library (no pkg-config needed, so
# an unpacked Debian sysroot on CMAKE_PREFIX_PATH works too, as on the GPU machine).
function(fp4moe_find_c_library target header lib)
  find_path(${target}_INCLUDE_DIR ${header} REQUIRED)
  find_library(${target}_LIBRARY ${lib} REQUIRED)
  add_library(fp4moe::${target} UNKNOWN IMPORTED)
  set_target_properties(fp4moe::${target} PROPERTIES IMPORTED_LOCATION "${${target}_LIBRARY}"
                        INTERFACE_INCLUDE_DIRECTORIES "${${target}_INCLUDE_DIR}")
endfunction()
fp4moe_find_c_library(pcre2 pcre2.h pcre2-8)
fp4moe_find_c_library(utf8proc utf8proc.h utf8proc)
