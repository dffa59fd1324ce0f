// HttpServer: routes, request flow and SSE streaming; see http_server.h.
#include "server/http_server.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <httplib.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <chrono>
#include <cstring>
#include <deque>
#include <limits>
#include <memory>
#include <regex>
#include <sstream>
#include <string_view>
#include <thread>
#include <utility>

#include "core/error.h"
#include "server/batch_log.h"
#include "server/elastic_pool.h"
#include "server/protocol.h"
#include "server/request_log.h"

namespace fp4moe::server {
namespace {

using nlohmann::json;

// A streamed chunk worth sending: its choice has text / a delta, logprobs or a finish_reason. Text a parser or a
// stop string holds back leaves an empty one, which is not sent (a forced tool call sent ~130 of them).
bool carries_something(const json& chunk, const char* payload) {
  const json& c = chunk["choices"][0];
  const json& p = c[payload];
  const bool has_payload = p.is_string() ? !p.get<std::string>().empty() : !p.empty();
  return has_payload || !c["logprobs"].is_null() || !c["finish_reason"].is_null();
}

// Whether a registered route serves `path`: the same text, or for a pattern route ("/v1/models/(.+)") a regex match,
// as httplib matches them.
bool route_matches(const std::string& route, const std::string& path) {
  return route == path || (route.find('(') != std::string::npos && std::regex_match(path, std::regex(route)));
}

constexpr int kListenBacklog = 1024;  // pending connections (httplib's own is 5)
// Non-streaming replies: how often the waiting provider probes its connection with a space.
constexpr std::chrono::milliseconds kLivenessInterval(150);
// Not httplib's exact "application/json", which it would gzip for clients that accept it.
constexpr const char* kJsonContentType = "application/json; charset=utf-8";

// Engine events of one request, handed from the inference thread to the HTTP thread.
class Channel {
 public:
  void push(const engine::RequestOutput& out) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      events_.push_back(out);
    }
    cv_.notify_one();
  }
  // Waits up to `wait` for the next event.
  std::optional<engine::RequestOutput> pop(std::chrono::milliseconds wait) {
    std::unique_lock<std::mutex> lock(mu_);
    if (!cv_.wait_for(lock, wait, [&] { return !events_.empty(); })) return std::nullopt;
    engine::RequestOutput out = std::move(events_.front());
    events_.pop_front();
    return out;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<engine::RequestOutput> events_;
};

// A socket address's port (-1 for another family).
int port_of(const sockaddr_storage& a) {
  if (a.ss_family == AF_INET) return ntohs(reinterpret_cast<const sockaddr_in*>(&a)->sin_port);
  if (a.ss_family == AF_INET6) return ntohs(reinterpret_cast<const sockaddr_in6*>(&a)->sin6_port);
  return -1;
}

// Calls visit(fd) for each of this process's sockets bound locally to `port` (its open descriptors, from
// /proc/self/fd), until visit returns false.
template <class Visit>
void for_each_socket_on_port(int port, Visit&& visit) {
  DIR* dir = ::opendir("/proc/self/fd");
  if (dir == nullptr) return;
  while (const dirent* e = ::readdir(dir)) {
    char* end = nullptr;
    const long fd = std::strtol(e->d_name, &end, 10);
    if (end == e->d_name || *end != '\0' || fd == ::dirfd(dir)) continue;
    sockaddr_storage local{};
    socklen_t len = sizeof(local);
    if (::getsockname(static_cast<int>(fd), reinterpret_cast<sockaddr*>(&local), &len) != 0) continue;  // no socket
    if (port_of(local) == port && !visit(static_cast<int>(fd))) break;
  }
  ::closedir(dir);
}

// The accepted socket of one HTTP request, found by its addresses (httplib 0.11 gives a handler no view of its
// connection): lets a non-streaming reply see its client go without writing to it. Its descriptor is recognised
// again by the peer address on every look, so a descriptor the OS handed to another connection is not mistaken for
// it.
class PeerProbe {
 public:
  PeerProbe(const std::string& remote_addr, int remote_port, int local_port) {
    if (remote_port <= 0 || local_port <= 0) return;
    for_each_socket_on_port(local_port, [&](int fd) {
      sockaddr_storage peer{};
      socklen_t peer_len = sizeof(peer);
      if (::getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &peer_len) != 0) return true;
      if (port_of(peer) != remote_port || address_of(peer) != remote_addr) return true;
      fd_ = fd;
      peer_ = peer;
      peer_len_ = peer_len;
      return false;
    });
  }
  bool found() const { return fd_ >= 0; }
  // True when the client has closed (or reset) the connection: its end of the stream is readable as such.
  bool peer_gone() const {
    if (fd_ < 0) return false;
    sockaddr_storage peer{};
    socklen_t len = sizeof(peer);
    if (::getpeername(fd_, reinterpret_cast<sockaddr*>(&peer), &len) != 0) return true;  // no longer connected
    if (len != peer_len_ || std::memcmp(&peer, &peer_, len) != 0) return false;          // another connection now
    pollfd p{fd_, POLLRDHUP, 0};
    return ::poll(&p, 1, 0) == 1 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR)) != 0;
  }

 private:
  static std::string address_of(const sockaddr_storage& a) {
    char buf[INET6_ADDRSTRLEN] = {};
    if (a.ss_family == AF_INET)
      ::inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(&a)->sin_addr, buf, sizeof buf);
    if (a.ss_family == AF_INET6)
      ::inet_ntop(AF_INET6, &reinterpret_cast<const sockaddr_in6*>(&a)->sin6_addr, buf, sizeof buf);
    return buf;
  }
  int fd_ = -1;
  sockaddr_storage peer_{};
  socklen_t peer_len_ = 0;
};

// The choices of one HTTP request (OpenAI `n`): choice i is engine request ids[i]; its events, told
// apart by id, accumulate in accs[i]. With `echo`, echo[i] is choice i's prompt text. A choice that asked for no
// tokens (max_new_tokens 0: the prompt's logprobs alone) runs as one token, which drop_generated takes out.
struct Choices {
  std::vector<engine::RequestId> ids;
  std::vector<Accumulated> accs;
  std::vector<std::string> echo;
  std::vector<bool> generates_nothing;
  std::vector<bool> started;
  Choices() = default;
  Choices(std::vector<engine::RequestId> request_ids, std::vector<std::string> echo_texts, std::vector<bool> no_tokens)
      : ids(std::move(request_ids)),
        accs(ids.size()),
        echo(std::move(echo_texts)),
        generates_nothing(std::move(no_tokens)),
        started(ids.size(), false) {}
  // Adds an event to its choice (a choice's first event gets the echo in front: apply_echo) and returns
  // the choice's index (-1, dropped: not one of these requests, which the channel per HTTP request
  // rules out).
  int64_t add(const ParsedRequest& req, engine::RequestOutput& out) {
    const auto it = std::find(ids.begin(), ids.end(), out.id);
    if (it == ids.end()) return -1;
    const auto i = static_cast<size_t>(it - ids.begin());
    if (i < generates_nothing.size() && generates_nothing[i]) drop_generated(out);
    if (!started[i] && i < echo.size()) apply_echo(req, echo[i], out);
    started[i] = true;
    accs[i].add(out);
    return static_cast<int64_t>(i);
  }
  bool all_finished() const {
    return std::all_of(accs.begin(), accs.end(), [](const Accumulated& a) { return a.finish.has_value(); });
  }
  const Accumulated* failed() const {
    for (const Accumulated& a : accs) {
      if (a.finish && a.finish->reason == engine::FinishReason::kError) return &a;
    }
    return nullptr;
  }
  void abort_unfinished(engine::Engine& engine) const {
    for (size_t i = 0; i < ids.size(); ++i) {
      if (!accs[i].finish) engine.abort(ids[i]);
    }
  }
};

}  // namespace

// Delivers engine events to their requests' channels on its own thread. The engine's output
// callbacks run on the inference thread, and a channel push wakes the HTTP thread waiting on it (a
// futex syscall each): at a few hundred streaming requests that is a sizeable share of a GPU decode
// step spent outside the forward. The callbacks only append to this one queue (the dispatcher is
// woken when the queue was empty), and this thread does the per-request pushes and wake-ups while
// the engine runs its next step. One FIFO: each request's events keep their order.
class OutputDispatcher {
 public:
  OutputDispatcher() : thread_([this] { run(); }) {}
  ~OutputDispatcher() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_one();
    thread_.join();  // delivers what is queued first
  }
  OutputDispatcher(const OutputDispatcher&) = delete;
  OutputDispatcher& operator=(const OutputDispatcher&) = delete;

  void post(std::shared_ptr<Channel> channel, const engine::RequestOutput& out) {
    bool wake = false;
    {
      std::lock_guard<std::mutex> lock(mu_);
      wake = queue_.empty();
      queue_.emplace_back(std::move(channel), out);
    }
    if (wake) cv_.notify_one();
  }

 private:
  void run() {
    std::deque<std::pair<std::shared_ptr<Channel>, engine::RequestOutput>> batch;
    for (;;) {
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
        if (queue_.empty()) return;  // stop_ and nothing left
        batch.swap(queue_);
      }
      for (auto& [channel, out] : batch) channel->push(out);
      batch.clear();
    }
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::pair<std::shared_ptr<Channel>, engine::RequestOutput>> queue_;
  bool stop_ = false;
  std::thread thread_;
};

