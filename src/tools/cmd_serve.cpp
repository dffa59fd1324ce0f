// `fp4moe serve`: the HTTP server (server/http_server.h) over the continuous-batching engine.
//
//   fp4moe serve                                   # the embedded default model, http://127.0.0.1:30000
//   fp4moe serve --model DIR [--tokenizer-path DIR] [--host H] [--port P] [--device cpu]
//       [--max-running-requests N] [--max-total-tokens N] [--chunked-prefill-size N]
//       [--max-prefill-tokens N] [--num-continuous-decode-steps N] [--max-queued-requests N]
//       [--schedule-policy fcfs|priority] [--load-format auto|dummy] [--dummy-weights bf16|nvfp4] [--seed S]
//       [--context-length N] [--sampling-defaults model|openai]
//
// Flags carry SGLang's names and meaning (../shared/spec/serving-anchors.md). The socket opens before
// the model loads, so /health answers 503 during the load and 200 once the engine has warmed up.
// SIGTERM / SIGINT: stop taking requests, let running and queued ones finish for at most --drain-timeout seconds,
// abort the rest, exit 0; SIGINT while draining exits at once (status 1), a repeated SIGTERM is ignored.
// Tested by tests/server/test_server_e2e.cpp and test_server_load.cpp (they run this binary).
#include <CLI/CLI.hpp>
#include <fmt/core.h>

#include <pthread.h>
#include <signal.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "dist/serve_parallel.h"
#include "engine/chat_template.h"
#include "engine/default_model.h"
#include "engine/engine.h"
#include "engine/regex_dfa.h"
#include "format/checkpoint.h"
#include "format/json_file.h"
#include "model/presets.h"
#include "model/registry.h"
#include "server/batch_log.h"
#include "server/http_server.h"
#include "server/request_log.h"
#include "tools/analyze.h"
#include "tools/cli_options.h"
#include "tools/commands.h"
#include "tools/device_option.h"
#include "tune/tune_cache.h"

