// engine::Engine: the serving engine. One inference thread owns the model, the per-sequence KV states,
// the KV block accounting and the running batch; other threads talk to it only through submit(),
// abort(), stats() and run_health_probe(), which touch mutex-guarded queues and snapshots.
//
//   auto engine = std::make_unique<Engine>(EngineOptions{}, make_default_model(), make_default_tokenizer());
//   engine->start();
//   SubmitResult r = engine->submit({prompt_ids, sampling}, [](const RequestOutput& out) { ... });
//   if (!r.ok()) reply_error(r.rejection->kind, r.rejection->message);
//   ...
//   engine->shutdown(/*drain=*/true);
//
// Each step (continuous batching, SGLang's levers, ../shared/spec/serving-anchors.md):
//   1. drop aborted requests (their KV blocks are freed);
//   2. admit waiting requests FCFS while max_running_requests and the KV blocks allow; a step carries at
//      most min(max_prefill_tokens, chunked_prefill_size) prefill tokens over all requests (SGLang's chunk
//      budget), a prompt longer than what is left of it continuing in the next steps;
//   3. every running request that has finished its prefill gets one decode token;
//   4. all of it goes through ONE CausalLM::forward, then each request samples, streams its
//      RequestOutput (token, logprobs, incremental text) and maybe finishes.
// After a decode-only step, up to num_continuous_decode_steps - 1 further decode-only steps run back
// to back without admitting anything, but only while nothing waits, no abort is pending and no
// running request is mid-prefill (checked before each extra step), so a request that arrives during
// such a run is admitted at the next step: its first token is delayed by at most one decode step
// (StepInfo::continuous shows which steps ran unscheduled). With N > 1 a request's tokens after its
// first are delivered to its callback once per run (at its end, or with its finishing event) instead
// of once per step, like SGLang's / TRT-LLM's stream interval: fewer wake-ups of the HTTP threads,
// the same tokens and text; first tokens are always delivered at once.
//
// KV memory: the CPU model keeps each sequence's KV contiguous (model/kv_cache.h); the engine's
// KvBlockAllocator (kv_blocks.h) is the accounting that bounds it: max_total_tokens tokens in
// blocks of page_size tokens. A request holds ceil(tokens_in_kv / page_size) blocks and reserves the
// next block before a step writes into it. When blocks run out, waiting requests stay waiting; when
// a running request cannot grow, the newest running request is preempted by recompute (its blocks
// and KV state are freed, it goes back to the front of the waiting queue with prompt + generated
// tokens as its new prompt; streamed output is unchanged, greedy outputs identical).
// Prefix cache (EngineOptions::enable_prefix_cache, engine/prefix_cache.h): a request's KV (whole
// pages) is kept when its prefill completes (a copy) and when it finishes; admission copies the longest kept prefix of
// a request's tokens (KvState::copy_prefix) and prefills the rest; kept entries are evicted, least recently used first,
// before a request waits for blocks or a running one is preempted.
// A request whose prompt + max_new_tokens exceeds the KV capacity or the context length is rejected
// at submit() with both numbers.
//
// Tested by tests/engine/test_scheduler.cpp (on a scripted model: batching, chunking, KV waits,
// preemption, aborts, rejections, continuous decode gating, stop strings, the threaded engine),
// test_engine_models.cpp (golden glm5_tiny / glm4_moe_tiny greedy ids through the engine, the default
// model), test_kv_blocks.cpp and test_sampler.cpp.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "engine/sampler.h"
#include "engine/tokenizer.h"
#include "model/causal_lm.h"