namespace {

ApiError unavailable(const std::string& message, int retry_after_s) {
  ApiError e;
  e.status = 503;
  e.type = "unavailable_error";
  e.message = message;
  e.retry_after_s = retry_after_s;
  return e;
}

// A typed 500: only bugs get one (a request that failed in the engine after admission, a reply that
// could not be built, a handler that threw something other than ApiError).
ApiError internal_error(std::string message) {
  ApiError e;
  e.status = 500;
  e.type = "internal_server_error";
  e.message = std::move(message);
  return e;
}
ApiError engine_failure(const std::string& request_id, const std::string& error) {
  return internal_error("request " + request_id + " failed in the engine: " + error);
}

// The API's name of a SamplingParams field: SGLang's /generate nests them under sampling_params; the OpenAI
// routes name the token budgets max_tokens / min_tokens. The logprob counts are top-level fields of each
// API's own name; prompt_logprobs has none (""): it follows from echo / logprob_start_len.
std::string api_field(Endpoint endpoint, const std::string& field) {
  if (field == "prompt_logprobs") return "";
  if (field == "top_logprobs") {
    return endpoint == Endpoint::kGenerate      ? "top_logprobs_num"
           : endpoint == Endpoint::kCompletions ? "logprobs"
                                                : "top_logprobs";
  }
  if (endpoint == Endpoint::kGenerate) return "sampling_params." + field;
  if (field == "max_new_tokens") return "max_tokens";
  if (field == "min_new_tokens") return "min_tokens";
  return field;
}

ApiError from_rejection(const engine::Rejection& r, int retry_after_s, Endpoint endpoint) {
  ApiError e;
  switch (r.kind) {
    case engine::RejectKind::kQueueFull:
      e = unavailable(r.message, retry_after_s);
      e.type = "overloaded_error";
      break;
    case engine::RejectKind::kShuttingDown:
      e = unavailable(r.message, retry_after_s);
      break;
    case engine::RejectKind::kTooLong:
      e = bad_request(api_field(endpoint, "max_new_tokens"), r.message);
      e.type = "context_length_exceeded";
      break;
    case engine::RejectKind::kBadParam: {
      // The message starts with the engine's name of the field: the API's instead.
      const std::string param = r.field.empty() ? std::string() : api_field(endpoint, r.field);
      std::string message = r.message;
      if (!param.empty() && message.rfind(r.field, 0) == 0) message = param + message.substr(r.field.size());
      e = bad_request(param, message);
      break;
    }
  }
  return e;
}

std::string sse(const json& j) { return "data: " + dump_json(j) + "\n\n"; }

int64_t unix_now() {
  return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
}

const char* endpoint_prefix(Endpoint e) {
  switch (e) {
    case Endpoint::kGenerate: return "";
    case Endpoint::kCompletions: return "cmpl-";
    case Endpoint::kChat: return "chatcmpl-";
  }
  return "";
}

}  // namespace

// Counts an open handler or stream for the drain on shutdown.
struct ActiveGuard {
  explicit ActiveGuard(HttpServer* s) : s_(s) {
    std::lock_guard<std::mutex> lock(s_->active_mu_);
    ++s_->n_active_;
  }
  ~ActiveGuard() {
    {
      std::lock_guard<std::mutex> lock(s_->active_mu_);
      --s_->n_active_;
    }
    s_->active_cv_.notify_all();
  }
  HttpServer* s_;
};

// One generation request from parse to the last byte.
class RequestHandler {
 public:
  RequestHandler(HttpServer* server, Endpoint endpoint) : server_(server), endpoint_(endpoint) {}

