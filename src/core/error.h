// fp4moe::Error and the FP4MOE_CHECK macro family: the one exception type of the project.
//
//   FP4MOE_CHECK(k % 16 == 0) << "K=" << k << " is not a multiple of the NVFP4 block (16)";
//   FP4MOE_FAIL() << "unknown dtype '" << s << "'";
//
// The message carries the failed condition, file:line and whatever the caller streams.
// Tested by tests/core/test_error.cpp.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

namespace fp4moe {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};

namespace detail {

// Collects a message and throws fp4moe::Error from its destructor (after the full expression
// has streamed into it). Destructor is noexcept(false) on purpose: it only runs on the failure path.
class CheckFailure {
 public:
  CheckFailure(const char* cond, const char* file, int line) {
    if (cond != nullptr) stream_ << "check failed: " << cond << ": ";
    file_ = file;
    line_ = line;
  }
  CheckFailure(const CheckFailure&) = delete;
  CheckFailure& operator=(const CheckFailure&) = delete;
  ~CheckFailure() noexcept(false) {
    stream_ << " [" << file_ << ":" << line_ << "]";
    throw Error(stream_.str());
  }
  template <typename T>
  CheckFailure& operator<<(const T& value) {
    stream_ << value;
    return *this;
  }

 private:
  std::ostringstream stream_;
  const char* file_;
  int line_;
};

// Lets `FP4MOE_CHECK(c) << ...` be a single expression-statement whose stream is skipped on success.
struct Voidify {
  void operator&(const CheckFailure&) {}
};

}  // namespace detail
}  // namespace fp4moe

#define FP4MOE_CHECK(cond) \
  (cond) ? (void)0         \
         : ::fp4moe::detail::Voidify() & ::fp4moe::detail::CheckFailure(#cond, __FILE__, __LINE__)

#define FP4MOE_FAIL() \
  ::fp4moe::detail::Voidify() & ::fp4moe::detail::CheckFailure(nullptr, __FILE__, __LINE__)