namespace fp4moe::tools {
namespace {

namespace fs = std::filesystem;

struct ServeArgs {
  std::string model_dir;
  std::string tokenizer_path;
  std::string chat_template;  // --chat-template: a file or a template (empty: the model's)
  std::string served_model_name;
  std::string api_key;
  std::string reasoning_parser;  // --reasoning-parser (empty: replies are not split)
  std::string tool_call_parser;  // --tool-call-parser (empty: requests with tools are refused)
  std::string sampling_defaults = "model";  // --sampling-defaults: model (generation_config.json) or openai
  engine::ConstraintOptions constraints;  // --constrained-json-whitespace-pattern
  std::string host = "127.0.0.1";
  int port = 30000;
  DeviceArgs device;
  engine::EngineOptions engine;
  bool max_total_tokens_given = false;  // --max-total-tokens on the command line (with the fraction: the cap)
  double mem_fraction_static = 0.0;     // --mem-fraction-static (0: not given, the KV cache is --max-total-tokens)
  bool mem_fraction_given = false;
  int64_t decode_log_interval = 40;  // --decode-log-interval (0: no batch log)
  double watchdog_timeout_s = 300;   // --watchdog-timeout (0: none)
  std::string schedule_policy = "fcfs";
  bool enable_priority_scheduling = false;
  bool schedule_low_priority_values_first = false;
  std::optional<int64_t> preemption_threshold;  // --priority-scheduling-preemption-threshold (SGLang's default: 10)
  bool disable_priority_preemption = false;
  std::optional<int64_t> default_priority;  // --default-priority-value
  std::string load_format = "auto";
  std::string dummy_weights = "bf16";
  uint64_t seed = 0;
  int http_threads = 128;
  int max_http_threads = 0;  // 0: max(2048, http_threads)
  double drain_timeout_s = 600;
  double debug_load_delay_s = 0;  // tests: hold the load so /health's 503 phase is observable
  // SGLang / vLLM spellings that fp4moe takes as they are meant (add_compat_options): checked, not stored elsewhere.
  std::string dtype = "auto", kv_cache_dtype = "auto", quantization, log_level = "info";
  bool no_effect_flag = false;  // --trust-remote-code, --enable-metrics, ... (what they ask for is always so here)
  bool log_requests = false;    // --log-requests: a line per request (--log-requests-level, SGLang's default 2)
  int log_requests_level = 2;
};

struct Loaded {
  std::unique_ptr<model::CausalLM> model;
  std::shared_ptr<const engine::Tokenizer> tokenizer;
  std::shared_ptr<const engine::ChatTemplate> chat_template;
};

// --dtype / --kv-cache-dtype: fp4moe's one format (bf16) under its names, or an error saying why another is not.
void check_bf16_flag(const std::string& v, const char* why) {
  if (v != "auto" && v != "bfloat16" && v != "bf16")
    throw Error(v + " is not served: " + why + "; give auto, bfloat16 or bf16");
}

// --quantization modelopt_fp4 (SGLang's and vLLM's name for a ModelOpt NVFP4 checkpoint): the model must be NVFP4,
// checked before the load; a BF16 checkpoint would otherwise be served in BF16 without a word.
void check_quantization_flag(const ServeArgs& a) {
  if (a.quantization.empty() || a.model_dir.empty()) return;  // the default model's experts are NVFP4
  const std::string ask = "--quantization " + a.quantization + " asks for an NVFP4 model";
  if (model::parse_load_format(a.load_format) == model::LoadFormat::kDummy) {
    if (model::parse_dummy_weights(a.dummy_weights) != model::DummyWeights::kNVFP4)
      throw Error(ask + ", but --dummy-weights is " + a.dummy_weights + ": give --dummy-weights nvfp4");
    return;
  }
  const fs::path config = fs::path(a.model_dir) / "config.json";
  std::error_code ec;
  if (!fs::is_regular_file(config, ec)) return;  // the loader names what is missing
  const format::QuantConfig q =
      format::read_quant_config(a.model_dir, format::read_json_file(config), /*problems=*/nullptr);
  if (q.present && !q.foreign_method() && (q.nvfp4_by_default() || q.quant_algo == "MIXED_PRECISION")) return;
  throw Error(ask + ", but " + a.model_dir + " has " +
              (q.present ? (q.foreign_method() ? "quant_method " + q.quant_method : "quant_algo " + q.quant_algo) +
                               " (" + q.source + ")"
                         : std::string("no quantization section (hf_quant_config.json, config.json "
                                       "quantization_config): BF16 weights")) +
              "; serve a BF16 checkpoint without --quantization, or make an NVFP4 one with `fp4moe quantize`");
}

bool has_chat_template(const fs::path& dir, const engine::Tokenizer& tok) {
  return fs::exists(dir / "chat_template.jinja") ||
         (tok.config().is_object() && tok.config().contains("chat_template"));
}

Loaded load(const ServeArgs& a) {
  Loaded l;
  if (a.model_dir.empty()) {
    FP4MOE_CHECK(a.tokenizer_path.empty()) << "--tokenizer-path " << a.tokenizer_path << " needs --model";
    FP4MOE_CHECK(a.device.device == "cpu") << "--device " << a.device.device << ": the embedded default model is built for the cpu only;"
                                    << " pass --model DIR or a preset (--load-format dummy) for the GPU";
    l.model = engine::make_default_model(a.seed);
    l.tokenizer = engine::make_default_tokenizer();
    if (!a.chat_template.empty()) {
      l.chat_template =
          std::make_shared<engine::ChatTemplate>(chat_template_from_flag(a.chat_template, l.tokenizer->config()));
    } else if (l.tokenizer->config().is_object() && l.tokenizer->config().contains("chat_template")) {
      l.chat_template = std::make_shared<engine::ChatTemplate>(
          engine::ChatTemplate::from_config(l.tokenizer->config(), std::string(engine::kDefaultModelName)));
    }
    return l;
  }
  model::LoadOptions lo;
  lo.format = model::parse_load_format(a.load_format);
  lo.dummy_weights = model::parse_dummy_weights(a.dummy_weights);
  lo.seed = a.seed;
  // One step carries at most max_prefill_tokens prompt tokens plus one decode token per running request.
  apply_device_option(a.device, a.engine.max_prefill_tokens + a.engine.max_running_requests,
                      a.engine.max_total_tokens, a.engine.page_size, lo);
  if (a.mem_fraction_static > 0.0) {  // cuda: the pool from free memory, --max-total-tokens (when given) its cap
    lo.gpu.mem_fraction_static = a.mem_fraction_static;
    if (!a.max_total_tokens_given) lo.gpu.kv_tokens = INT64_MAX;
  }
  // The tokenizer first: a wrong --tokenizer-path (its tokenizer.json file, a folder that does not exist) is named
  // before a large checkpoint loads, with Tokenizer::load's messages.
  const fs::path tok_dir = a.tokenizer_path.empty() ? fs::path(a.model_dir) : fs::path(a.tokenizer_path);
  std::error_code ec;
  if (a.tokenizer_path.empty() && !fs::exists(tok_dir / "tokenizer.json", ec))
    throw Error(tok_dir.string() + " has no tokenizer.json; pass --tokenizer-path DIR (a folder holding one)");
  auto tok = std::make_shared<engine::Tokenizer>(engine::Tokenizer::load(tok_dir));
  l.model = model::load_model(a.model_dir, lo);
  if (!a.chat_template.empty()) {
    l.chat_template = std::make_shared<engine::ChatTemplate>(chat_template_from_flag(a.chat_template, tok->config()));
  } else if (has_chat_template(tok_dir, *tok)) {
    l.chat_template = std::make_shared<engine::ChatTemplate>(engine::ChatTemplate::load(tok_dir));
  }
  l.tokenizer = std::move(tok);
  return l;
}

// The model's config.json, read once before the socket opens for the sampling defaults and the metrics' expert
// format (the load reads it again with the weights). nullopt for the embedded model, and when it cannot be read and
// --sampling-defaults openai does not need it: the load then reports the error, after /health has answered 503.
std::optional<model::ModelConfig> early_config(const ServeArgs& a) {
  if (a.model_dir.empty()) return std::nullopt;
  try {
    return model::load_config_or_preset(a.model_dir);
  } catch (const Error&) {
    if (a.sampling_defaults == "model") throw;  // its values are needed now: a bad file fails in seconds
    return std::nullopt;
  }
}

// What an OpenAI request's omitted sampling fields default to: with --sampling-defaults model the values of the
// model's generation_config.json (checked before the socket opens and the weights load: a bad value fails in
// seconds).
engine::SamplingParams sampling_defaults(const ServeArgs& a, const std::optional<model::ModelConfig>& cfg) {
  if (a.sampling_defaults == "openai" || !cfg) return {};
  const model::GenerationDefaults& g = cfg->generation;
  engine::SamplingParams d = engine::sampling_defaults_from(g);
  if (g.has_sampling()) {
    fmt::print(stderr,
               "fp4moe serve: default sampling parameters from {}: {} (--sampling-defaults openai ignores them)\n",
               g.source, g.sampling_summary());
  }
  return d;
}

// The routed experts' format as served (fp4moe:model_info's expert_weights, for analyze): --dummy-weights with
// --load-format dummy, else the checkpoint's (the embedded default model's experts are NVFP4); nullopt when the
// config could not be read.
std::optional<WeightFormat> served_expert_weights(const ServeArgs& a, const std::optional<model::ModelConfig>& cfg) {
  if (a.model_dir.empty()) return WeightFormat::kNvfp4;
  if (model::parse_load_format(a.load_format) == model::LoadFormat::kDummy) {
    return model::parse_dummy_weights(a.dummy_weights) == model::DummyWeights::kNVFP4 ? WeightFormat::kNvfp4
                                                                                      : WeightFormat::kBf16;
  }
  if (!cfg) return std::nullopt;
  return checkpoint_weight_format(*cfg);
}

// --max-http-threads 0 (the default): max(2048, --http-threads).
int effective_max_http_threads(const ServeArgs& a) {
  return a.max_http_threads > 0 ? a.max_http_threads : std::max(2048, a.http_threads);
}

nlohmann::json launch_args(const ServeArgs& a) {
  return {{"model_path", a.model_dir.empty() ? std::string("(embedded default)") : a.model_dir},
          {"tokenizer_path", a.tokenizer_path.empty() ? a.model_dir : a.tokenizer_path},
          {"chat_template", a.chat_template.empty() ? nlohmann::json(nullptr) : nlohmann::json(a.chat_template)},
          {"device", a.device.device},
          {"mem_fraction_static", a.mem_fraction_static > 0.0 ? nlohmann::json(a.mem_fraction_static) : nullptr},
          {"cuda_graph_max_bs", a.device.disable_cuda_graph ? 0 : a.device.cuda_graph_max_bs},
          {"load_format", a.load_format},
          {"dummy_weights", a.dummy_weights},
          {"random_seed", a.seed},
          {"http_threads", a.http_threads},
          {"max_http_threads", effective_max_http_threads(a)},
          {"api_key", a.api_key.empty() ? "" : "(set)"},  // never the key itself
          {"reasoning_parser", a.reasoning_parser},
          {"tool_call_parser", a.tool_call_parser},
          {"sampling_defaults", a.sampling_defaults},
          {"constrained_json_whitespace_pattern", a.constraints.json_whitespace},
          {"decode_log_interval", a.decode_log_interval},
          {"watchdog_timeout", a.watchdog_timeout_s},
          {"drain_timeout", a.drain_timeout_s}};
}

// The parser formats --tool-call-parser / --reasoning-parser name; fails naming the known ones (CLI11 puts the flag in
// front: the options check with these).
const server::ToolCallFormat* tool_call_parser_named(const std::string& name) {
  const server::ToolCallFormat* f = server::find_tool_call_format(name);
  if (f == nullptr)
    FP4MOE_FAIL() << "tool-call parser \"" << name << "\" is not one of: " << server::tool_call_format_names();
  return f;
}
const server::ReasoningFormat* reasoning_parser_named(const std::string& name) {
  const server::ReasoningFormat* f = server::find_reasoning_format(name);
  if (f == nullptr)
    FP4MOE_FAIL() << "reasoning parser \"" << name << "\" is not one of: " << server::reasoning_format_names();
  return f;
}

void run_serve(ServeArgs a) {
  check_device_options(a.device);  // a bad value fails before the socket opens, with every model
  FP4MOE_CHECK(a.port >= 0 && a.port < 65536) << "--port " << a.port << " is not 0..65535";
  if (!(a.watchdog_timeout_s >= 0 && a.watchdog_timeout_s <= 1e9))
    FP4MOE_FAIL() << "--watchdog-timeout " << a.watchdog_timeout_s << " must be a time in [0, 1e+09] seconds (0: none)";
  if (a.decode_log_interval < 0)
    FP4MOE_FAIL() << "--decode-log-interval " << a.decode_log_interval << " must be >= 0 (0: no batch log)";
  // (CLI11's IsMember gives the level as listed, lower case, whatever case was typed.)
  if (a.log_level != "debug" && a.log_level != "info") a.decode_log_interval = 0;  // the batch lines are info lines
  check_quantization_flag(a);
  a.engine.schedule_policy = engine::parse_schedule_policy(a.schedule_policy);
  // SGLang's flags: --enable-priority-scheduling orders by priority, higher values first unless
  // --schedule-low-priority-values-first (vLLM's --scheduling-policy priority: lower first).
  if (a.enable_priority_scheduling) a.engine.schedule_policy = engine::SchedulePolicy::kPriority;
  if (a.schedule_low_priority_values_first && a.engine.schedule_policy != engine::SchedulePolicy::kPriority)
    throw Error(
        "--schedule-low-priority-values-first orders priority scheduling: it needs "
        "--enable-priority-scheduling (or --schedule-policy priority)");
  a.engine.priority_low_first = !a.enable_priority_scheduling || a.schedule_low_priority_values_first;
  a.engine.absent_priority_last = a.enable_priority_scheduling;
  // SGLang's priority preemption: on with --enable-priority-scheduling (threshold 10) unless
  // --disable-priority-preemption; with vLLM's --schedule-policy priority only when a threshold is given.
  const bool priority = a.engine.schedule_policy == engine::SchedulePolicy::kPriority;
  if ((a.preemption_threshold || a.disable_priority_preemption) && !priority)
    throw Error(std::string(a.preemption_threshold ? "--priority-scheduling-preemption-threshold"
                                                   : "--disable-priority-preemption") +
                " sets how waiting requests preempt running ones by priority: it needs "
                "--enable-priority-scheduling (or --schedule-policy priority)");
  if (a.preemption_threshold && a.disable_priority_preemption)
    throw Error(
        "--priority-scheduling-preemption-threshold and --disable-priority-preemption contradict each other: give "
        "one");
  if (!a.disable_priority_preemption && (a.preemption_threshold || a.enable_priority_scheduling))
    a.engine.priority_scheduling_preemption_threshold = a.preemption_threshold.value_or(10);
  if (a.default_priority && !a.enable_priority_scheduling)
    throw Error(
        "--default-priority-value is the priority of requests that name none under SGLang's "
        "--enable-priority-scheduling: it needs that flag (vLLM's --schedule-policy priority reads none as 0)");
  a.engine.default_priority = a.default_priority;
  with_flag_names([&] { a.engine.validate(); });  // named by their flags, before the model loads
  if (a.mem_fraction_given && !(a.mem_fraction_static > 0.0 && a.mem_fraction_static <= 1.0))
    FP4MOE_FAIL() << "--mem-fraction-static " << a.mem_fraction_static << " must be in (0, 1]";
  if (a.mem_fraction_given && model::parse_device(a.device.device) == model::Device::kCpu) {
    // The cpu's KV cache grows with each sequence up to --max-total-tokens: nothing to size from GPU memory.
    fmt::print(stderr,
               "fp4moe serve: --mem-fraction-static is read with --device cuda only; the cpu's KV capacity is "
               "--max-total-tokens ({} tokens)\n",
               a.engine.max_total_tokens);
    a.mem_fraction_static = 0.0;
  }
  // Bounded: past ~9.2e9 s the deadline overflowed steady_clock and the drain ended at once.
  constexpr double kMaxDrainS = 1e9;
  FP4MOE_CHECK(a.drain_timeout_s >= 0 && a.drain_timeout_s <= kMaxDrainS)
      << "--drain-timeout " << a.drain_timeout_s << " must be a time in [0, " << kMaxDrainS << "] seconds";
  const server::ToolCallFormat* tool_calls =
      a.tool_call_parser.empty() ? nullptr : tool_call_parser_named(a.tool_call_parser);
  const server::ReasoningFormat* reasoning =
      a.reasoning_parser.empty() ? nullptr : reasoning_parser_named(a.reasoning_parser);
  try {
    // As the schemas use it (in a group); a bad pattern fails before the socket opens.
    engine::compile_regex("(?:" + a.constraints.json_whitespace + ")");
  } catch (const fp4moe::Error& e) {
    FP4MOE_FAIL() << "--constrained-json-whitespace-pattern: " << e.what();
  }
  model::parse_load_format(a.load_format);  // bad values fail before the socket opens
  model::parse_dummy_weights(a.dummy_weights);
  // A --chat-template file that cannot be read or a template that does not parse: before the socket opens.
  if (!a.chat_template.empty()) chat_template_from_flag(a.chat_template, nullptr);

  // Signals are taken by one thread with sigwait; every other thread (httplib's pool, the engine)
  // inherits the blocked mask. A client that vanishes must not kill the process with SIGPIPE.
  std::signal(SIGPIPE, SIG_IGN);
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGTERM);
  sigaddset(&stop_signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);