  void handle(const httplib::Request& http_req, httplib::Response& res) {
    http10_ = http_req.version == "HTTP/1.0";
    auto engine = server_->engine_or_503();
    ParsedRequest req = parse_request(endpoint_, parse_body(http_req.body), server_->options_.sampling_defaults);
    restore_key_order(req, http_req.body);
    if (endpoint_ == Endpoint::kChat && req.separate_reasoning.value_or(true))
      req.reasoning = server_->options_.reasoning;
    if (!req.tools.is_null()) {
      if (endpoint_ != Endpoint::kChat) throw bad_request("tools", "tools are for /v1/chat/completions");
      if (server_->options_.tool_calls == nullptr)
        throw bad_request("tools",
                          "tools (function calling) need a tool-call parser: start the server with "
                          "--tool-call-parser " +
                              tool_call_format_names());
      if (req.tool_choice != "none") req.tool_calls = server_->options_.tool_calls;
      if (req.tool_choice == "required" || req.tool_choice == "function") {
        if (req.constraint)
          throw bad_request("tool_choice", "tool_choice \"" + req.tool_choice +
                                               "\" forces a call; it cannot be combined with " + req.constraint->param);
        engine::ConstraintSpec c;
        c.kind = engine::ConstraintSpec::Kind::kRegex;
        c.param = "tool_choice";
        try {
          c.text = forced_tool_call_regex(*server_->options_.tool_calls, req.tools, req.tool_choice_name,
                                          /*one_call=*/!req.parallel_tool_calls);
        } catch (const fp4moe::Error& e) {
          throw bad_request("tool_choice", std::string("tool_choice: ") + e.what());
        }
        req.constraint = std::move(c);
      }
    }
    // The structured-output constraint of the request (or of each prompt: a /generate list of sampling_params).
    auto compile_constraint = [&](const std::optional<engine::ConstraintSpec>& spec, engine::SamplingParams& sampling) {
      if (!spec) return;
      std::shared_ptr<engine::ConstraintCompiler> compiler;
      {
        std::lock_guard<std::mutex> lock(server_->mu_);
        compiler = server_->constraints_;
      }
      try {
        sampling.constraint = compiler->compile(*spec);
      } catch (const fp4moe::Error& e) {
        const std::string what = e.what(), param = spec->param;
        throw bad_request(param, what.rfind(param + ": ", 0) == 0 ? what : param + ": " + what);
      }
      // A reasoning model thinks first, unconstrained; the constraint applies to what follows (SGLang's
      // reasoning-aware grammars).
      if (req.reasoning != nullptr)
        sampling.constraint_after_reasoning = engine::SamplingParams::ReasoningSpan{
            std::string(req.reasoning->start), std::string(req.reasoning->end), req.reasoning->forced};
    };
    compile_constraint(req.constraint, req.sampling);
    for (ParsedRequest::PromptSampling& ps : req.per_prompt) compile_constraint(ps.constraint, ps.sampling);
    const engine::Tokenizer& tok = engine->tokenizer();
    if (req.priority.value_or(0) != 0 && engine->options().schedule_policy != engine::SchedulePolicy::kPriority) {
      throw bad_request("priority", "priority = " + std::to_string(*req.priority) +
                                        " needs priority scheduling (--enable-priority-scheduling, or "
                                        "--schedule-policy priority; this server runs " +
                                        engine::to_string(engine->options().schedule_policy) + ")");
    }

    // The prompts (one, or a completions batch) as token ids, each with the field that names it.
    std::vector<std::vector<engine::TokenId>> prompts;
    std::vector<std::string> fields;
    std::vector<bool> sent_as_ids;  // prompt p's ids were sent (else the tokenizer's encoding of its text)
    auto encode_text = [&](const std::string& text) {
      return tok.encode(text, {.add_special_tokens = true, .parse_special = true});
    };
    // A batch's prompts: prompt[i] (completions), text[i] / input_ids[i] (/generate); its errors' param is the list's.
    const std::string batch_param = server::batch_param(req);
    if (!req.batch.empty()) {
      for (size_t i = 0; i < req.batch.size(); ++i) {
        const ParsedRequest::BatchPrompt& bp = req.batch[i];
        prompts.push_back(bp.input_ids ? *bp.input_ids : encode_text(*bp.text));
        sent_as_ids.push_back(bp.input_ids.has_value());
        fields.push_back(batch_param + "[" + std::to_string(i) + "]");
      }
    } else if (req.input_ids) {
      prompts.push_back(*req.input_ids);
      sent_as_ids.push_back(true);
      fields.push_back(endpoint_ == Endpoint::kGenerate ? "input_ids" : "prompt");
    } else if (req.text) {
      prompts.push_back(encode_text(*req.text));
      sent_as_ids.push_back(false);
      fields.push_back(endpoint_ == Endpoint::kGenerate ? "text" : "prompt");
    } else {
      std::shared_ptr<const engine::ChatTemplate> tmpl;
      {
        std::lock_guard<std::mutex> lock(server_->mu_);
        tmpl = server_->chat_template_;
      }
      if (!tmpl) throw bad_request("messages", "the served model has no chat template; use /v1/completions");
      const std::string rendered = render_chat(*tmpl, req);
      prompts.push_back(tok.encode(rendered, {.add_special_tokens = false, .parse_special = true}));
      sent_as_ids.push_back(false);
      fields.push_back("messages");
      if (req.reasoning != nullptr) {
        // The template may have opened the block (GLM-4.7 / GLM-5: the reply starts inside it) or closed an empty
        // one (enable_thinking false: all answer); the parser and a constraint's reasoning span start there.
        req.reasoning_start = reasoning_start_of_prompt(*req.reasoning, rendered);
        if (req.sampling.constraint_after_reasoning) {
          if (req.reasoning_start == ReasoningStart::kAnswer) req.sampling.constraint_after_reasoning.reset();
          if (req.reasoning_start == ReasoningStart::kInside)
            req.sampling.constraint_after_reasoning->starts_inside = true;
        }
      }
    }
    // The parsers' tags where the tokenizer marks them special: the reply's text keeps them (the parsers read it).
    if (req.reasoning != nullptr || req.tool_calls != nullptr) {
      for (const std::string_view tag : {req.reasoning ? req.reasoning->start : std::string_view(),
                                         req.reasoning ? req.reasoning->end : std::string_view(),
                                         req.tool_calls ? req.tool_calls->start : std::string_view(),
                                         req.tool_calls ? req.tool_calls->end : std::string_view()}) {
        if (tag.empty()) continue;
        const std::optional<engine::TokenId> id = tok.token_to_id(tag);
        if (id && tok.is_special(*id)) req.sampling.keep_special_ids.push_back(*id);
      }
    }
    const int64_t vocab = engine->model_config().vocab_size;
    const int64_t context = engine->context_length();
    const int64_t kv = engine->kv_capacity_tokens();
    int64_t prompt_tokens = 0;
    for (size_t p = 0; p < prompts.size(); ++p) {
      const std::vector<engine::TokenId>& prompt = prompts[p];
      const std::string& field = fields[p];
      // A batch's field param is the list's; the message says which.
      const std::string param = req.batch.empty() ? field : batch_param;
      if (prompt.empty()) throw bad_request(param, field + " gives an empty prompt (0 tokens)");
      for (size_t i = 0; i < prompt.size(); ++i) {
        if (prompt[i] < vocab) continue;
        if (sent_as_ids[p]) {
          throw bad_request(param, field + "[" + std::to_string(i) + "] = " + std::to_string(prompt[i]) +
                                       " is outside the model's vocabulary of " + std::to_string(vocab));
        }
        // A text's encoding: a tokenizer with more tokens than the model has embeddings.
        throw bad_request(param,
                          field + (endpoint_ == Endpoint::kChat ? " (as the chat template renders it)" : "") +
                              " encodes to token " + std::to_string(prompt[i]) + " (" +
                              json(tok.decode(std::vector<engine::TokenId>{prompt[i]}, {.skip_special_tokens = false}))
                                  .dump(-1, ' ', false, json::error_handler_t::replace) +
                              ") at position " + std::to_string(i) + ", outside the model's vocabulary of " +
                              std::to_string(vocab) + " (the tokenizer has " + std::to_string(tok.vocab_size()) + ")");
      }
      const int64_t n_prompt = static_cast<int64_t>(prompt.size());
      if (n_prompt >= context || n_prompt >= kv) {
        ApiError e;
        e.status = 400;  // as OpenAI, vLLM and SGLang answer it (the openai SDK's BadRequestError)
        e.type = "context_length_exceeded";
        e.param = param;
        const bool ctx_bound = n_prompt >= context;
        e.message = (req.batch.empty() ? std::string("the prompt") : field) + " has " + std::to_string(n_prompt) +
                    " tokens; the " +
                    (ctx_bound ? "context holds " + std::to_string(context) : "KV cache holds " + std::to_string(kv)) +
                    " tokens, leaving no room for output";
        e.extra = {{"prompt_tokens", n_prompt}, {"context_length", context}, {"kv_capacity_tokens", kv}};
        throw e;
      }
      prompt_tokens += n_prompt;
    }

    // One engine request per prompt and choice (n), all or none admitted; their events share one channel
    // and are told apart by request id. Choice p n + j: prompt p, seed + j (a prompt of a batch draws what
    // it would alone).
    auto channel = std::make_shared<Channel>();
    const std::string max_field = api_field(endpoint_, "max_new_tokens");
    std::vector<std::string> echo;  // choice i's prompt text (`echo`): as sent, or the ids decoded
    for (size_t p = 0; p < prompts.size() && req.echo; ++p) {
      const std::optional<std::string>& sent = req.batch.empty() ? req.text : req.batch[p].text;
      const std::string text =
          sent ? *sent : tok.decode(prompts[p], {.skip_special_tokens = req.sampling.skip_special_tokens});
      for (int64_t j = 0; j < req.n; ++j) echo.push_back(text);
    }
    // A per-prompt sampling field is named in its list entry (sampling_params[p].n), not as the shared one.
    const auto own_field = [&](std::string param, size_t p) {
      const std::string shared = "sampling_params.";
      if (!req.per_prompt.empty() && param.rfind(shared, 0) == 0)
        param = "sampling_params[" + std::to_string(p) + "]." + param.substr(shared.size());
      return param;
    };
    std::vector<engine::Engine::Submission> group;
    std::vector<bool> generates_nothing;  // choice i asked for max_new_tokens 0
    // No priority named: vLLM's 0, or (SGLang's) after every request that names one.
    const engine::EngineOptions& eo = engine->options();
    const int64_t absent_priority = !eo.absent_priority_last ? 0
                                    : eo.default_priority    ? *eo.default_priority
                                    : eo.priority_low_first  ? std::numeric_limits<int64_t>::max()
                                                             : std::numeric_limits<int64_t>::min();
    for (size_t p = 0; p < prompts.size(); ++p) {
      // The prompt's sampling: the request's, or its own (a /generate list of sampling_params).
      const ParsedRequest::PromptSampling* own = req.per_prompt.empty() ? nullptr : &req.per_prompt.at(p);
      const engine::SamplingParams& sampling = own ? own->sampling : req.sampling;
      const std::optional<int64_t>& max_sent = own ? own->max_new_tokens : req.max_new_tokens;
      const int64_t n_prompt = static_cast<int64_t>(prompts[p].size());
      const int64_t max_new = max_sent ? *max_sent : default_max_new_tokens(endpoint_, n_prompt, std::min(context, kv));
      if (sampling.min_new_tokens > max_new) {
        const std::string min_field = own_field(api_field(endpoint_, "min_new_tokens"), p);
        throw bad_request(min_field, min_field + " = " + std::to_string(sampling.min_new_tokens) + " > " +
                                         own_field(max_field, p) + " = " + std::to_string(max_new) +
                                         (max_sent ? std::string() : std::string(" (the default)")));
      }
      for (int64_t j = 0; j < req.n; ++j) {
        engine::SamplingParams sp = sampling;
        // No tokens asked (the prompt's logprobs alone): one is made, not output (nor a first-token latency).
        sp.max_new_tokens = std::max<int64_t>(max_new, 1);
        if (sp.seed) sp.seed = *sp.seed + static_cast<uint64_t>(j);
        engine::Request request{prompts[p], sp, req.priority.value_or(absent_priority)};
        request.count_output = max_new > 0;
        generates_nothing.push_back(max_new == 0);
        group.push_back(
            {std::move(request), [channel, dispatcher = server_->dispatcher_](const engine::RequestOutput& out) {
               dispatcher->post(channel, out);
             }});
      }
    }
    const int64_t n_choices = static_cast<int64_t>(prompts.size()) * req.n;
    // The ids the client named: its rid, or (a /generate batch) each choice's: rid[p] (rid[p]_{j} for prompt p's
    // sample j when n > 1) or "{rid}_{i}".
    std::vector<std::string> named;
    for (const std::string& rid : req.rid_list) {
      for (int64_t j = 0; j < req.n; ++j) named.push_back(req.n > 1 ? rid + "_" + std::to_string(j) : rid);
    }
    if (req.rid && !req.batch_reply) named.push_back(*req.rid);
    for (int64_t i = 0; req.rid && req.batch_reply && i < n_choices; ++i)
      named.push_back(*req.rid + "_" + std::to_string(i));
    {
      std::lock_guard<std::mutex> lock(server_->mu_);
      for (const std::string& rid : named) {
        if (server_->rids_.count(rid))
          throw bad_request("rid", "rid = \"" + rid + "\" names a request that is still open");
      }
    }
    if (n_choices > engine->options().max_queued_requests) {
      throw bad_request(req.n > 1           ? own_field(api_field(endpoint_, "n"), 0)
                        : req.batch.empty() ? fields.front()
                                            : batch_param,
                        std::to_string(prompts.size()) + " prompt(s) x n = " + std::to_string(req.n) + " = " +
                            std::to_string(n_choices) + " choices, admitted together, exceed the waiting queue's " +
                            std::to_string(engine->options().max_queued_requests) +
                            " (--max-queued-requests): the request could never be admitted");
    }
    // --log-requests: what the line will show, made before the choices are admitted (nothing may throw between
    // their admission and the registration that hands them to the reply).
    std::string log_route, log_body;
    const auto log_started = std::chrono::steady_clock::now();
    if (const int level = server_->options_.log_requests_level; level >= 0) {
      log_route = http_req.path;
      log_body = request_log_body(http_req.body, level);
    }
    // All the choices are admitted together or none is.
    engine::GroupSubmitResult sr = engine->submit_group(std::move(group));
    if (!sr.ok()) {
      ApiError e = from_rejection(*sr.rejection, server_->options_.retry_after_s, endpoint_);
      const size_t p = sr.rejected_index / static_cast<size_t>(req.n),
                   j = sr.rejected_index % static_cast<size_t>(req.n);
      if (const std::string own = own_field(e.param, p); own != e.param) {
        if (e.message.rfind(e.param, 0) == 0) e.message = own + e.message.substr(e.param.size());
        e.param = own;
      }
      // Which prompt and choice, where that tells something: not for a sampling field, which every choice shares.
      const bool shared_field = req.per_prompt.empty() && !sr.rejection->field.empty() &&
                                sr.rejection->field != "max_new_tokens" && sr.rejection->field != "min_new_tokens";
      if (sr.rejection->kind != engine::RejectKind::kQueueFull &&
          sr.rejection->kind != engine::RejectKind::kShuttingDown && !shared_field &&
          (prompts.size() > 1 || req.n > 1)) {
        e.message += " (" + (prompts.size() > 1 ? fields[p] + ", " : std::string()) + "choice " + std::to_string(j) +
                     " of n = " + std::to_string(req.n) + ")";
      }
      throw e;
    }
    std::vector<engine::RequestId> ids = std::move(sr.ids);

    ResponseContext ctx;
    ctx.id = req.rid ? *req.rid : endpoint_prefix(endpoint_) + std::to_string(ids.front());
    {
      std::lock_guard<std::mutex> lock(server_->mu_);
      ctx.model = server_->options_.served_model_name;
    }
    ctx.created = unix_now();
    ctx.prompt_tokens = prompt_tokens;
    ctx.log_route = std::move(log_route);
    ctx.log_body = std::move(log_body);
    ctx.log_started = log_started;
    ctx.tokenizer = &tok;
    for (size_t i = 0; i < ids.size(); ++i)
      ctx.choice_prompt_tokens.push_back(static_cast<int64_t>(prompts[i / static_cast<size_t>(req.n)].size()));
    HttpServer::RidNames rid_names;
    if (req.batch_reply) {
      for (size_t i = 0; i < ids.size(); ++i) {
        ctx.choice_ids.push_back(!named.empty() ? named[i] : std::to_string(ids[i]));
        rid_names.push_back({ctx.choice_ids.back(), {ids[i]}});
      }
      ctx.id = ctx.choice_ids.front();
    } else {
      rid_names.push_back({ctx.id, ids});
    }
    if (!server_->register_rids(rid_names)) {              // the replies' releasers unregister them
      for (engine::RequestId id : ids) engine->abort(id);  // the same rid sent twice at once
      throw bad_request("rid", "rid = \"" + (named.empty() ? ctx.id : named.front()) +
                                   "\" (or another of the request's) names a request that is still open");
    }

    Choices choices(std::move(ids), std::move(echo), std::move(generates_nothing));
    if (!req.stream) {
      auto probe = std::make_shared<const PeerProbe>(http_req.remote_addr, http_req.remote_port, http_req.local_port);
      respond_when_done(std::move(engine), channel, std::move(choices), std::move(req), std::move(ctx),
                        std::move(rid_names), std::move(probe), res);
      return;
    }
    stream(std::move(engine), channel, std::move(choices), std::move(req), std::move(ctx), std::move(rid_names), res);
  }