namespace fp4moe::engine {

// kFcfs: waiting requests are admitted in arrival order (a preempted one first); the newest running
// request is preempted when KV blocks run out. kPriority (vLLM's --scheduling-policy priority, SGLang's
// --enable-priority-scheduling): ordered by Request::priority first (EngineOptions::priority_low_first: lower =
// sooner, as vLLM; else higher = sooner, as SGLang), then as kFcfs within a priority, and the victim of a
// preemption is the running request of the latest priority, the newest among them. With
// EngineOptions::priority_scheduling_preemption_threshold (SGLang's priority preemption) a waiting request that finds
// no slot or no KV room preempts running requests that rank below it by more than the threshold; otherwise a running
// request is never preempted to admit a waiting one.
enum class SchedulePolicy : uint8_t { kFcfs, kPriority };
SchedulePolicy parse_schedule_policy(const std::string& s);  // "fcfs" | "priority"; fails naming the value
const char* to_string(SchedulePolicy p);

// Per step, for tests and tracing (EngineOptions::step_observer, called on the inference thread).
struct StepInfo {
  int64_t step = 0;                 // 0, 1, 2, ... over the engine's life
  bool continuous = false;          // an extra decode step run without re-scheduling
  int64_t n_prefill_requests = 0;   // requests with a prefill chunk in this step
  int64_t n_prefill_tokens = 0;     // prompt tokens forwarded
  int64_t n_decode_requests = 0;    // requests advanced by one decode token
  int64_t n_cached_tokens = 0;      // tokens the requests admitted this step took from the prefix cache
  bool cuda_graph = false;          // the model ran the step as a captured CUDA graph
  int64_t n_waiting = 0;            // waiting requests after scheduling this step
  int64_t n_running = 0;            // running requests in this step
  int64_t kv_used_tokens = 0;       // blocks held by requests * page_size, after the step (not the prefix cache's)
  int64_t n_preempted = 0;          // requests preempted for KV blocks while scheduling this step
  int64_t n_priority_preempted = 0;  // running requests preempted to admit higher-priority waiting ones
  double forward_s = 0.0;           // wall time of the model forward
};

struct EngineOptions {
  int64_t max_running_requests = 16;        // requests in the running batch at once
  int64_t max_total_tokens = 32768;         // KV capacity in tokens (all requests together)
  int64_t page_size = 16;                   // tokens per KV block
  int64_t chunked_prefill_size = 512;       // max prompt tokens per step over all requests (<= 0: no chunking)
  int64_t max_prefill_tokens = 4096;        // max prompt tokens per step, chunked or not
  int64_t num_continuous_decode_steps = 1;  // decode steps back to back without re-scheduling
  // Streaming: a request's first token at once, then its tokens in groups of this many (SGLang's --stream-interval;
  // finishing events and continuous runs' ends deliver what is held once a due token is among it).
  int64_t stream_interval = 1;
  int64_t max_queued_requests = 1024;       // waiting-queue bound (submit rejects with kQueueFull)
  int64_t context_length = 0;               // max prompt + generated tokens; 0 = model's max_position_embeddings
  SchedulePolicy schedule_policy = SchedulePolicy::kFcfs;
  // kPriority's order: lower values sooner (vLLM's, and SGLang's --schedule-low-priority-values-first), or higher
  // values sooner (SGLang's --enable-priority-scheduling without that flag).
  bool priority_low_first = true;
  // SGLang's --enable-priority-scheduling: a request that names no priority comes after every one that does (its
  // scheduler gives it the lowest priority); vLLM's policy reads it as 0.
  bool absent_priority_last = false;
  // SGLang's priority preemption (--enable-priority-scheduling; --priority-scheduling-preemption-threshold, 10 by
  // default; off with --disable-priority-preemption), kPriority only: when the first waiting request finds no slot
  // (max_running_requests) or no KV room, running requests whose priority is worse than its own by more than this
  // are preempted by recompute, the worst first (the newest among equals), if those free a slot and the room it
  // needs (its whole prefill, prefix-cache hit included); otherwise it waits. Victims wait for the next step. nullopt
  // (kFcfs; vLLM's policy unless a threshold is given): a waiting request never preempts a running one.
  std::optional<int64_t> priority_scheduling_preemption_threshold;
  // SGLang's --default-priority-value: the priority the server gives a request that names none (with
  // absent_priority_last; nullopt: after every request that names one).
  std::optional<int64_t> default_priority;
  // Temperature / top-k / top-p / min-p draws by a model that supports them (the GPU models: a token
  // instead of a vocab-wide f32 row per request crosses PCIe); false: every sampled request's logits
  // come to the host (engine::Sampler). Penalties and logprobs always sample on the host.
  bool device_sampling = true;
  // A prefill chunk that computes prompt logprobs (SamplingParams::prompt_logprobs) copies its logits,
  // [tokens, vocab] f32, to the host: its tokens are capped to keep that within these bytes (at least
  // one token a chunk): 256 MiB is 433 tokens at GLM-5's vocabulary of 154,880.
  int64_t max_prompt_logits_bytes = int64_t{256} << 20;
  // Keep finished requests' KV for requests that start with the same tokens (engine/prefix_cache.h:
  // SGLang's radix cache, on by default there too; `serve --disable-radix-cache`). Only for models
  // whose states implement KvState::copy_prefix; requests computing prompt logprobs never hit.
  bool enable_prefix_cache = true;
  // SGLang's --schedule-conservativeness: admission keeps KV room for the running requests' future tokens, each
  // request's remaining max_new_tokens (at most kClipMaxNewTokens) times a new-token ratio that starts at 0.7 x this,
  // decays over decode steps to 0.14 of that and rises again after a preemption (SGLang's new_token_ratio), so that
  // a full pool does not admit requests only to retract them. 0: admit whatever prompt fits now (every growth then
  // comes from preempting).
  double schedule_conservativeness = 1.0;
  std::function<void(const StepInfo&)> step_observer;  // optional, called after every step
  double debug_step_delay_s = 0.0;  // tests: every step sleeps this long before its forward (a hung GPU, slowly)

