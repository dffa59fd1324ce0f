#include "testing/testing.h"

#include <gtest/gtest.h>

#include <sys/wait.h>

#include <array>
#include <chrono>
#include <cstdio>
#include <cstdlib>

#include "core/error.h"

namespace fp4moe::testing {

std::filesystem::path shared_path(const std::string& relative) {
  const char* env = std::getenv("FP4MOE_SHARED");
  std::filesystem::path root = (env != nullptr && env[0] != '\0') ? env : FP4MOE_SHARED_DEFAULT;
  std::filesystem::path p = relative.empty() ? root : root / relative;
  // Throwing (not ASSERT) so it works from helpers returning values; gtest reports it as a failure.
  FP4MOE_CHECK(std::filesystem::exists(p))
      << "reference data missing: " << p.string()
      << " (set FP4MOE_SHARED to the shared/ folder; tests fail rather than pass without it)";
  return p;
}

std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "no fp4moe::Error was thrown";
  return "(no error)";
}

uint64_t test_seed() {
  static const uint64_t seed = [] {
    const char* env = std::getenv("FP4MOE_TEST_SEED");
    uint64_t s = (env != nullptr) ? std::strtoull(env, nullptr, 0)
                                  : static_cast<uint64_t>(
                                        std::chrono::steady_clock::now().time_since_epoch().count());
    std::fprintf(stderr, "[fp4moe] random seed %llu (replay with FP4MOE_TEST_SEED=%llu)\n",
                 static_cast<unsigned long long>(s), static_cast<unsigned long long>(s));
    return s;
  }();
  return seed;
}

int run_command(const std::string& cmd, std::string* output) {
  output->clear();
  FILE* p = ::popen((cmd + " 2>&1").c_str(), "r");
  if (p == nullptr) return -1;
  std::array<char, 4096> buf;
  size_t n;
  while ((n = std::fread(buf.data(), 1, buf.size(), p)) > 0) output->append(buf.data(), n);
  const int status = ::pclose(p);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

}  // namespace fp4moe::testing