 private:
  // Non-streaming reply of an admitted request. httplib 0.11 gives a plain handler no view of its
  // connection, so the reply is a chunked content provider (run on this connection's thread after
  // the handler returns, status 200 and headers already sent) that waits for the request's end.
  // While it waits it looks at the connection's socket (PeerProbe) every kLivenessInterval, writing
  // nothing (so a client's read timeout runs as against SGLang): once the peer has closed, the provider
  // stops and the releaser aborts the request, which frees its KV at the engine's next step. Where the
  // socket is not found it writes one space instead (JSON allows leading whitespace), whose second
  // write after the peer closed fails. The body is the same JSON
  // object as before; a request that fails in the engine after admission (a bug) gets the typed
  // error object as its body, since the 200 is already on the wire. The content type carries a
  // charset so that httplib does not gzip the body (a compressor would hold back the probe bytes).
  void respond_when_done(std::shared_ptr<engine::Engine> engine, std::shared_ptr<Channel> channel, Choices choices,
                         ParsedRequest req, ResponseContext ctx, HttpServer::RidNames rid_names,
                         std::shared_ptr<const PeerProbe> probe, httplib::Response& res) {
    struct State {
      ParsedRequest req;
      ResponseContext ctx;
      HttpServer::RidNames rid_names;
      Choices choices;
      bool finished = false;
      std::chrono::steady_clock::time_point last_probe;  // the first probe waits one interval
      std::unique_ptr<ActiveGuard> active;
    };
    auto st = std::make_shared<State>();
    st->req = std::move(req);
    st->ctx = std::move(ctx);
    st->rid_names = std::move(rid_names);
    st->choices = std::move(choices);
    st->last_probe = std::chrono::steady_clock::now();
    st->active = std::make_unique<ActiveGuard>(server_);
    const Endpoint endpoint = endpoint_;
    res.status = 200;
    set_provider(
        res, kJsonContentType,
        [server = server_, engine, channel, st, endpoint, probe](size_t, httplib::DataSink& sink) -> bool {
          // Probe at least every kLivenessInterval, whether tokens are flowing or not: the socket's end-of-stream
          // (nothing is written, so a client's read timeout still runs), or where the socket was not found a space.
          const auto now = std::chrono::steady_clock::now();
          if (now - st->last_probe >= kLivenessInterval) {
            st->last_probe = now;
            if (probe->found() ? probe->peer_gone() : !sink.write(" ", 1)) return false;  // the peer has gone
          }
          auto ev = channel->pop(std::chrono::duration_cast<std::chrono::milliseconds>(
              st->last_probe + kLivenessInterval - std::chrono::steady_clock::now()));
          if (!ev || st->choices.add(st->req, *ev) < 0) return true;
          // One choice failed: the reply is the error, so its sibling choices stop now rather than run to the end.
          if (st->choices.failed() != nullptr) st->choices.abort_unfinished(*engine);
          if (!st->choices.all_finished()) return true;
          st->finished = true;
          // Free the rid before the client can see the reply end (a client reusing it at once was refused).
          server->unregister_rids(st->rid_names);
          std::string body;
          try {
            if (const Accumulated* failed = st->choices.failed()) {
              const ApiError e = engine_failure(st->ctx.id, failed->finish->error);
              body = dump_json(e.to_json());
              server->count_error(e.status);
            } else {
              const std::vector<Accumulated>& accs = st->choices.accs;
              body = dump_json(endpoint == Endpoint::kGenerate
                                   ? (st->req.batch_reply ? generate_batch_response(st->req, st->ctx, accs)
                                                          : generate_response(st->req, st->ctx, accs.front()))
                               : endpoint == Endpoint::kChat ? chat_response(st->req, st->ctx, accs)
                                                             : completion_response(st->req, st->ctx, accs));
            }
          } catch (const std::exception& ex) {
            const ApiError e = internal_error("bug: the reply to request " + st->ctx.id + " failed: " + ex.what());
            body = dump_json(e.to_json());
            server->count_error(e.status);
          }
          if (!sink.write(body.data(), body.size())) return false;
          sink.done();
          return true;
        },
        [server = server_, engine, st](bool) {
          if (!st->finished) st->choices.abort_unfinished(*engine);  // client gone or write failed: free slots and KV
          server->unregister_rids(st->rid_names);
          server->log_request(st->finished, st->ctx, st->choices.accs);
          st->active.reset();
        });
  }

