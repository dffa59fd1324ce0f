// A small blocking HTTP client over cpp-httplib for the tools and the end-to-end tests: plain
// requests with a timeout, and streaming POSTs that hand each Server-Sent-Events `data:` payload to a
// callback as it arrives (so TTFT and inter-token latency are measured when the bytes land).
//
//   fp4moe::server::HttpClient c("http://127.0.0.1:30000", /*timeout_s=*/30);
//   auto r = c.get("/health");                                   // r.status, r.body
//   c.post_sse("/generate", body, [](std::string_view data) { ...; return true; });
//
// A callback that returns false closes the connection (what a client disconnecting mid-stream does).
// Tested through tests/server/test_server_e2e.cpp and `fp4moe bench-serving`.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>

namespace fp4moe::server {

struct HttpResponse {
  int status = -1;  // -1: no response (connection refused, timeout, closed by the callback)
  std::string body;
  std::multimap<std::string, std::string> headers;
  std::string error;  // transport error text when status == -1
  std::string header(const std::string& key) const;
};

class HttpClient {
 public:
  // `url`: http://host:port (a trailing slash is ignored). Every request times out after timeout_s.
  explicit HttpClient(const std::string& url, double timeout_s = 60);
  ~HttpClient();
  HttpClient(const HttpClient&) = delete;
  HttpClient& operator=(const HttpClient&) = delete;

  HttpResponse get(const std::string& path);
  HttpResponse post(const std::string& path, const std::string& body,
                    const std::string& content_type = "application/json");
  // POSTs and parses the SSE stream: on_data receives each event's `data:` payload (without the
  // prefix, `[DONE]` included). When the answer is not 200 the body is returned whole instead.
  HttpResponse post_sse(const std::string& path, const std::string& body,
                        const std::function<bool(std::string_view data)>& on_data);

  // Sends `Authorization: Bearer <token>` with every request from now on (a server's --api-key).
  void set_bearer_token(std::string token) { bearer_ = std::move(token); }

  const std::string& host() const { return host_; }
  int port() const { return port_; }

 private:
  std::string host_;
  int port_ = 0;
  double timeout_s_;
  std::string bearer_;
};

}  // namespace fp4moe::server