  server::ServerOptions so;
  so.host = a.host;
  so.port = a.port;
  so.n_http_threads = a.http_threads;
  so.max_http_threads = effective_max_http_threads(a);
  so.served_model_name = !a.served_model_name.empty() ? a.served_model_name
                         : a.model_dir.empty()        ? std::string(engine::kDefaultModelName)
                                                      : fs::path(a.model_dir).lexically_normal().filename().string();
  if (so.served_model_name.empty()) so.served_model_name = fs::path(a.model_dir).parent_path().filename().string();
  const std::optional<model::ModelConfig> early = early_config(a);
  so.launch_args = launch_args(a);
  so.version = tune::build_id();
  if (const std::optional<WeightFormat> w = served_expert_weights(a, early))
    so.launch_args["expert_weights"] = to_string(*w);
  so.api_key = a.api_key;
  so.log_requests_level = a.log_requests ? a.log_requests_level : -1;
  so.reasoning = reasoning;
  so.tool_calls = tool_calls;
  so.constraints = a.constraints;
  so.sampling_defaults = sampling_defaults(a, early);
  server::HttpServer http(so);
  http.bind();
  http.start();
  fmt::print(stderr, "fp4moe serve: listening on http://{}:{}, loading {}\n", a.host, http.port(),
             a.model_dir.empty() ? std::string("the embedded default model") : a.model_dir);