  void validate() const;  // fails naming the field and its value
};

using RequestId = uint64_t;

struct Request {
  std::vector<TokenId> prompt_ids;  // >= 1 token
  SamplingParams sampling;
  int64_t priority = 0;  // SchedulePolicy::kPriority: lower is sooner; must be 0 under kFcfs
  // false: the request's counts and latencies stay out of EngineStats' request counters and histograms (as
  // SGLang's log_metrics: the /health_generate probe is not user traffic); the steps it rides in still count.
  bool log_metrics = true;
  // false: what it generates stays out of generation_tokens_total and the TTFT / inter-token histograms (the server's
  // echo without generation runs as one token that its reply drops); its request and prompt still count.
  bool count_output = true;
};

// One sampled token as streamed.
struct GeneratedToken {
  TokenId id = 0;
  float logprob = 0.0f;                       // of the chosen token (when sampling.logprobs)
  std::vector<TokenLogprob> top_logprobs;     // sampling.top_logprobs entries, most likely first
  double time_s = 0.0;                        // seconds since submit when it was sampled
};

enum class FinishReason : uint8_t {
  kStop,    // eos / stop token / stop string
  kLength,  // max_new_tokens or the context length
  kAbort,   // abort() or shutdown without drain
  kError,   // the forward failed (message in Finish::error)
};
const char* to_string(FinishReason r);  // "stop", "length", "abort", "error"

struct Usage {
  int64_t prompt_tokens = 0;
  int64_t completion_tokens = 0;
  int64_t cached_tokens = 0;  // prompt tokens whose KV came from the prefix cache (first admission)
};

struct Timings {
  double queue_s = 0.0;                 // submit -> first scheduled
  double ttft_s = 0.0;                  // submit -> first token (0 when none)
  double e2e_s = 0.0;                   // submit -> finished
  std::vector<double> token_times_s;    // per generated token, seconds since submit
};

struct Finish {
  FinishReason reason = FinishReason::kStop;
  std::optional<TokenId> matched_stop_token;    // eos or a stop_token_ids entry
  std::optional<std::string> matched_stop_str;  // the stop string that ended it
  std::string error;                            // kError only
  Usage usage;
  Timings timings;
  int64_t n_preemptions = 0;
};

// What a callback receives: zero or more new tokens with the text they complete (never text past
// a stop string; a stop string itself is not emitted), and, in the last event, `finished`.
struct RequestOutput {
  RequestId id = 0;
  std::vector<GeneratedToken> tokens;
  std::string text;
  std::optional<Finish> finished;
  // With sampling.prompt_logprobs >= 0, in the event of the first generated token: one entry per
  // prompt token (id = the prompt token), its logprob given the tokens before it and the
  // prompt_logprobs most likely tokens there; entry 0 has nothing before it (logprob NaN, no top).
  std::vector<GeneratedToken> prompt_logprobs;
};
// Called on the inference thread; keep it short (queue the output); it may call abort().
using OutputCallback = std::function<void(const RequestOutput&)>;

enum class RejectKind : uint8_t { kQueueFull, kTooLong, kBadParam, kShuttingDown };
const char* to_string(RejectKind k);  // "queue_full", "too_long", "bad_param", "shutting_down"

struct Rejection {
  RejectKind kind = RejectKind::kBadParam;
  std::string message;  // names the field / numbers, e.g. "prompt 900 + max_new_tokens 200 = 1100 tokens > ..."
  std::string field;    // the SamplingParams field a kBadParam names ("stop_token_ids"), or ""
};

struct SubmitResult {
  RequestId id = 0;
  std::optional<Rejection> rejection;
  bool ok() const { return !rejection.has_value(); }
};

// All or none: the ids of a group's requests in order, or the first rejection and the index of the
// request it names.
struct GroupSubmitResult {
  std::vector<RequestId> ids;
  std::optional<Rejection> rejection;
  size_t rejected_index = 0;
  bool ok() const { return !rejection.has_value(); }
};

// Cumulative-free histogram (Prometheus renders it cumulatively): counts[i] = observations <=
// bounds[i] and > bounds[i-1]; counts.back() = above the last bound.
struct Histogram {
  std::vector<double> bounds;
  std::vector<uint64_t> counts;  // bounds.size() + 1
  double sum = 0.0;
  uint64_t count = 0;
  explicit Histogram(std::vector<double> b = {});
  void observe(double v);
};

struct EngineStats {
  bool ready = false;
  int64_t n_running = 0;
  int64_t n_waiting = 0;
  int64_t kv_used_tokens = 0;   // blocks held by requests * page_size (not the prefix cache's: evictable)
  int64_t kv_total_tokens = 0;  // max_total_tokens rounded down to whole blocks
  int64_t page_size = 0;
  uint64_t prompt_tokens_total = 0;      // prompt tokens of admitted requests (first admission)
  uint64_t generation_tokens_total = 0;  // tokens sampled
  uint64_t requests_submitted_total = 0;
  uint64_t requests_finished_total = 0;  // any reason
  uint64_t requests_aborted_total = 0;
  uint64_t requests_rejected_total = 0;
  uint64_t preemptions_total = 0;
  // Prefix cache: prompt tokens looked up (first admissions of requests that may hit) and found.
  uint64_t prefix_cache_queries_total = 0;
  uint64_t prefix_cache_hits_total = 0;
  double new_token_ratio = 0.0;     // admission's estimate of the running requests' remaining tokens (SGLang's)
  double cache_hit_rate = 0.0;      // the last prefill step's hits / queries (SGLang's gauge)
  int64_t prefix_cache_tokens = 0;  // tokens its entries hold (whole blocks, not in kv_used_tokens)
  uint64_t steps_total = 0;
  uint64_t continuous_steps_total = 0;
  uint64_t forward_tokens_total = 0;
  double forward_seconds_total = 0.0;
  double step_seconds_total = 0.0;  // wall time of whole steps (scheduling + forward + sampling + delivery)
  Histogram ttft_s;           // seconds
  Histogram inter_token_s;    // seconds between consecutive tokens of a request
  Histogram e2e_s;            // seconds
  Histogram decode_batch_size;
  // MoE routing: per MoE layer (model layer index), tokens routed to each expert so far.
  std::vector<int64_t> moe_layers;
  std::vector<std::vector<int64_t>> expert_tokens;  // [moe_layers.size()][n_routed_experts]
  std::vector<int64_t> active_experts;               // [moe_layers.size()]: sum over steps of experts with >= 1 token
  // Per step, per MoE layer, per expert: the tokens routed to it (bounds 0, 7, 15, 63: empty, 1-7,
  // 8-15, 16-63, 64+), the distribution `fp4moe analyze` reads.
  Histogram expert_step_tokens;
  // Measured wall seconds of each layer part (model::ForwardTrace::layer_times) summed over steps,
  // sorted by (layer, part), and the number of steps that reported them.
  struct LayerPartSeconds {
    int64_t layer = 0;
    std::string part;  // "attention", "mlp", "moe"
    double seconds = 0.0;
  };
  std::vector<LayerPartSeconds> layer_seconds;
  uint64_t layer_timed_steps_total = 0;
  uint64_t cuda_graph_steps_total = 0;  // steps the model ran as a captured CUDA graph (ForwardTrace)
};

class Engine {
 public:
  Engine(EngineOptions options, std::unique_ptr<model::CausalLM> model, std::shared_ptr<const Tokenizer> tokenizer);
  ~Engine();  // shutdown(false): what is left finishes with kAbort (callbacks run, so they must still be valid)
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // Starts the inference thread (runs one warm-up forward first; is_ready() turns true after it).
  void start();
  // After start(): waits for the warm-up forward; what it threw, if it failed (a model that cannot run
  // a token; the engine still serves, each request then failing with the error).
  std::optional<std::string> wait_warm_up() const;
  // Stops accepting requests; drain = finish running and waiting ones first, else abort them
  // (their callbacks get FinishReason::kAbort). Joins the thread. Idempotent; shutdown(false) after
  // begin_drain() aborts what the drain has not finished.
  void shutdown(bool drain);
  // Stops accepting requests and lets the running and waiting ones finish, returning at once (the thread
  // ends when they have): a server's drain with a deadline, after which it calls shutdown(false).
  void begin_drain();

