// Communicator-id bootstrap through an environment variable or a shared file. See bootstrap.h.
// Tested by tests/dist/test_communicator.cpp (Bootstrap.*).
#include "dist/bootstrap.h"

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "core/error.h"

namespace fp4moe::dist {

std::string bytes_to_hex(const std::vector<uint8_t>& bytes) {
  static const char* kDigits = "0123456789abcdef";
  std::string s;
  s.reserve(bytes.size() * 2);
  for (uint8_t b : bytes) {
    s.push_back(kDigits[b >> 4]);
    s.push_back(kDigits[b & 0xF]);
  }
  return s;
}

std::vector<uint8_t> hex_to_bytes(const std::string& hex, size_t expected_bytes) {
  FP4MOE_CHECK(hex.size() == 2 * expected_bytes)
      << "communicator id: " << hex.size() << " hex characters, expected " << 2 * expected_bytes << " ("
      << expected_bytes << " bytes)";
  auto digit = [&](size_t i) {
    const char c = hex[i];
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    FP4MOE_FAIL() << "communicator id: character " << i << " '" << c << "' is not a hex digit";
    return 0;
  };
  std::vector<uint8_t> bytes(expected_bytes);
  for (size_t i = 0; i < expected_bytes; ++i) bytes[i] = static_cast<uint8_t>(digit(2 * i) * 16 + digit(2 * i + 1));
  return bytes;
}

std::vector<uint8_t> exchange_id_via_file(int rank, const std::string& path, size_t n_bytes,
                                          std::chrono::milliseconds timeout,
                                          const std::function<std::vector<uint8_t>()>& make_id) {
  namespace fs = std::filesystem;
  FP4MOE_CHECK(!path.empty()) << "rank " << rank << ": no communicator id file given";
  if (rank == 0) {
    const std::vector<uint8_t> id = make_id();
    FP4MOE_CHECK(id.size() == n_bytes) << "communicator id of " << id.size() << " bytes, expected " << n_bytes;
    const std::string tmp = path + ".tmp." + std::to_string(::getpid());
    {
      std::ofstream out(tmp, std::ios::trunc);
      out << bytes_to_hex(id) << "\n";
      out.flush();
      FP4MOE_CHECK(out.good()) << "rank 0: cannot write the communicator id to " << tmp;
    }
    std::error_code ec;
    fs::rename(tmp, path, ec);
    FP4MOE_CHECK(!ec) << "rank 0: cannot rename " << tmp << " to " << path << ": " << ec.message();
    return id;
  }
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    std::ifstream in(path);
    std::string hex;
    if (in && (in >> hex) && hex.size() == 2 * n_bytes) return hex_to_bytes(hex, n_bytes);
    FP4MOE_CHECK(std::chrono::steady_clock::now() < deadline)
        << "rank " << rank << ": no communicator id in " << path << " after " << timeout.count()
        << " ms (rank 0 writes it; is rank 0 running, with the same path?)";
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

std::vector<uint8_t> bootstrap_id(int rank, const std::string& path, size_t n_bytes, std::chrono::milliseconds timeout,
                                  const std::function<std::vector<uint8_t>()>& make_id) {
  if (const char* env = std::getenv(kNcclIdEnv); env != nullptr && *env != '\0') {
    return hex_to_bytes(env, n_bytes);
  }
  FP4MOE_CHECK(!path.empty()) << "rank " << rank << ": no communicator id: set " << kNcclIdEnv
                              << " (hex of the id the launcher made) or give every rank the same fresh id file path";
  return exchange_id_via_file(rank, path, n_bytes, timeout, make_id);
}

}  // namespace fp4moe::dist