  std::mutex mu;
  std::condition_variable cv;
  bool stop = false;
  bool loaded = false;
  int signal_number = 0;
  std::thread signals([&] {
    int sig = 0;
    sigwait(&stop_signals, &sig);
    bool was_loaded = false;
    {
      std::lock_guard<std::mutex> lock(mu);
      stop = true;
      signal_number = sig;
      was_loaded = loaded;
    }
    cv.notify_all();
    if (!was_loaded) {
      // Nothing is running yet: there is nothing to drain.
      fmt::print(stderr, "fp4moe serve: signal {} during the model load; exiting\n", sig);
      std::_Exit(0);
    }
    // SIGINT while draining (a second Ctrl-C): exit now, as SGLang / vLLM (uvicorn) do. A repeated SIGTERM only
    // asks for what is under way (`timeout` and some supervisors send it to the process and to its group).
    for (;;) {
      sigwait(&stop_signals, &sig);
      if (sig == SIGINT) break;
      fmt::print(stderr, "fp4moe serve: signal {} again: already draining (SIGINT exits at once)\n", sig);
    }
    fmt::print(stderr, "fp4moe serve: SIGINT while draining; exiting without waiting for the requests\n");
    std::_Exit(1);
  });
  signals.detach();

  if (a.debug_load_delay_s > 0) std::this_thread::sleep_for(std::chrono::duration<double>(a.debug_load_delay_s));
  Loaded l = load(a);
  const auto& cfg = l.model->config();
  if (const std::string kv = l.model->describe_kv_pool(); !kv.empty()) fmt::print(stderr, "fp4moe serve: {}\n", kv);
  // The pool sized from GPU memory: the engine's block accounting is the pool the model made.
  if (a.mem_fraction_static > 0.0 && l.model->kv_pool_tokens() > 0)
    a.engine.max_total_tokens = l.model->kv_pool_tokens();
  if (a.decode_log_interval > 0) {  // SGLang's batch lines on stderr (server/batch_log.h)
    auto log = std::make_shared<server::BatchLog>(
        a.decode_log_interval, a.engine.max_total_tokens / a.engine.page_size * a.engine.page_size,
        [](const std::string& line) { std::fprintf(stderr, "%s\n", line.c_str()); });
    a.engine.step_observer = [log](const engine::StepInfo& s) { log->on_step(s, server::BatchLog::Clock::now()); };
  }
  auto eng = std::make_shared<engine::Engine>(a.engine, std::move(l.model), l.tokenizer);
  eng->start();
  // SGLang refuses to start when its warm-up request fails: a server whose every request would fail
  // must not answer /health with 200.
  if (std::optional<std::string> failed = eng->wait_warm_up())
    FP4MOE_FAIL() << "the model's warm-up forward (one token) failed, so the server does not start: " << *failed;
  http.set_engine(eng, l.chat_template);
  if (a.watchdog_timeout_s > 0) {
    // SGLang's --watchdog-timeout: a step (a forward) that runs longer is taken for a hung GPU or kernel; the process
    // exits (status 3) so that a supervisor restarts it, rather than holding every client until its timeout.
    std::thread([eng, timeout = a.watchdog_timeout_s] {
      const auto poll = std::chrono::duration<double>(std::clamp(timeout / 4, 1e-3, 1.0));
      while (true) {
        std::this_thread::sleep_for(poll);
        const double s = eng->running_step_seconds();
        if (s > timeout) {
          fmt::print(stderr,
                     "fp4moe serve: watchdog: the engine's current step has run {:.1f} s, past --watchdog-timeout {} "
                     "s: the forward is taken to be hung; exiting (status 3) for a supervisor to restart the server\n",
                     s, timeout);
          std::fflush(stderr);
          std::_Exit(3);
        }
      }
    }).detach();
  }
  {
    std::lock_guard<std::mutex> lock(mu);
    loaded = true;
  }
  fmt::print(stderr,
             "fp4moe serve: ready: {} ({}, vocab {}, context {}, KV {} tokens), max running {}, chat template {}\n",
             so.served_model_name, cfg.architecture, cfg.vocab_size, eng->context_length(), eng->kv_capacity_tokens(),
             a.engine.max_running_requests, l.chat_template ? "yes" : "none");

