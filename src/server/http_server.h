// The HTTP front end (cpp-httplib): SGLang-native and OpenAI-compatible endpoints over one
// engine::Engine. HTTP threads only parse, tokenize, render chat templates, submit and stream back;
// the engine's inference thread does all model work (../shared/HOUSE_STYLE.md).
//
//   POST /generate                 SGLang: text | input_ids, sampling_params, stream, return_logprob
//   POST /v1/completions           OpenAI (SSE with stream, usage with stream_options.include_usage,
//                                  n choices as n engine requests admitted all or none)
//   POST /v1/chat/completions      OpenAI chat (the model's chat template)
//   GET  /v1/models                the served model
//   GET  /health                   503 while loading or shutting down, 200 when ready
//   GET  /health_generate          200 when the engine makes progress (a 1-token probe when idle)
//   GET  /metrics                  Prometheus text (metrics.h)
//   GET  /get_server_info          launch arguments + live state
//   POST /v1/tokenize, /v1/detokenize   SGLang shapes
// Errors are {"error": {"message", "type", "code", "param", ...numbers}}: 400 bad JSON / field,
// 413 prompt longer than the context (both lengths), 503 + Retry-After when the waiting queue is full
// or the model is still loading, 500 only for bugs. A client that goes away aborts its requests (their
// KV is freed at the engine's next step): streaming ones at the next failed event write, non-streaming
// ones within ~0.3 s (their reply waits in a chunked provider that probes the connection with
// leading spaces every 150 ms; see docs/server.md).
//
// Lifecycle: bind() (the socket opens first, so /health answers 503 during load), start(),
// set_engine() once the model is loaded, shutdown(drain) on SIGTERM.
// Tested end to end by tests/server/test_server_e2e.cpp and test_server_load.cpp (the real binary).
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "engine/chat_template.h"
#include "engine/engine.h"
#include "server/metrics.h"
#include "server/protocol.h"

namespace httplib {
class Server;
struct Request;
struct Response;
}

namespace fp4moe::server {

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 30000;
  int n_http_threads = 128;     // kept; one per open connection (streams hold theirs)
  int max_http_threads = 2048;  // grown to while connections wait; beyond, they queue
  std::string served_model_name = "default";
  nlohmann::json launch_args = nlohmann::json::object();  // reported by /get_server_info
  std::string version = "unknown";                        // the build's (GET /version, /get_server_info)
  double health_probe_timeout_s = 20.0;
  int retry_after_s = 1;             // Retry-After of 503 replies
  // Non-empty: every route but /health, /health_generate and /metrics (probes and scrapers, as SGLang
  // exempts them) wants `Authorization: Bearer <api_key>`; otherwise a 401 naming the header.
  std::string api_key;
  // --reasoning-parser: chat replies split into reasoning_content and content (null: not split).
  const ReasoningFormat* reasoning = nullptr;
  // --tool-call-parser: chat requests may send tools; the reply's calls become tool_calls.
  const ToolCallFormat* tool_calls = nullptr;
  // Structured outputs (regex / json_schema / response_format): the JSON whitespace pattern and the
  // compiled-constraint cache size (engine/constraint.h).
  engine::ConstraintOptions constraints;
  // What an OpenAI request's omitted sampling fields take (parse_request): the model's generation_config.json under
  // --sampling-defaults model (engine::sampling_defaults_from), else the API's own.
  engine::SamplingParams sampling_defaults;
  // SGLang's --log-requests / --log-requests-level: a stderr line per generation request when it ends, of this
  // level (0-3, server/request_log.h); -1: none.
  int log_requests_level = -1;
};

class HttpServer {
 public:
  explicit HttpServer(ServerOptions options);
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  // Opens the listening socket; fails naming host:port (e.g. when the port is taken).
  void bind();
  int port() const { return port_; }
  // Serves on a background thread; until set_engine() every model endpoint answers 503.
  void start();
  // Hands over the started engine and the model's chat template (null: chat requests get 400).
  void set_engine(std::shared_ptr<engine::Engine> engine, std::shared_ptr<const engine::ChatTemplate> chat_template);
  // Stops taking requests (503 from now on); with drain lets the engine finish its running and queued requests for
  // at most timeout_s, then aborts what is left (those replies end with finish_reason abort), waits a few seconds
  // for the open replies to end, closes the listener and joins its thread.
  void shutdown(bool drain, double timeout_s);
  bool is_shutting_down() const { return shutting_down_.load(); }

 private:
  struct Route;
  void install_routes();
  void stop_listener();  // stops and joins the listener thread (once it runs)
  std::shared_ptr<engine::Engine> engine_or_503() const;
  void count_error(int status);
  // An error reply: counted by status, Retry-After when it has one, the typed JSON body.
  void reply_error(const ApiError& e, httplib::Response& res);
  // The same, answered before the request's body is read (pre-routing): the connection is closed after the reply, so
  // that the unread body is not taken for the next request (httplib closes a connection only when its request asked
  // to: the body goes through a provider that ends it).
  void reply_error_and_close(const ApiError& e, httplib::Response& res);
  // No handler for req.method on req.path: 405 with Allow when the path has other methods, else 404.
  ApiError unrouted(const httplib::Request& req, httplib::Response& res) const;
  // The engine requests behind each open reply, by the id it carries ("cmpl-7", "chatcmpl-7", SGLang's
  // rid "7"; a /generate batch: each choice's own), for POST /abort_request; registered once all of a
  // request's choices are admitted and removed when its reply ends.
  using RidNames = std::vector<std::pair<std::string, std::vector<engine::RequestId>>>;
  bool register_rids(const RidNames& names);  // all or none; false: one is open already
  void unregister_rids(const RidNames& names);
  // --log-requests: the line of a generation request whose reply ended (server/request_log.h); none without it.
  void log_request(bool finished, const ResponseContext& ctx, const std::vector<Accumulated>& accs) const noexcept;

  ServerOptions options_;
  std::unique_ptr<httplib::Server> http_;
  static constexpr size_t kMaxBodyBytes = size_t{64} << 20;        // a request body's limit (413 past it)
  static constexpr size_t kKeepAliveMaxRequests = 100000;          // requests a keep-alive connection may carry
  std::map<std::string, std::vector<std::string>> route_methods_;  // path -> methods; set up by install_routes
  std::thread listener_;
  std::atomic<bool> listener_done_{false};
  int port_ = -1;
  int listen_fd_ = -1;
  std::atomic<bool> shutting_down_{false};

  // Hands the engine's per-request events to the HTTP threads off the inference thread (see the .cpp).
  std::shared_ptr<class OutputDispatcher> dispatcher_;

  mutable std::mutex mu_;
  std::shared_ptr<engine::Engine> engine_;
  std::shared_ptr<const engine::ChatTemplate> chat_template_;
  std::shared_ptr<engine::ConstraintCompiler> constraints_;  // over the engine's tokenizer (set_engine)
  engine::SamplingParams sampling_defaults_;                 // set_engine's
  HttpCounters counters_;
  std::map<std::string, std::vector<engine::RequestId>> rids_;  // under mu_

  // Open request handlers and streams (drained before the listener closes).
  std::mutex active_mu_;
  std::condition_variable active_cv_;
  int64_t n_active_ = 0;
  friend struct ActiveGuard;
  friend class RequestHandler;
};

}  // namespace fp4moe::server