  // SSE: `data: {json}\n\n` per engine event, `data: [DONE]\n\n` at the end. The provider is called
  // by httplib on this connection's thread after the handler returns; it waits for events and checks
  // the connection between them. Whatever ends the stream early, the releaser aborts the request.
  void stream(std::shared_ptr<engine::Engine> engine, std::shared_ptr<Channel> channel, Choices choices,
              ParsedRequest req, ResponseContext ctx, HttpServer::RidNames rid_names, httplib::Response& res) {
    struct State {
      ParsedRequest req;
      ResponseContext ctx;
      HttpServer::RidNames rid_names;
      Choices choices;          // /generate streams each choice's text and ids cumulatively, as SGLang does
      std::vector<bool> first;  // chat: no chunk of the choice sent yet
      std::vector<TextOffset> text_offsets;   // completions logprobs: where each choice's text_offset stands
      std::vector<ChatChoiceStream> parsers;  // chat with --reasoning-parser / tools: one per choice
      bool finished = false;
      std::unique_ptr<ActiveGuard> active;
    };
    auto st = std::make_shared<State>();
    st->req = std::move(req);
    st->ctx = std::move(ctx);
    st->rid_names = std::move(rid_names);
    st->first.assign(choices.ids.size(), true);
    st->text_offsets.assign(choices.ids.size(), TextOffset{});
    if (st->req.reasoning != nullptr || st->req.tool_calls != nullptr)
      st->parsers.assign(choices.ids.size(), ChatChoiceStream::for_request(st->req));
    st->choices = std::move(choices);
    st->active = std::make_unique<ActiveGuard>(server_);
    const Endpoint endpoint = endpoint_;
    res.status = 200;
    res.set_header("Cache-Control", "no-cache");
    set_provider(
        res, "text/event-stream",
        [server = server_, engine, channel, st, endpoint](size_t, httplib::DataSink& sink) -> bool {
          auto ev = channel->pop(std::chrono::milliseconds(200));
          if (!ev) {
            // Idle (queued, or between slow tokens). No SSE comment pings here: sglang.bench_serving
            // and vllm bench parse every non-empty line as JSON. A client gone while its request
            // waits is noticed at the first token write that fails.
            return sink.is_writable();
          }
          const int64_t index = st->choices.add(st->req, *ev);
          if (index < 0) return true;
          // continuous_usage_stats: the chunk carries its choice's usage so far (vLLM's).
          const auto with_usage = [&](json chunk) {
            if (st->req.continuous_usage)
              chunk["usage"] = usage_json(choice_usage(st->req, st->ctx, static_cast<size_t>(index),
                                                       st->choices.accs[static_cast<size_t>(index)]));
            return chunk;
          };
          std::string out;
          switch (endpoint) {
            case Endpoint::kGenerate:
              if (!ev->tokens.empty() || ev->finished) {
                const Accumulated& acc = st->choices.accs[static_cast<size_t>(index)];
                out +=
                    sse(st->req.batch_reply ? generate_choice(st->req, st->ctx, static_cast<size_t>(index), acc, true)
                                            : generate_response(st->req, st->ctx, acc));
              }
              break;
            case Endpoint::kCompletions:
              if (!ev->tokens.empty() || !ev->text.empty() || ev->finished) {
                json chunk =
                    completion_chunk(st->req, st->ctx, *ev, index, &st->text_offsets[static_cast<size_t>(index)]);
                if (carries_something(chunk, "text")) out += sse(with_usage(std::move(chunk)));
              }
              break;
            case Endpoint::kChat: {
              std::vector<bool>::reference first = st->first[static_cast<size_t>(index)];
              if (!ev->tokens.empty() || !ev->text.empty() || ev->finished || first) {
                ChatChoiceStream* ps = st->parsers.empty() ? nullptr : &st->parsers[static_cast<size_t>(index)];
                json chunk = chat_chunk(st->req, st->ctx, *ev, first, index, ps);
                if (first || carries_something(chunk, "delta")) out += sse(with_usage(std::move(chunk)));
                first = false;
              }
              break;
            }
          }
          if (ev->finished && ev->finished->reason == engine::FinishReason::kError) {
            out += sse(engine_failure(st->ctx.id, ev->finished->error).to_json());
            st->choices.abort_unfinished(*engine);  // the stream ends in the error: its sibling choices stop too
          }
          if (st->choices.all_finished()) {
            st->finished = true;
            server->unregister_rids(st->rid_names);  // before the client sees [DONE]
            if (endpoint != Endpoint::kGenerate && st->req.include_usage)
              out += sse(usage_chunk(st->req, st->ctx, choices_usage(st->ctx, st->choices.accs)));
            out += "data: [DONE]\n\n";
          }
          if (!out.empty()) {
            if (!sink.write(out.data(), out.size())) return false;
          }
          if (st->finished) sink.done();
          return true;
        },
        [server = server_, engine, st](bool) {
          if (!st->finished) st->choices.abort_unfinished(*engine);  // client gone or write failed: free slots and KV
          server->unregister_rids(st->rid_names);
          server->log_request(st->finished, st->ctx, st->choices.accs);
          st->active.reset();
        });
  }

  // HTTP/1.0 has no chunked transfer coding (RFC 9112 section 7): such a client's reply ends when the connection
  // closes (httplib's provider without a length), as ApacheBench and other HTTP/1.0 clients read it. httplib 0.11
  // keeps a "Connection: Keep-Alive" 1.0 connection open after such a body (the client then waits for its 5 s
  // keep-alive timeout), so once the provider has said done it returns false, which makes httplib close it.
  void set_provider(httplib::Response& res, const char* content_type, httplib::ContentProviderWithoutLength provider,
                    httplib::ContentProviderResourceReleaser releaser) const {
    if (http10_) {
      res.set_header("Connection", "close");
      res.set_content_provider(
          content_type,
          [provider = std::move(provider)](size_t offset, httplib::DataSink& sink) {
            bool done = false;
            const std::function<void()> done_fn = sink.done;
            sink.done = [&] {
              done = true;
              done_fn();
            };
            const bool ok = provider(offset, sink);
            sink.done = done_fn;
            return ok && !done;
          },
          std::move(releaser));
    } else {
      res.set_chunked_content_provider(content_type, std::move(provider), std::move(releaser));
    }
  }

  HttpServer* server_;
  Endpoint endpoint_;
  bool http10_ = false;  // the request came as HTTP/1.0
};

HttpServer::HttpServer(ServerOptions options)
    : options_(std::move(options)), http_(std::make_unique<httplib::Server>()),
      dispatcher_(std::make_shared<OutputDispatcher>()) {
  FP4MOE_CHECK(options_.n_http_threads >= 1) << "HTTP threads " << options_.n_http_threads << " must be >= 1";
  FP4MOE_CHECK(options_.max_http_threads >= options_.n_http_threads)
      << "--max-http-threads " << options_.max_http_threads << " must be >= --http-threads " << options_.n_http_threads;
  const auto min_threads = static_cast<size_t>(options_.n_http_threads);
  const auto max_threads = static_cast<size_t>(options_.max_http_threads);
  http_->new_task_queue = [min_threads, max_threads] {
    return new ElasticPool(min_threads, max_threads, ElasticPool::kIdleExit);
  };
  http_->set_payload_max_length(kMaxBodyBytes);
  // Keep the listening socket's descriptor: httplib listens with a backlog of 5, which drops
  // connections when dozens of clients connect at once; bind() raises it (listen() again).
  // SO_REUSEADDR only (a restart binds past TIME_WAIT, as uvicorn does): httplib's default also sets SO_REUSEPORT,
  // under which a second server on a port in use bound it too and the kernel split the connections between them.
  http_->set_socket_options([this](socket_t sock) {
    const int yes = 1;
    ::setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
    listen_fd_ = static_cast<int>(sock);
  });
  http_->set_read_timeout(30, 0);
  http_->set_write_timeout(30, 0);
  // httplib closes a keep-alive connection after 5 requests (its default), so a benchmark client paid a new handshake
  // every fifth request; uvicorn (SGLang, vLLM) has no such count. An idle connection still closes after 5 s.
  http_->set_keep_alive_max_count(kKeepAliveMaxRequests);
  install_routes();
}

HttpServer::~HttpServer() { stop_listener(); }

namespace {

// Half-closes (reading side) every connection the server accepted on `port`: httplib's workers wait in their
// keep-alive read for up to 5 s after stop(), so an idle client connection held a SIGTERM's exit that long (uvicorn
// closes idle connections at shutdown). A worker reading then sees end-of-stream and closes; one still writing a
// reply finishes it. The accepted sockets are those of this process bound locally to `port` that are not listening.
void half_close_accepted(int port) {
  for_each_socket_on_port(port, [](int fd) {
    int listening = 0;
    socklen_t len = sizeof(listening);
    if (::getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &listening, &len) == 0 && !listening) ::shutdown(fd, SHUT_RD);
    return true;
  });
}

}  // namespace

void HttpServer::stop_listener() {
  if (!listener_.joinable()) return;
  // httplib's stop() does nothing until the listener has marked itself running: stopped before that
  // (a model that fails to load at once), the listener went on accepting and the join never returned.
  while (!http_->is_running() && !listener_done_) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  http_->stop();
  if (port_ > 0) half_close_accepted(port_);
  listener_.join();
}

void HttpServer::bind() {
  if (options_.port == 0) {
    port_ = http_->bind_to_any_port(options_.host);
    FP4MOE_CHECK(port_ > 0) << "cannot listen on " << options_.host << " (any port)";
  } else {
    FP4MOE_CHECK(http_->bind_to_port(options_.host, options_.port))
        << "cannot listen on " << options_.host << ":" << options_.port
        << " (port taken, e.g. by another server, or host not local?)";
    port_ = options_.port;
  }
  if (listen_fd_ >= 0) {
    FP4MOE_CHECK(::listen(listen_fd_, kListenBacklog) == 0)
        << "listen(backlog " << kListenBacklog << ") on " << options_.host << ":" << port_ << " failed";
  }
}

void HttpServer::start() {
  FP4MOE_CHECK(port_ > 0) << "HttpServer::start before bind()";
  listener_ = std::thread([this] {
    http_->listen_after_bind();
    listener_done_ = true;
  });
}

void HttpServer::set_engine(std::shared_ptr<engine::Engine> engine,
                            std::shared_ptr<const engine::ChatTemplate> chat_template) {
  auto constraints =
      engine ? std::make_shared<engine::ConstraintCompiler>(engine->tokenizer(), options_.constraints) : nullptr;
  std::lock_guard<std::mutex> lock(mu_);
  engine_ = std::move(engine);
  chat_template_ = std::move(chat_template);
  constraints_ = std::move(constraints);
}

void HttpServer::shutdown(bool drain, double timeout_s) {
  shutting_down_ = true;
  std::shared_ptr<engine::Engine> engine;
  {
    std::lock_guard<std::mutex> lock(mu_);
    engine = engine_;
  }
  // Drain: the engine finishes the running and queued requests while the replies stream, for at most timeout_s;
  // whatever is left then is aborted (its replies end with finish_reason abort), and their handlers get a few
  // seconds more to write that.
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                             std::chrono::duration<double>(std::max(timeout_s, 0.0)));
  auto wait_replies = [&](std::chrono::steady_clock::time_point until) {
    std::unique_lock<std::mutex> lock(active_mu_);
    active_cv_.wait_until(lock, until, [&] { return n_active_ == 0; });
  };
  if (engine && drain) {
    engine->begin_drain();
    wait_replies(deadline);
  }
  if (engine) engine->shutdown(false);  // aborts what the drain did not finish; joins the engine thread
  wait_replies(std::max(deadline, std::chrono::steady_clock::now() + std::chrono::seconds(5)));
  stop_listener();
}

