// Test helpers shared by every test binary: where the reference data lives, fresh random seeds.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>

namespace fp4moe::testing {

// ${FP4MOE_SHARED:-<repo>/../shared}. Fails the calling test (ASSERT) when the folder or the given
// file under it is missing: reference data that is absent must never make a test pass.
std::filesystem::path shared_path(const std::string& relative = "");

// A seed for fresh random inputs: FP4MOE_TEST_SEED when set, else from the clock. Printed once per
// test binary so that a failure can be replayed.
uint64_t test_seed();

// The message of the fp4moe::Error that `fn` throws. When it throws none, fails the calling test
// (ADD_FAILURE) and returns "(no error)"; other exceptions propagate.
std::string error_of(const std::function<void()>& fn);

// Runs a shell command with stderr merged into stdout; fills `output` and returns the exit status
// (-1 when the command could not be started or did not exit normally).
int run_command(const std::string& cmd, std::string* output);

}  // namespace fp4moe::testing
