// Test helpers for the end-to-end server tests: run the real `fp4moe serve` binary on a free port
// (fork + exec, output to a log file), wait for /health, stop it with a signal and read its exit
// status; a small Prometheus text parser that checks the format while it reads.
#pragma once

#include <gtest/gtest.h>

#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "server/http_client.h"

namespace fp4moe::testing {

// A port the kernel just handed out (bound to port 0, then released).
inline int free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  if (fd < 0 || ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    ADD_FAILURE() << "cannot bind a probe socket";
    if (fd >= 0) ::close(fd);
    return 0;
  }
  socklen_t len = sizeof addr;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  const int port = ntohs(addr.sin_port);
  ::close(fd);
  return port;
}

class ServerProcess {
 public:
  // Starts `<binary> serve --port P <args...>`; output goes to a temporary log printed on failure.
  ServerProcess(const std::string& binary, std::vector<std::string> args) {
    port_ = free_port();
    log_ = (std::filesystem::temp_directory_path() /
            ("fp4moe_serve_" + std::to_string(::getpid()) + "_" + std::to_string(port_) + ".log"))
               .string();
    std::vector<std::string> argv_s = {binary, "serve", "--port", std::to_string(port_)};
    argv_s.insert(argv_s.end(), args.begin(), args.end());
    pid_ = ::fork();
    if (pid_ == 0) {
      std::FILE* f = std::freopen(log_.c_str(), "w", stderr);
      (void)f;
      ::dup2(::fileno(stderr), STDOUT_FILENO);
      std::vector<char*> argv;
      for (auto& s : argv_s) argv.push_back(s.data());
      argv.push_back(nullptr);
      ::execv(argv[0], argv.data());
      std::_Exit(127);
    }
  }
  ~ServerProcess() {
    if (pid_ > 0 && !exited_) {
      ::kill(pid_, SIGKILL);
      int status = 0;
      ::waitpid(pid_, &status, 0);
    }
    if (::testing::Test::HasFailure()) std::fprintf(stderr, "--- server log %s ---\n%s\n", log_.c_str(), log().c_str());
    std::filesystem::remove(log_);
  }
  ServerProcess(const ServerProcess&) = delete;
  ServerProcess& operator=(const ServerProcess&) = delete;

  std::string url() const { return "http://127.0.0.1:" + std::to_string(port_); }
  int port() const { return port_; }
  pid_t pid() const { return pid_; }
  std::string log() const {
    std::ifstream f(log_);
    std::stringstream ss;
    ss << f.rdbuf();
    return ss.str();
  }

  // Polls /health every 50 ms until 200; records every status seen. False on timeout or exit.
  bool wait_ready(double timeout_s, std::vector<int>* statuses = nullptr) {
    server::HttpClient c(url(), 2.0);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
    while (std::chrono::steady_clock::now() < deadline) {
      int status = 0;
      if (::waitpid(pid_, &status, WNOHANG) == pid_) {
        exited_ = true;
        return false;
      }
      const auto r = c.get("/health");
      if (statuses && (statuses->empty() || statuses->back() != r.status)) statuses->push_back(r.status);
      if (r.status == 200) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    return false;
  }

  // Sends `sig` and waits up to timeout_s for the exit; returns the exit code (-1: killed / timeout).
  int stop(int sig, double timeout_s) {
    ::kill(pid_, sig);
    return wait_exit(timeout_s);
  }
  // Waits up to timeout_s for the server to exit by itself; returns the exit code (-1: killed / still running).
  int wait_exit(double timeout_s) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
    while (std::chrono::steady_clock::now() < deadline) {
      int status = 0;
      if (::waitpid(pid_, &status, WNOHANG) == pid_) {
        exited_ = true;
        return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return -1;
  }

 private:
  int port_ = 0;
  pid_t pid_ = -1;
  bool exited_ = false;
  std::string log_;
};

// Prometheus text format 0.0.4: "# HELP"/"# TYPE" comments and `name{label="v",...} value` lines.
// Returns series -> value, keyed by the line's name and label text as written. Fails the test on a
// malformed line, a sample without a TYPE, or a histogram whose buckets are not cumulative.
inline std::map<std::string, double> parse_prometheus(const std::string& text) {
  std::map<std::string, double> out;
  std::map<std::string, std::string> types;
  std::istringstream in(text);
  std::string line;
  int n = 0;
  while (std::getline(in, line)) {
    ++n;
    if (line.empty()) continue;
    if (line[0] == '#') {
      std::istringstream ls(line);
      std::string hash, kind, name, type;
      ls >> hash >> kind >> name;
      if (kind == "TYPE") {
        ls >> type;
        EXPECT_TRUE(type == "counter" || type == "gauge" || type == "histogram") << "line " << n << ": " << line;
        types[name] = type;
      } else {
        EXPECT_EQ(kind, "HELP") << "line " << n << ": " << line;
      }
      continue;
    }
    const size_t sp = line.rfind(' ');
    EXPECT_NE(sp, std::string::npos) << "line " << n << ": " << line;
    if (sp == std::string::npos) continue;
    const std::string series = line.substr(0, sp), value = line.substr(sp + 1);
    char* end = nullptr;
    const double v = std::strtod(value.c_str(), &end);
    EXPECT_TRUE(end != value.c_str() && *end == '\0') << "line " << n << ": value \"" << value << "\"";
    std::string name = series.substr(0, series.find('{'));
    if (series.find('{') != std::string::npos) {
      EXPECT_EQ(series.back(), '}') << "line " << n << ": " << line;
    }
    std::string family = name;
    for (const char* suffix : {"_bucket", "_sum", "_count"}) {
      const std::string s(suffix);
      if (family.size() > s.size() && family.compare(family.size() - s.size(), s.size(), s) == 0 &&
          types.count(family.substr(0, family.size() - s.size())) &&
          types[family.substr(0, family.size() - s.size())] == "histogram") {
        family = family.substr(0, family.size() - s.size());
      }
    }
    EXPECT_TRUE(types.count(family)) << "line " << n << ": sample " << name << " has no # TYPE";
    EXPECT_FALSE(out.count(series)) << "line " << n << ": duplicate series " << series;
    out[series] = v;
  }
  // Histograms: buckets non-decreasing, +Inf bucket == _count.
  for (const auto& [name, type] : types) {
    if (type != "histogram") continue;
    std::vector<std::pair<double, double>> buckets;  // (le, cumulative count), sorted by le
    for (const auto& [series, v] : out) {
      const std::string head = name + "_bucket{le=\"";
      if (series.rfind(head, 0) != 0 || series.find("+Inf") != std::string::npos) continue;
      buckets.emplace_back(std::strtod(series.c_str() + head.size(), nullptr), v);
    }
    std::sort(buckets.begin(), buckets.end());
    double prev = 0;
    for (const auto& [le, v] : buckets) {
      EXPECT_GE(v, prev) << name << " bucket le=" << le << " is below the previous bucket";
      prev = v;
    }
    const std::string inf = name + "_bucket{le=\"+Inf\"}";
    EXPECT_TRUE(out.count(inf)) << name << " has no +Inf bucket";
    EXPECT_TRUE(out.count(name + "_count")) << name << " has no _count";
    if (out.count(inf) && out.count(name + "_count")) {
      EXPECT_EQ(out[inf], out[name + "_count"]) << name;
    }
    if (out.count(inf)) {
      EXPECT_GE(out[inf], prev) << name;
    }
  }
  return out;
}

}  // namespace fp4moe::testing