  // Thread-safe. Validates (bad_param), checks the lengths (too_long) and the queue (queue_full).
  SubmitResult submit(Request request, OutputCallback callback);
  // One client request's engine requests (its prompts x n choices), admitted together or not at all:
  // each is validated as by submit, then the queue must hold all of them at once (queue_full
  // otherwise), so that two groups arriving together cannot each fill the queue part way and both fail.
  struct Submission {
    Request request;
    OutputCallback callback;
  };
  GroupSubmitResult submit_group(std::vector<Submission> group);
  // Thread-safe; the request finishes with kAbort at the next step and its KV is freed. False when
  // the id is unknown or already finished.
  bool abort(RequestId id);

  bool is_ready() const;
  EngineStats stats() const;
  // /health_generate: true when the engine makes progress within `timeout`: if requests are
  // running or waiting, waits for the next completed step without adding work; else runs a
  // 1-token probe request and waits for it.
  bool run_health_probe(std::chrono::milliseconds timeout);
  // SGLang's /flush_cache: empties the prefix cache when no request runs or waits, decided at the inference thread's
  // next step (this waits for it, up to `timeout`, after which the request is withdrawn: timed_out, not flushed; in
  // manual mode it is decided at once), and otherwise leaves it, as SGLang does ("Cache not flushed because there
  // are pending requests"). Thread-safe.
  struct FlushResult {
    bool enabled = true;  // false: the engine runs without a prefix cache
    bool flushed = false;
    bool timed_out = false;  // no step came within the timeout
    int64_t n_running = 0;   // what kept it from flushing
    int64_t n_waiting = 0;
  };
  FlushResult flush_prefix_cache(std::chrono::milliseconds timeout = std::chrono::seconds(30));
  bool prefix_cache_enabled() const;

  // Manual mode (tests, tools): without start(), runs one scheduling step on the caller's thread
  // (with its continuous decode steps); returns false when there was nothing to do.
  bool step();
  // Manual mode: steps until nothing is running or waiting.
  void run_until_idle();

  const EngineOptions& options() const { return options_; }
  const model::ModelConfig& model_config() const;
  const Tokenizer& tokenizer() const { return *tokenizer_; }
  std::shared_ptr<const Tokenizer> shared_tokenizer() const { return tokenizer_; }
  int64_t context_length() const;  // options.context_length or the model's max_position_embeddings
  int64_t kv_capacity_tokens() const;
  // Thread-safe: seconds the step now running has taken so far, 0 between steps (the server's watchdog).
  double running_step_seconds() const;

 private:
  struct Impl;
  // submit's checks of one request that need no lock: bad_param and too_long.
  std::optional<Rejection> check_request(const Request& request) const;
  EngineOptions options_;
  std::shared_ptr<const Tokenizer> tokenizer_;
  std::unique_ptr<Impl> impl_;
};

}  // namespace fp4moe::engine
