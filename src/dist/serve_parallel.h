// What `fp4moe serve --tp-size N --ep-size M` does with its parallelism flags today: validate them
// with the sharding math (dist/sharding.h), accept 1/1, and refuse anything larger with a message
// saying what multi-GPU serving needs (the GPU backend, issue #7, and N GPUs; the visible GPU
// count when CUDA is built) rather than ignoring the flags. Tested by tests/dist/test_sharding.cpp.
#pragma once

#include <string>

namespace fp4moe::dist {

// Throws fp4moe::Error for invalid sizes (naming them) and for any size > 1 (see above).
void check_serve_parallel(int tp_size, int ep_size);

// "8 CUDA devices visible", "CUDA not built into this binary", or why cudaGetDeviceCount failed.
std::string visible_gpus_description();

}  // namespace fp4moe::dist
