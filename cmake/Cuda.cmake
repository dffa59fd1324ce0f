# CUDA is optional. FP4MOE_CUDA=AUTO enables it when nvcc is found; ON requires it; OFF skips it.
# Kernels are built for sm_90a (wgmma/TMA need the arch-specific target). Device code is compiled
# with ptxas spill warnings turned into errors (a spill in a shipped kernel fails the build).
set(FP4MOE_HAVE_CUDA OFF)
if(NOT FP4MOE_CUDA STREQUAL "OFF")
  include(CheckLanguage)
  if(NOT CMAKE_CUDA_COMPILER AND EXISTS /usr/local/cuda/bin/nvcc)
    set(CMAKE_CUDA_COMPILER /usr/local/cuda/bin/nvcc)
  endif()
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    set(CMAKE_CUDA_ARCHITECTURES OFF)
    enable_language(CUDA)
    # CMake 3.25 (Debian 12) knows no C++20 flag for nvcc (its NVIDIA-CUDA module stops at CUDA17), so
    # CMAKE_CUDA_STANDARD 20 would fail to generate; nvcc 12+ accepts -std=c++20.
    if(NOT CMAKE_CUDA20_STANDARD_COMPILE_OPTION)
      set(CMAKE_CUDA20_STANDARD_COMPILE_OPTION "-std=c++20")
      set(CMAKE_CUDA20_EXTENSION_COMPILE_OPTION "-std=c++20")
    endif()
    set(CMAKE_CUDA_STANDARD 20)
    set(CMAKE_CUDA_STANDARD_REQUIRED ON)
    find_package(CUDAToolkit REQUIRED)
    # The wgmma W4A16 kernel takes its MMA atoms from CuTe (the pinned CUTLASS headers).
    if(NOT FP4MOE_CUTLASS_INCLUDE)
      message(FATAL_ERROR "fp4moe: the CUDA kernels need the CUTLASS/CuTe headers ${FP4MOE_CUTLASS_VERSION}: run "
                          "scripts/setup.sh (third_party/cutlass), pass -DCUTLASS_DIR=..., or -DFP4MOE_CUDA=OFF")
    endif()
    set(FP4MOE_HAVE_CUDA ON)
    set(FP4MOE_CUDA_GENCODE "-gencode=arch=compute_90a,code=sm_90a")
    message(STATUS "fp4moe: CUDA ${CMAKE_CUDA_COMPILER_VERSION} (${FP4MOE_CUDA_GENCODE})")
  elseif(FP4MOE_CUDA STREQUAL "ON")
    message(FATAL_ERROR "fp4moe: -DFP4MOE_CUDA=ON but no nvcc was found (set CMAKE_CUDA_COMPILER)")
  else()
    message(STATUS "fp4moe: no nvcc found, building the CPU backend only")
  endif()
endif()

# fp4moe_cuda_target(<target>): flags every CUDA target of the project gets.
function(fp4moe_cuda_target target)
  target_compile_options(${target} PRIVATE
    $<$<COMPILE_LANGUAGE:CUDA>:${FP4MOE_CUDA_GENCODE} --expt-relaxed-constexpr -lineinfo
      -Xptxas=--warn-on-spills,--warn-on-local-memory-usage,--warning-as-error>)
  target_compile_definitions(${target} PUBLIC FP4MOE_HAVE_CUDA=1)
endfunction()