std::shared_ptr<engine::Engine> HttpServer::engine_or_503() const {
  if (shutting_down_) throw unavailable("the server is shutting down", options_.retry_after_s);
  std::lock_guard<std::mutex> lock(mu_);
  if (!engine_ || !engine_->is_ready()) throw unavailable("the model is loading", options_.retry_after_s);
  return engine_;
}

bool HttpServer::register_rids(const RidNames& names) {
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& [rid, ids] : names) {
    if (rids_.count(rid)) return false;
  }
  for (const auto& [rid, ids] : names) rids_.emplace(rid, ids);
  return true;
}

void HttpServer::unregister_rids(const RidNames& names) {
  std::lock_guard<std::mutex> lock(mu_);
  // Only this request's registrations: a rid may already name a newer request.
  for (const auto& [rid, ids] : names) {
    if (const auto it = rids_.find(rid); it != rids_.end() && it->second == ids) rids_.erase(it);
  }
}

void HttpServer::log_request(bool finished, const ResponseContext& ctx,
                             const std::vector<Accumulated>& accs) const noexcept {
  if (ctx.log_route.empty()) return;
  try {  // called from a reply's releaser (a destructor): a failure here loses the line, not the process
    const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - ctx.log_started).count();
    const std::string line = BatchLog::timestamp() +
                             request_log_line(options_.log_requests_level, finished, ctx.id, ctx.log_route,
                                              ctx.log_body, ctx.prompt_tokens, accs, elapsed) +
                             "\n";
    std::fwrite(line.data(), 1, line.size(), stderr);  // one write a line: lines of concurrent requests do not mix
  } catch (...) {
  }
}

void HttpServer::reply_error(const ApiError& e, httplib::Response& res) {
  count_error(e.status);
  res.status = e.status;
  if (e.retry_after_s > 0) res.set_header("Retry-After", std::to_string(e.retry_after_s));
  res.set_content(dump_json(e.to_json()), "application/json");
}

void HttpServer::reply_error_and_close(const ApiError& e, httplib::Response& res) {
  count_error(e.status);
  res.status = e.status;
  if (e.retry_after_s > 0) res.set_header("Retry-After", std::to_string(e.retry_after_s));
  res.set_header("Connection", "close");
  auto body = std::make_shared<const std::string>(dump_json(e.to_json()));
  // Without a length the reply ends with the connection; the provider writes it all, says done and returns false,
  // which makes httplib close the connection (as the HTTP/1.0 replies end).
  res.set_content_provider("application/json", [body](size_t, httplib::DataSink& sink) {
    sink.write(body->data(), body->size());
    sink.done();
    return false;
  });
}

ApiError HttpServer::unrouted(const httplib::Request& req, httplib::Response& res) const {
  ApiError e;
  const auto known = std::find_if(route_methods_.begin(), route_methods_.end(),
                                  [&](const auto& r) { return route_matches(r.first, req.path); });
  if (known != route_methods_.end()) {
    e.status = 405;
    std::string allow;
    for (const std::string& m : known->second) allow += (allow.empty() ? "" : ", ") + m;
    res.set_header("Allow", allow);
    e.message = req.method + " " + req.path + ": the route takes " + allow;
  } else {
    e.status = 404;
    e.type = "not_found_error";
    e.message = "no route for " + req.method + " " + req.path;
  }
  return e;
}

void HttpServer::count_error(int status) {
  std::lock_guard<std::mutex> lock(mu_);
  ++counters_.errors_by_status[status];
}

namespace {

// A Content-Type that starts with application/x-www-form-urlencoded, in any case (httplib caps a body whose type
// starts with it exactly; this covers that and its other spellings).
bool form_encoded(std::string_view content_type) {
  constexpr std::string_view kForm = "application/x-www-form-urlencoded";
  const size_t begin = content_type.find_first_not_of(" \t");
  if (begin == std::string_view::npos || content_type.size() - begin < kForm.size()) return false;
  return std::equal(kForm.begin(), kForm.end(), content_type.begin() + static_cast<std::ptrdiff_t>(begin),
                    [](char a, char b) { return a == std::tolower(static_cast<unsigned char>(b)); });
}

// The text of a list of token ids (a request's field `field`); an item that is not a token id of the vocabulary is a
// 400 naming it.
std::string decode_ids(const engine::Tokenizer& tok, const json& list, const std::string& field) {
  std::vector<engine::TokenId> ids;
  for (size_t i = 0; i < list.size(); ++i) {
    const json& e = list[i];
    if (!e.is_number_integer() || e.get<int64_t>() < 0 || e.get<int64_t>() >= tok.vocab_size())
      throw bad_request(field, field + "[" + std::to_string(i) + "] = " + dump_json(e) + " is not a token id in [0, " +
                                   std::to_string(tok.vocab_size()) + ")");
    ids.push_back(static_cast<engine::TokenId>(e.get<int64_t>()));
  }
  return tok.decode(ids);
}

// The request carries `Authorization: Bearer <key>` (compared in time independent of where it differs).
bool bearer_matches(const httplib::Request& req, const std::string& key) {
  const std::string got = req.get_header_value("Authorization");
  const std::string want = "Bearer " + key;
  if (got.size() != want.size()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < got.size(); ++i) diff |= static_cast<unsigned char>(got[i] ^ want[i]);
  return diff == 0;
}

}  // namespace