  {
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&] { return stop; });
  }
  fmt::print(stderr, "fp4moe serve: signal {}: draining running requests\n", signal_number);
  http.shutdown(/*drain=*/true, a.drain_timeout_s);
  const engine::EngineStats s = eng->stats();
  fmt::print(stderr, "fp4moe serve: stopped after {} requests ({} prompt tokens, {} generated)\n",
             s.requests_finished_total, s.prompt_tokens_total, s.generation_tokens_total);
}

// What other servers' command lines say that fp4moe takes (docs/server.md, "Other servers' flags"): flags whose
// meaning always holds here (no effect), and values checked against what fp4moe does. Aliases of fp4moe's own
// flags sit on those flags.
void add_compat_options(CLI::App& cmd, ServeArgs& a, CLI::Option* no_cache) {
  const std::string group = "SGLang / vLLM flags taken as they are meant";
  struct Always {
    const char* flag;
    const char* why;
  };
  for (const Always& f :
       {Always{"--trust-remote-code", "fp4moe runs no code from a checkpoint"},
        Always{"--enable-metrics", "/metrics is always served"},
        Always{"--enable-cache-report", "usage always has prompt_tokens_details.cached_tokens"},
        Always{"--disable-overlap-schedule", "the engine schedules between forwards, not beside them"},
        Always{"--enable-chunked-prefill", "chunked prefill is on unless --chunked-prefill-size <= 0"},
        Always{"--disable-log-requests", "requests are logged only with --log-requests"}}) {
    cmd.add_flag(f.flag, a.no_effect_flag, std::string("No effect: ") + f.why)->group(group);
  }
  cmd.add_flag("--enable-prefix-caching", a.no_effect_flag,
               "No effect: the prefix cache is on unless --disable-radix-cache")
      ->group(group)
      ->excludes(no_cache);
  cmd.add_option("--dtype", a.dtype, "auto, bfloat16 or bf16: activations are bf16 (the weights' own format is read)")
      ->group(group)
      ->check(parsed_by([](const std::string& v) { check_bf16_flag(v, "activations are bf16 (W4A16)"); }));
  cmd.add_option("--kv-cache-dtype", a.kv_cache_dtype, "auto, bfloat16 or bf16: the KV cache is bf16")
      ->group(group)
      ->check(parsed_by([](const std::string& v) { check_bf16_flag(v, "the KV cache is bf16 (no fp8 KV cache)"); }));
  cmd.add_option("--quantization", a.quantization,
                 "modelopt_fp4: the model must be NVFP4 (a ModelOpt NVFP4 checkpoint, --dummy-weights nvfp4, or the "
                 "default model); an error otherwise, instead of serving its BF16 weights")
      ->group(group)
      ->check(parsed_by([](const std::string& v) {
        if (v != "modelopt_fp4")
          throw Error(v +
                      " is not served: fp4moe serves ModelOpt NVFP4 checkpoints (modelopt_fp4) and BF16 ones (no "
                      "--quantization)");
      }));
  cmd.add_flag_callback(
         "--disable-log-stats", [&a] { a.decode_log_interval = 0; },
         "vLLM's: no periodic throughput lines (here the scheduler's batch lines: --decode-log-interval 0)")
      ->group(group);
  cmd.add_option("--log-level", a.log_level,
                 "debug, info (the default), warning, error or critical: warning and above leave out the scheduler's "
                 "batch lines (info lines in SGLang; --decode-log-interval 0)")
      ->group(group)
      ->check(CLI::IsMember({"debug", "info", "warning", "error", "critical"}, CLI::ignore_case));
}

}  // namespace

