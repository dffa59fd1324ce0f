// HttpClient: see http_client.h.
#include "server/http_client.h"

#include <httplib.h>

#include <chrono>
#include <cmath>
#include <sstream>

#include "core/error.h"

namespace fp4moe::server {
namespace {

void parse_url(const std::string& url, std::string* host, int* port) {
  std::string rest = url;
  const std::string scheme = "http://";
  if (rest.rfind(scheme, 0) == 0) rest = rest.substr(scheme.size());
  FP4MOE_CHECK(rest.find("://") == std::string::npos) << "URL \"" << url << "\": only http:// is supported";
  while (!rest.empty() && rest.back() == '/') rest.pop_back();
  FP4MOE_CHECK(rest.find('/') == std::string::npos) << "URL \"" << url << "\" has a path; give http://host:port";
  const auto colon = rest.rfind(':');
  if (colon == std::string::npos) {
    *host = rest;
    *port = 80;
  } else {
    *host = rest.substr(0, colon);
    const std::string p = rest.substr(colon + 1);
    size_t used = 0;
    int v = -1;
    try {
      v = std::stoi(p, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    FP4MOE_CHECK(used == p.size() && v > 0 && v < 65536) << "URL \"" << url << "\": port \"" << p << "\" is not 1..65535";
    *port = v;
  }
  FP4MOE_CHECK(!host->empty()) << "URL \"" << url << "\" has no host";
}

void configure(httplib::Client& c, double timeout_s, const std::string& bearer) {
  if (!bearer.empty()) c.set_bearer_token_auth(bearer);
  const auto sec = static_cast<time_t>(std::floor(timeout_s));
  const auto usec = static_cast<time_t>((timeout_s - static_cast<double>(sec)) * 1e6);
  c.set_connection_timeout(sec, usec);
  c.set_read_timeout(sec, usec);
  c.set_write_timeout(sec, usec);
  c.set_keep_alive(false);
}

// A transport failure in words: where, and what probably happened (httplib's own names are one word:
// "Connection", "Read").
std::string transport_error(httplib::Error e, const std::string& host, int port, double timeout_s) {
  const std::string at = host + ":" + std::to_string(port);
  std::ostringstream t;
  t << timeout_s;
  switch (e) {
    case httplib::Error::Connection:
      return "could not connect to " + at +
             " (connection refused, or the host is unknown or unreachable: is the "
             "server running there?)";
    case httplib::Error::ConnectionTimeout:
      return "connecting to " + at + " timed out after " + t.str() + " s";
    case httplib::Error::Read:
      return "no reply from " + at + " within " + t.str() + " s, or the server closed the connection";
    case httplib::Error::Write:
      return "sending the request to " + at + " failed (the server closed the connection)";
    default:
      return "HTTP transport error talking to " + at + ": " + httplib::to_string(e);
  }
}

HttpResponse from_result(httplib::Result& r, const std::string& host, int port, double timeout_s) {
  HttpResponse out;
  if (!r) {
    out.error = transport_error(r.error(), host, port, timeout_s);
    return out;
  }
  out.status = r->status;
  out.body = r->body;
  for (const auto& [k, v] : r->headers) out.headers.emplace(k, v);
  return out;
}

}  // namespace

std::string HttpResponse::header(const std::string& key) const {
  for (const auto& [k, v] : headers) {
    if (k.size() == key.size() && strcasecmp(k.c_str(), key.c_str()) == 0) return v;
  }
  return "";
}

HttpClient::HttpClient(const std::string& url, double timeout_s) : timeout_s_(timeout_s) {
  FP4MOE_CHECK(timeout_s > 0) << "HTTP client timeout " << timeout_s << " s must be positive";
  parse_url(url, &host_, &port_);
}

HttpClient::~HttpClient() = default;

HttpResponse HttpClient::get(const std::string& path) {
  httplib::Client c(host_, port_);
  configure(c, timeout_s_, bearer_);
  auto r = c.Get(path);
  return from_result(r, host_, port_, timeout_s_);
}

HttpResponse HttpClient::post(const std::string& path, const std::string& body, const std::string& content_type) {
  httplib::Client c(host_, port_);
  configure(c, timeout_s_, bearer_);
  auto r = c.Post(path, body, content_type);
  return from_result(r, host_, port_, timeout_s_);
}

HttpResponse HttpClient::post_sse(const std::string& path, const std::string& body,
                                  const std::function<bool(std::string_view)>& on_data) {
  httplib::Client c(host_, port_);
  configure(c, timeout_s_, bearer_);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s_);
  HttpResponse out;
  std::string pending;  // bytes of an event not yet terminated by a blank line
  bool stopped = false;
  httplib::Request req;
  req.method = "POST";
  req.path = path;
  req.body = body;
  req.set_header("Content-Type", "application/json");
  req.set_header("Accept", "text/event-stream");
  req.response_handler = [&](const httplib::Response& res) {
    out.status = res.status;
    for (const auto& [k, v] : res.headers) out.headers.emplace(k, v);
    return true;
  };
  req.content_receiver = [&](const char* data, size_t n, uint64_t, uint64_t) {
    if (std::chrono::steady_clock::now() > deadline) {
      out.error = "timed out after " + std::to_string(timeout_s_) + " s";
      return false;
    }
    if (out.status != 200) {
      out.body.append(data, n);
      return true;
    }
    pending.append(data, n);
    // Events end with a blank line; each `data:` line of an event is one payload here.
    size_t start = 0;
    for (;;) {
      const size_t end = pending.find("\n\n", start);
      if (end == std::string::npos) break;
      std::string_view event(pending.data() + start, end - start);
      start = end + 2;
      size_t line_start = 0;
      while (line_start <= event.size()) {
        size_t line_end = event.find('\n', line_start);
        if (line_end == std::string_view::npos) line_end = event.size();
        std::string_view line = event.substr(line_start, line_end - line_start);
        if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
        if (line.rfind("data:", 0) == 0) {
          line.remove_prefix(5);
          if (!line.empty() && line.front() == ' ') line.remove_prefix(1);
          if (!on_data(line)) {
            stopped = true;
            return false;
          }
        }
        line_start = line_end + 1;
      }
    }
    pending.erase(0, start);
    return true;
  };
  httplib::Response res;
  httplib::Error err = httplib::Error::Success;
  const bool ok = c.send(req, res, err);
  if (!ok && !stopped) {
    if (out.error.empty()) out.error = transport_error(err, host_, port_, timeout_s_);
    if (out.status == 200 || out.status == -1) out.status = -1;
  }
  if (stopped) out.status = -1, out.error = "closed by the client";
  return out;
}

}  // namespace fp4moe::server