void HttpServer::install_routes() {
  // Each route with its methods, so that a known path asked with another method is a 405 naming them.
  auto post = [this](const std::string& path, httplib::Server::Handler h) {
    route_methods_[path].push_back("POST");
    http_->Post(path, std::move(h));
  };
  auto get = [this](const std::string& path, httplib::Server::Handler h) {
    route_methods_[path].push_back("GET");
    http_->Get(path, std::move(h));
  };
  // Every handler: count it as active, turn ApiError into its JSON reply and anything else into a 500
  // that says it is a bug (with the exception's text).
  auto wrap = [this](std::function<void(const httplib::Request&, httplib::Response&)> f) {
    return [this, f](const httplib::Request& req, httplib::Response& res) {
      ActiveGuard active(this);
      ApiError err;
      bool failed = false;
      try {
        f(req, res);
      } catch (const ApiError& e) {
        err = e;
        failed = true;
      } catch (const std::exception& e) {
        err = internal_error("bug: " + req.method + " " + req.path + " failed: " + e.what());
        failed = true;
      }
      if (failed) reply_error(err, res);
    };
  };
  // SGLang's /flush_cache (GET or POST): empties the prefix cache when no request runs or waits (decided at the
  // engine's next step); otherwise a 400 with the counts, as SGLang refuses it then. 400 when the engine runs without
  // a prefix cache.
  auto flush_cache = wrap([this](const httplib::Request&, httplib::Response& res) {
    auto engine = engine_or_503();
    constexpr std::chrono::seconds kWait(30);  // for the engine's next step
    const engine::Engine::FlushResult r = engine->flush_prefix_cache(kWait);
    if (!r.enabled) {
      throw bad_request("", "the prefix cache is off (--disable-radix-cache, or a model whose KV cannot be copied)");
    }
    if (r.timed_out) {
      throw bad_request("",
                        "Cache not flushed: the engine took no step within " + std::to_string(kWait.count()) + " s");
    }
    if (!r.flushed) {
      throw bad_request("", "Cache not flushed because there are pending requests. #running-req: " +
                                std::to_string(r.n_running) + ", #queue-req: " + std::to_string(r.n_waiting));
    }
    res.set_content("Cache flushed.\n", "text/plain");
  });
  post("/flush_cache", flush_cache);
  get("/flush_cache", flush_cache);
  // /health, and vLLM's (SageMaker's) /ping probe (GET or POST, any body or none).
  auto health = wrap([this](const httplib::Request&, httplib::Response& res) {
    engine_or_503();
    res.set_content(R"({"status":"ok"})", "application/json");
  });

  // Before routing: the --api-key check, and POSTs without a body length. HTTP/1.1 gives a request with
  // neither Content-Length nor chunked encoding an empty body (RFC 9112 6.3; `curl -X POST` without -d
  // sends one), but httplib would wait for a body until its read timeout (30 s) and then answer 400.
  http_->set_pre_routing_handler([this, flush_cache, health](const httplib::Request& req, httplib::Response& res) {
    // Every body is read as JSON whatever its Content-Type (as SGLang's and vLLM's FastAPI routes read them), but
    // httplib refuses a form-encoded one past 8 KiB with a 413 before any handler runs, and `curl -d` sends JSON
    // with that type: the type is dropped here, before the body is read. (The request object httplib passes is
    // its own non-const one.)
    if (form_encoded(req.get_header_value("Content-Type")))
      const_cast<httplib::Request&>(req).headers.erase("Content-Type");
    const bool exempt =
        req.path == "/health" || req.path == "/health_generate" || req.path == "/ping" || req.path == "/metrics";
    if (!options_.api_key.empty() && !exempt && !bearer_matches(req, options_.api_key)) {
      ApiError e;
      e.status = 401;
      e.type = "authentication_error";
      e.message = req.has_header("Authorization")
                      ? "the Authorization header does not carry this server's API key (--api-key)"
                      : "this server wants an API key: send the header Authorization: Bearer <key> (--api-key)";
      res.set_header("WWW-Authenticate", "Bearer");
      const bool has_body = (req.has_header("Content-Length") && req.get_header_value("Content-Length") != "0") ||
                            req.has_header("Transfer-Encoding");
      if (has_body) {
        reply_error_and_close(e, res);  // its body is not read
      } else {
        reply_error(e, res);
      }
      return httplib::Server::HandlerResponse::Handled;
    }
    // A Content-Length that is not a byte count, or one no client could send (past 2^64): answered now, the connection
    // closed (its body is not read); httplib would wait for such a body until its read timeout (30 s). A count past the
    // body limit is httplib's 413 (it reads and drops the body the client sends, so that the client sees the reply).
    if (req.has_header("Content-Length")) {
      const std::string length = req.get_header_value("Content-Length");
      uint64_t n = 0;
      const auto [end, ec] = std::from_chars(length.data(), length.data() + length.size(), n);
      const bool count = !length.empty() && ec != std::errc::invalid_argument && end == length.data() + length.size();
      if (!count || ec == std::errc::result_out_of_range) {
        ApiError e = bad_request(
            "", req.method + " " + req.path + ": Content-Length \"" + length.substr(0, 40) + "\" is not a byte count");
        if (count) {
          e.status = 413;
          e.message = req.method + " " + req.path + ": Content-Length " + length.substr(0, 40) +
                      " is larger than the " + std::to_string(kMaxBodyBytes >> 20) + " MiB a request may send";
          e.extra = {{"limit_bytes", kMaxBodyBytes}};
        }
        reply_error_and_close(e, res);
        return httplib::Server::HandlerResponse::Handled;
      }
    }
    const bool no_body = (req.method == "POST" || req.method == "PUT") && !req.has_header("Content-Length") &&
                         req.get_header_value("Transfer-Encoding").find("chunked") == std::string::npos;
    if (!no_body) return httplib::Server::HandlerResponse::Unhandled;
    const bool routed = std::any_of(route_methods_.begin(), route_methods_.end(), [&](const auto& r) {
      return route_matches(r.first, req.path) &&
             std::find(r.second.begin(), r.second.end(), req.method) != r.second.end();
    });
    if (req.method == "POST" && req.path == "/flush_cache") {
      flush_cache(req, res);
    } else if (req.method == "POST" && req.path == "/ping") {
      health(req, res);
    } else if (!routed) {
      reply_error(unrouted(req, res), res);  // 404 / 405 as with a body, not "came without a body"
    } else {
      reply_error(bad_request("", req.method + " " + req.path +
                                      " came without a body (no Content-Length header): send the JSON request"),
                  res);
    }
    return httplib::Server::HandlerResponse::Handled;
  });
  auto generation = [this, wrap](Endpoint e) {
    return wrap([this, e](const httplib::Request& req, httplib::Response& res) { RequestHandler(this, e).handle(req, res); });
  };
  post("/generate", generation(Endpoint::kGenerate));
  post("/v1/completions", generation(Endpoint::kCompletions));
  post("/v1/chat/completions", generation(Endpoint::kChat));

  get("/health", health);
  // vLLM's (SageMaker's) liveness probe, GET or POST: /health's answer.
  get("/ping", health);
  post("/ping", health);
  get("/version", wrap([this](const httplib::Request&, httplib::Response& res) {
        res.set_content(dump_json(json{{"version", options_.version}}), "application/json");
      }));
  get("/health_generate", wrap([this](const httplib::Request&, httplib::Response& res) {
        auto engine = engine_or_503();
        const auto timeout = std::chrono::milliseconds(static_cast<int64_t>(options_.health_probe_timeout_s * 1000));
        if (!engine->run_health_probe(timeout)) {
          ApiError e = unavailable(
              "the engine made no progress within " + std::to_string(options_.health_probe_timeout_s) + " s",
              options_.retry_after_s);
          throw e;
        }
        res.set_content(R"({"status":"ok"})", "application/json");
      }));
  get("/metrics", wrap([this](const httplib::Request&, httplib::Response& res) {
        std::shared_ptr<engine::Engine> engine;
        HttpCounters counters;
        {
          std::lock_guard<std::mutex> lock(mu_);
          engine = engine_;
          counters = counters_;
        }
        engine::EngineStats stats;  // empty until the model is loaded
        if (engine) stats = engine->stats();
        const json& args = options_.launch_args;
        const auto launch_arg = [&](const char* key) {
          return args.is_object() && args.contains(key) && args[key].is_string() ? args[key].get<std::string>()
                                                                                 : std::string();
        };
        const ServedModel model{launch_arg("model_path"), options_.served_model_name, launch_arg("expert_weights")};
        res.set_content(render_metrics(stats, counters, model), "text/plain; version=0.0.4");
      }));
  get("/get_server_info", wrap([this](const httplib::Request&, httplib::Response& res) {
        json info = options_.launch_args;
        info["version"] = options_.version;
        info["served_model_name"] = options_.served_model_name;
        info["host"] = options_.host;
        info["port"] = port_;
        std::shared_ptr<engine::Engine> engine;
        {
          std::lock_guard<std::mutex> lock(mu_);
          engine = engine_;
        }
        info["is_ready"] = engine && engine->is_ready() && !shutting_down_;
        if (engine) {
          const auto& o = engine->options();
          info["max_running_requests"] = o.max_running_requests;
          info["max_total_num_tokens"] = engine->kv_capacity_tokens();
          info["page_size"] = o.page_size;
          info["chunked_prefill_size"] = o.chunked_prefill_size;
          info["max_prefill_tokens"] = o.max_prefill_tokens;
          info["num_continuous_decode_steps"] = o.num_continuous_decode_steps;
          info["stream_interval"] = o.stream_interval;
          info["device_sampling"] = o.device_sampling;
          const engine::SamplingParams& d = options_.sampling_defaults;
          info["default_sampling_params"] = {{"temperature", d.temperature},
                                             {"top_p", d.top_p},
                                             {"top_k", d.top_k},
                                             {"min_p", d.min_p},
                                             {"repetition_penalty", d.repetition_penalty}};
          info["max_queued_requests"] = o.max_queued_requests;
          info["schedule_policy"] = engine::to_string(o.schedule_policy);
          info["enable_priority_scheduling"] = o.schedule_policy == engine::SchedulePolicy::kPriority;
          info["schedule_low_priority_values_first"] = o.absent_priority_last && o.priority_low_first;  // the flag
          info["priority_scheduling_preemption_threshold"] =
              o.priority_scheduling_preemption_threshold ? json(*o.priority_scheduling_preemption_threshold) : json();
          info["disable_priority_preemption"] =
              o.schedule_policy == engine::SchedulePolicy::kPriority && !o.priority_scheduling_preemption_threshold;
          info["default_priority_value"] = o.default_priority ? json(*o.default_priority) : json();
          info["schedule_conservativeness"] = o.schedule_conservativeness;
          info["disable_radix_cache"] = !engine->prefix_cache_enabled();
          info["reasoning_parser"] = options_.reasoning ? json(std::string(options_.reasoning->name)) : json(nullptr);
          info["tool_call_parser"] = options_.tool_calls ? json(std::string(options_.tool_calls->name)) : json(nullptr);
          info["context_length"] = engine->context_length();
          info["vocab_size"] = engine->model_config().vocab_size;
          info["architecture"] = engine->model_config().architecture;
          const engine::EngineStats s = engine->stats();
          info["internal_states"] = json::array({{{"num_running_reqs", s.n_running},
                                                  {"num_queue_reqs", s.n_waiting},
                                                  {"num_used_tokens", s.kv_used_tokens},
                                                  {"prefix_cache_tokens", s.prefix_cache_tokens},
                                                  {"max_total_num_tokens", s.kv_total_tokens},
                                                  {"generation_tokens_total", s.generation_tokens_total},
                                                  {"prompt_tokens_total", s.prompt_tokens_total}}});
        }
        res.set_content(dump_json(info), "application/json");
      }));
  // SGLang's POST /abort_request: {"rid": id} ends that request's choices with finish_reason "abort"
  // (the id its reply carries: SGLang's rid, "cmpl-..." or "chatcmpl-..."), {"abort_all": true} every
  // open one; the replies end as when their client goes away. An unknown rid is a 404 naming it.
  post("/abort_request", wrap([this](const httplib::Request& req, httplib::Response& res) {
         auto engine = engine_or_503();
         const json body = parse_body(req.body);
         if (body.contains("abort_all") && !body["abort_all"].is_boolean())
           throw bad_request("abort_all", "abort_all must be true or false, got " + body["abort_all"].dump());
         const bool all = body.contains("abort_all") && body["abort_all"].get<bool>();
         const auto rid_it = body.find("rid");
         if (!all && (rid_it == body.end() || !rid_it->is_string()))
           throw bad_request("rid",
                             "rid (the id of a request's reply, a string) is required, or abort_all: true; got " +
                                 (rid_it == body.end() ? std::string("no rid") : "rid = " + dump_json(*rid_it)));
         std::vector<engine::RequestId> ids;
         int64_t n_replies = 0;
         {
           std::lock_guard<std::mutex> lock(mu_);
           auto take = [&](const std::vector<engine::RequestId>& rid_ids) {
             ids.insert(ids.end(), rid_ids.begin(), rid_ids.end());
             ++n_replies;
           };
           if (all) {
             for (const auto& entry : rids_) take(entry.second);
           } else if (const auto it = rids_.find(rid_it->get<std::string>()); it != rids_.end()) {
             take(it->second);
           }
         }
         if (!all && n_replies == 0) {
           ApiError e;
           e.status = 404;
           e.type = "not_found_error";
           e.param = "rid";
           e.message = "no open request has rid \"" + rid_it->get<std::string>() + "\" (finished, or never admitted)";
           throw e;
         }
         int64_t n_aborted = 0;
         for (engine::RequestId id : ids) n_aborted += engine->abort(id) ? 1 : 0;
         res.set_content(dump_json(json{{"requests", n_replies}, {"aborted", n_aborted}}), "application/json");
       }));
  // The one model this server serves, as /v1/models lists it.
  auto model_card = [this] {
    std::shared_ptr<engine::Engine> engine;
    {
      std::lock_guard<std::mutex> lock(mu_);
      engine = engine_;
    }
    json m = {{"id", options_.served_model_name},
              {"object", "model"},
              {"created", unix_now()},
              {"owned_by", "fp4moe"},
              {"root", options_.served_model_name}};
    if (engine) m["max_model_len"] = engine->context_length();
    return m;
  };
  // While the model loads these answer 503 as /health does (SGLang and vLLM open their port only once it is loaded,
  // so clients take a 200 here for "ready").
  get("/v1/models", wrap([this, model_card](const httplib::Request&, httplib::Response& res) {
        engine_or_503();
        res.set_content(dump_json(json{{"object", "list"}, {"data", json::array({model_card()})}}), "application/json");
      }));
  // OpenAI's retrieve-model: the served model's card, or a 404 naming the id asked for.
  get(R"(/v1/models/(.+))", wrap([this, model_card](const httplib::Request& req, httplib::Response& res) {
        engine_or_503();
        const std::string id = req.matches.size() > 1 ? std::string(req.matches[1]) : std::string();
        if (id != options_.served_model_name) {
          ApiError e;
          e.status = 404;
          e.type = "not_found_error";
          e.param = "model";
          e.message = "the model '" + id + "' does not exist; this server serves '" + options_.served_model_name + "'";
          throw e;
        }
        res.set_content(dump_json(model_card()), "application/json");
      }));
  // SGLang's GET /get_model_info (its frontend and tools call it to learn what the server runs).
  get("/get_model_info", wrap([this](const httplib::Request&, httplib::Response& res) {
        auto engine = engine_or_503();
        const json& args = options_.launch_args;
        const auto arg = [&](const char* key) {
          return args.is_object() && args.contains(key) ? args[key] : json(nullptr);
        };
        res.set_content(dump_json(json{{"model_path", arg("model_path")},
                                       {"tokenizer_path", arg("tokenizer_path")},
                                       {"served_model_name", options_.served_model_name},
                                       {"is_generation", true},
                                       {"architectures", json::array({engine->model_config().architecture})},
                                       {"context_length", engine->context_length()}}),
                        "application/json");
      }));
  // Tokenize, as SGLang's /v1/tokenize and vLLM's root /tokenize take it (one handler: both routes answer both
  // clients): {"prompt": str or [str]} (add_special_tokens true) or a chat request's {"messages", ...} rendered as
  // /v1/chat/completions renders it (add_special_tokens false, vLLM's), -> {"count", "max_model_len", "tokens",
  // "token_strs"} (with return_token_strs: each token's vocabulary string, else null; lists for a list of prompts).
  auto tokenize = wrap([this](const httplib::Request& req, httplib::Response& res) {
    auto engine = engine_or_503();
    const json body = parse_body(req.body);
    const bool chat = body.contains("messages") && !body["messages"].is_null();
    const bool prompt = body.contains("prompt") && !body["prompt"].is_null();
    if (chat == prompt)
      throw bad_request("prompt",
                        "give exactly one of \"prompt\" (a string or a list of strings) and \"messages\" (a chat)");
    auto flag = [&](const char* key, bool fallback) {
      const auto it = body.find(key);
      if (it == body.end() || it->is_null()) return fallback;
      if (!it->is_boolean()) throw bad_request(key, std::string(key) + " must be true or false, got " + dump_json(*it));
      return it->get<bool>();
    };
    const bool add_special = flag("add_special_tokens", !chat);
    const bool want_strs = flag("return_token_strs", false);
    const engine::EncodeOptions eo{.add_special_tokens = add_special, .parse_special = true};
    const engine::Tokenizer& tok = engine->tokenizer();
    // One text's entry: its ids and (when asked) their strings.
    auto one = [&](const std::string& text, json& tokens, json& strs) {
      const std::vector<engine::TokenId> ids = tok.encode(text, eo);
      tokens = ids;
      strs = nullptr;
      if (want_strs) {
        strs = json::array();
        for (engine::TokenId id : ids) strs.push_back(tok.id_to_token(id));
      }
      return ids.size();
    };
    json out = {{"max_model_len", engine->context_length()}};
    json tokens, strs;
    if (chat) {
      ParsedRequest chat_req = parse_request(Endpoint::kChat, body);
      restore_key_order(chat_req, req.body);
      std::shared_ptr<const engine::ChatTemplate> tmpl;
      {
        std::lock_guard<std::mutex> lock(mu_);
        tmpl = chat_template_;
      }
      if (!tmpl) throw bad_request("messages", "the served model has no chat template; send a prompt");
      out["count"] = one(render_chat(*tmpl, chat_req), tokens, strs);
    } else if (body["prompt"].is_string()) {
      out["count"] = one(body["prompt"].get<std::string>(), tokens, strs);
    } else if (body["prompt"].is_array()) {
      json counts = json::array();
      tokens = json::array();
      strs = want_strs ? json::array() : json(nullptr);
      for (size_t i = 0; i < body["prompt"].size(); ++i) {
        const json& e = body["prompt"][i];
        if (!e.is_string())
          throw bad_request("prompt", "prompt[" + std::to_string(i) + "] = " + dump_json(e) + " is not a string");
        json t, st;
        counts.push_back(one(e.get<std::string>(), t, st));
        tokens.push_back(std::move(t));
        if (want_strs) strs.push_back(std::move(st));
      }
      out["count"] = std::move(counts);
    } else {
      throw bad_request("prompt", "prompt must be a string or a list of strings, got " + dump_json(body["prompt"]));
    }
    out["tokens"] = std::move(tokens);
    out["token_strs"] = std::move(strs);
    res.set_content(dump_json(out), "application/json");
  });
  post("/v1/tokenize", tokenize);
  post("/tokenize", tokenize);
  // Detokenize, SGLang's /v1/detokenize and vLLM's root /detokenize (one handler): {"tokens": [ids] or [[ids]]} ->
  // the text as "text" (SGLang's key) and "prompt" (vLLM's); a list of lists gives lists.
  auto detokenize = wrap([this](const httplib::Request& req, httplib::Response& res) {
    auto engine = engine_or_503();
    const json body = parse_body(req.body);
    auto it = body.find("tokens");
    if (it == body.end() || !it->is_array())
      throw bad_request("tokens", "tokens must be a list of token ids (or of lists), got " +
                                      (it == body.end() ? std::string("nothing") : dump_json(*it)));
    const engine::Tokenizer& tok = engine->tokenizer();
    json text;
    if (!it->empty() && (*it)[0].is_array()) {
      text = json::array();
      for (size_t i = 0; i < it->size(); ++i) {
        const std::string field = "tokens[" + std::to_string(i) + "]";
        if (!(*it)[i].is_array())  // a list of lists throughout (a bare id here was a 500, null / {} "")
          throw bad_request(field, field + " = " + dump_json((*it)[i]) +
                                       " is not a list of token ids (tokens[0] is one, so every item must be)");
        text.push_back(decode_ids(tok, (*it)[i], field));
      }
    } else {
      text = decode_ids(tok, *it, "tokens");
    }
    res.set_content(dump_json(json{{"text", text}, {"prompt", text}}), "application/json");
  });
  post("/v1/detokenize", detokenize);
  post("/detokenize", detokenize);
  // What httplib refuses before a handler runs (an unknown path, another method, a body past the limit,
  // a malformed request): the same typed JSON error, saying which.
  http_->set_error_handler([this](const httplib::Request& req, httplib::Response& res) {
    // A reply of ours (reply_error_and_close's goes through a content provider) is not replaced.
    if (!res.body.empty() || res.content_provider_) return;
    ApiError e;
    if (res.status == 404) {
      e = unrouted(req, res);
      res.status = e.status;
    } else if (res.status == 413) {
      e.message = req.method + " " + req.path + ": the body is larger than the " + std::to_string(kMaxBodyBytes >> 20) +
                  " MiB a request may send";
      e.extra = {{"limit_bytes", kMaxBodyBytes}};
    } else {
      e.message = req.method + " " + req.path + ": a malformed HTTP request (HTTP " + std::to_string(res.status) +
                  ": its headers, Content-Length or chunked body could not be read)";
    }
    e.status = res.status;
    count_error(res.status);
    res.set_content(dump_json(e.to_json()), "application/json");
  });
}

}  // namespace fp4moe::server