void register_serve_command(CLI::App& app) {
  auto a = std::make_shared<ServeArgs>();
  CLI::App* cmd = app.add_subcommand("serve", "HTTP server: SGLang /generate and the OpenAI API over the engine");
  // vLLM's `vllm serve MODEL`: the model as the first positional argument.
  auto positional_model = std::make_shared<std::string>();
  CLI::Option* model_word =
      cmd->add_option("model", *positional_model, "The model, as --model (vLLM's `vllm serve MODEL`)")
          ->group("SGLang / vLLM flags taken as they are meant");
  CLI::Option* model_flag =
      cmd->add_option("--model,--model-path", a->model_dir,
                      "Model directory, or a preset with --load-format dummy (glm5-shard, glm5-small, glm45-air-shard; "
                      "then --tokenizer-path); default: the embedded synthetic GLM-5 model");
  cmd->add_option("--tokenizer-path,--tokenizer", a->tokenizer_path,
                  "Tokenizer directory (default: the model directory)");
  cmd->add_option(
      "--chat-template", a->chat_template,
      "Chat template for /v1/chat/completions instead of the model's: a Jinja file, or the template itself");
  cmd->add_option("--served-model-name", a->served_model_name, "Model name in responses and /v1/models");
  cmd->add_option("--api-key", a->api_key,
                  "Clients must send Authorization: Bearer <key> (all routes but /health, /health_generate, /metrics); "
                  "or the environment's FP4MOE_API_KEY, which keeps the key out of the process list")
      ->envname("FP4MOE_API_KEY");
  cmd->add_option("--host", a->host, "Address to listen on (default 127.0.0.1)");
  cmd->add_option("--port", a->port, "Port (default 30000; 0 = any free port)");
  add_device_options(*cmd, a->device);
  cmd->add_option("--max-running-requests,--max-num-seqs", a->engine.max_running_requests,
                  "Requests in the running batch (default 16)");
  CLI::Option* max_total_tokens =
      cmd->add_option("--max-total-tokens", a->engine.max_total_tokens,
                      "KV cache capacity in tokens (default 32768; with --mem-fraction-static the most it may have)");
  CLI::Option* mem_fraction = cmd->add_option(
      "--mem-fraction-static,--gpu-memory-utilization", a->mem_fraction_static,
      "cuda: size the KV cache from GPU memory: this share (0, 1] of the memory free at start holds the "
      "weights, step buffers and KV cache, the cache getting what the load leaves (SGLang's option; vLLM's "
      "name; e.g. 0.88); default: --max-total-tokens");
  cmd->add_option("--page-size,--block-size", a->engine.page_size, "Tokens per KV block (default 16)");
  CLI::Option* chunked = cmd->add_option(
      "--chunked-prefill-size", a->engine.chunked_prefill_size,
      "Max prompt tokens per step over all requests, a longer prompt continuing in the next steps (SGLang's; "
      "default: 512 on the cpu, --max-prefill-tokens on cuda; <= 0: no chunking)");
  cmd->add_option("--max-prefill-tokens", a->engine.max_prefill_tokens,
                  "Max prompt tokens per step, chunked or not (default 4096)");
  cmd->add_option("--stream-interval", a->engine.stream_interval,
                  "Streamed requests get their first token at once, then tokens in groups of this many (fewer "
                  "chunks and callbacks at large batches; SGLang's option; default 1)");
  cmd->add_option("--num-continuous-decode-steps", a->engine.num_continuous_decode_steps,
                  "Decode steps back to back without re-scheduling while nothing waits (default 1)");
  cmd->add_option("--max-queued-requests", a->engine.max_queued_requests,
                  "Waiting-queue bound; beyond it requests get 503 + Retry-After (default 1024)");
  cmd->add_option("--context-length,--max-model-len", a->engine.context_length,
                  "Max prompt + output tokens (default: the model's)");
  cmd->add_option("--schedule-policy,--scheduling-policy", a->schedule_policy,
                  "fcfs (default) or priority (requests' priority field, lower first; preemption takes the largest)")
      ->check(parsed_by([](const std::string& v) { engine::parse_schedule_policy(v); }));
  cmd->add_flag("--enable-priority-scheduling", a->enable_priority_scheduling,
                "SGLang's: order admission and preemption by requests' priority field, higher values first (the "
                "priority policy; --schedule-policy priority orders lower first, as vLLM)");
  cmd->add_flag("--schedule-low-priority-values-first", a->schedule_low_priority_values_first,
                "SGLang's: with --enable-priority-scheduling, lower priority values first");
  cmd->add_option("--priority-scheduling-preemption-threshold", a->preemption_threshold,
                  "SGLang's: a waiting request that finds no slot or KV room preempts running requests whose "
                  "priority is worse than its own by more than this (default 10 with --enable-priority-scheduling; "
                  "with --schedule-policy priority only when given)");
  cmd->add_flag("--disable-priority-preemption", a->disable_priority_preemption,
                "SGLang's: with --enable-priority-scheduling, priorities order the queue only; no running request is "
                "preempted to admit a waiting one");
  cmd->add_option("--default-priority-value", a->default_priority,
                  "SGLang's: with --enable-priority-scheduling, the priority of a request that names none (default: "
                  "after every request that names one)");
  cmd->add_option("--schedule-conservativeness", a->engine.schedule_conservativeness,
                  "Room admission keeps for running requests' future tokens, as SGLang's: their remaining max tokens "
                  "x a ratio starting at 0.7 x this (decaying over decode steps, raised after a retraction); higher "
                  "retracts less, lower admits more (default 1; 0: none kept)");
  cmd->add_option("--tool-call-parser", a->tool_call_parser,
                  "Accept chat tools (rendered by the chat template) and return the reply's calls as tool_calls: "
                  "glm45 (GLM-4.5 and GLM-5: <tool_call>name <arg_key>k</arg_key><arg_value>v</arg_value></tool_call>)")
      ->check(parsed_by([](const std::string& v) { tool_call_parser_named(v); }));
  cmd->add_option("--constrained-json-whitespace-pattern", a->constraints.json_whitespace,
                  "Regex of the whitespace allowed between JSON tokens of json_schema replies (default "
                  "[ \\t\\n\\r]{0,20}; e.g. [ ]? for compact JSON)");
  cmd->add_option("--sampling-defaults", a->sampling_defaults,
                  "What a request's omitted temperature / top_p / top_k / min_p / repetition_penalty default to: "
                  "model (the model's generation_config.json, as SGLang; the default) or openai (1, 1, off, 0, 1)")
      ->check(CLI::IsMember({"model", "openai"}));
  cmd->add_option("--reasoning-parser", a->reasoning_parser,
                  "Split chat replies into reasoning_content (between <think> and </think>) and content: glm45 "
                  "(GLM-4.5 and GLM-5), qwen3, deepseek-r1 (requests may send separate_reasoning: false)")
      ->check(parsed_by([](const std::string& v) { reasoning_parser_named(v); }));
  CLI::Option* no_cache = cmd->add_flag_callback(
      "--disable-radix-cache,--no-enable-prefix-caching", [a] { a->engine.enable_prefix_cache = false; },
      "Do not keep finished requests' KV for later requests with the same prefix (default: kept, in whole "
      "pages, evicted least recently used first when requests need the blocks)");
  cmd->add_flag_callback(
      "--disable-device-sampling", [a] { a->engine.device_sampling = false; },
      "Sample temperature / top-k / top-p / min-p requests on the host from copied logits rows (default: on the "
      "GPU with --device cuda)");
  cmd->add_option("--load-format", a->load_format, "auto (checkpoint) or dummy (random weights)")
      ->check(parsed_by([](const std::string& v) { model::parse_load_format(v); }));
  CLI::Option* dummy_weights =
      cmd->add_option("--dummy-weights", a->dummy_weights, "Dummy weight format: bf16 or nvfp4 (default bf16)")
          ->check(parsed_by([](const std::string& v) { model::parse_dummy_weights(v); }));
  cmd->add_option("--seed,--random-seed", a->seed, "Seed of the dummy weights (--load-format dummy, the default model) (default 0)")->check(unsigned_64());
  cmd->add_option("--http-threads", a->http_threads, "HTTP worker threads kept, one per open connection (default 128)");
  cmd->add_option(
      "--max-http-threads", a->max_http_threads,
      "HTTP worker threads grown to while connections wait (default max(2048, --http-threads)); beyond, they "
      "queue");
  cmd->add_option("--drain-timeout", a->drain_timeout_s,
                  "Seconds SIGTERM lets running and queued requests finish before aborting the rest (default 600); "
                  "SIGINT while draining exits at once");
  CLI::Option* log_requests = cmd->add_flag(
      "--log-requests", a->log_requests,
      "SGLang's: a stderr line per generation request when it ends (rid, route, token counts, finish reason, "
      "latencies; \"Abort:\" when the client left), detailed by --log-requests-level");
  cmd->add_option("--log-requests-level", a->log_requests_level,
                  "0: that metadata; 1: + the request body without its prompt (the sampling fields as sent); 2 (the "
                  "default): + the body and the output text, each cut to 2,048 bytes; 3: + both whole")
      ->check(CLI::Range(0, server::kRequestLogMaxLevel))
      ->needs(log_requests);
  cmd->add_option("--decode-log-interval", a->decode_log_interval,
                  "Log a \"Decode batch.\" line (running requests, KV tokens and usage, gen throughput, queue) every N "
                  "decode steps and a \"Prefill batch.\" line every prefill step on stderr, as SGLang's scheduler "
                  "(default 40; 0: no batch lines)");
  cmd->add_option("--watchdog-timeout", a->watchdog_timeout_s,
                  "Seconds one engine step (a forward) may run before the server takes the GPU or kernel to be hung "
                  "and exits with status 3 for a supervisor to restart it (SGLang's; default 300; 0: never)");
  cmd->add_option("--debug-load-delay", a->debug_load_delay_s, "Seconds to wait before loading (tests of /health)")
      ->group("Debug");
  cmd->add_option("--debug-step-delay", a->engine.debug_step_delay_s,
                  "Seconds every engine step sleeps before its forward (tests of --watchdog-timeout)")
      ->group("Debug");
  add_compat_options(*cmd, *a, no_cache);
  auto tp_ep = std::make_shared<std::pair<int, int>>(1, 1);  // --tp-size, --ep-size: docs/parallel.md
  cmd->add_option("--tp-size,--tp,--tensor-parallel-size", tp_ep->first,
                  "GPUs (one process each) for tensor parallelism (default 1)");
  cmd->add_option("--ep-size,--ep,--expert-parallel-size", tp_ep->second,
                  "Ranks the routed experts are spread over; divides --tp-size (default 1)");
  cmd->callback([a, tp_ep, max_total_tokens, mem_fraction, chunked, dummy_weights, positional_model, model_word,
                 model_flag] {
    if (model_word->count() > 0) {
      if (model_flag->count() > 0 && a->model_dir != *positional_model)
        throw Error("the model is given twice, " + *positional_model + " and --model " + a->model_dir + ": give one");
      a->model_dir = *positional_model;
    }
    require_dummy_load({dummy_weights}, a->load_format);
    // cuda: the step's whole prefill budget by default (SGLang's GPU defaults are 2-16k tokens a step; the cpu's
    // 512 keeps its steps short).
    if (chunked->count() == 0 && a->device.device == "cuda")
      a->engine.chunked_prefill_size = a->engine.max_prefill_tokens;
    a->max_total_tokens_given = max_total_tokens->count() > 0;
    a->mem_fraction_given = mem_fraction->count() > 0;
    dist::check_serve_parallel(tp_ep->first, tp_ep->second);  // validated; > 1 refused until multi-GPU serving exists
    run_serve(*a);
  });
}

}  // namespace fp4moe::tools
