// engine::Engine: continuous batching over CausalLM::forward (see engine.h for the step and the
// KV policy). Output streaming (stop strings, incremental text) lives in request_state.cpp.
// Tested by tests/engine/test_scheduler.cpp and tests/engine/test_engine_models.cpp.
#include "engine/engine.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <condition_variable>
#include <deque>
#include <future>
#include <map>
#include <mutex>
#include <sstream>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <utility>

#include "core/error.h"
#include "engine/kv_blocks.h"
#include "engine/prefix_cache.h"
#include "engine/request_state.h"

namespace fp4moe::engine {

using Clock = std::chrono::steady_clock;

SchedulePolicy parse_schedule_policy(const std::string& s) {
  if (s == "fcfs") return SchedulePolicy::kFcfs;
  if (s == "priority") return SchedulePolicy::kPriority;
  FP4MOE_FAIL() << "schedule policy \"" << s << "\" is not one of: fcfs, priority";
  return SchedulePolicy::kFcfs;
}

const char* to_string(SchedulePolicy p) {
  switch (p) {
    case SchedulePolicy::kFcfs: return "fcfs";
    case SchedulePolicy::kPriority: return "priority";
  }
  return "?";
}

const char* to_string(FinishReason r) {
  switch (r) {
    case FinishReason::kStop: return "stop";
    case FinishReason::kLength: return "length";
    case FinishReason::kAbort: return "abort";
    case FinishReason::kError: return "error";
  }
  return "?";
}

const char* to_string(RejectKind k) {
  switch (k) {
    case RejectKind::kQueueFull: return "queue_full";
    case RejectKind::kTooLong: return "too_long";
    case RejectKind::kBadParam: return "bad_param";
    case RejectKind::kShuttingDown: return "shutting_down";
  }
  return "?";
}

void EngineOptions::validate() const {
  // FieldError: the field leads its message, so a command can name its flag instead (tools::with_flag_names).
  auto at_least = [](int64_t v, int64_t lo, const char* field, const std::string& more = "") {
    if (v < lo)
      throw FieldError(field,
                       std::string(field) + " " + std::to_string(v) + " must be >= " + std::to_string(lo) + more);
  };
  at_least(max_running_requests, 1, "max_running_requests");
  at_least(page_size, 1, "page_size");
  at_least(max_total_tokens, page_size, "max_total_tokens", " (one KV page)");
  at_least(max_prefill_tokens, 1, "max_prefill_tokens");
  at_least(num_continuous_decode_steps, 1, "num_continuous_decode_steps");
  at_least(stream_interval, 1, "stream_interval");
  if (!(schedule_conservativeness >= 0 && schedule_conservativeness <= 100)) {
    std::ostringstream m;
    m << "schedule_conservativeness " << schedule_conservativeness << " must be in [0, 100]";
    throw FieldError("schedule_conservativeness", m.str());
  }
  if (!(debug_step_delay_s >= 0 && debug_step_delay_s <= 1e9)) {
    std::ostringstream m;  // named as its flag, --debug-step-delay (seconds)
    m << "debug_step_delay " << debug_step_delay_s << " must be a time in [0, 1e9] seconds";
    throw FieldError("debug_step_delay", m.str());
  }
  at_least(max_queued_requests, 1, "max_queued_requests");
  at_least(context_length, 0, "context_length", " (0 = the model's)");
  at_least(max_prompt_logits_bytes, 1, "max_prompt_logits_bytes");
  if (priority_scheduling_preemption_threshold) {
    // Negative would let equal priorities preempt each other back and forth.
    at_least(*priority_scheduling_preemption_threshold, 0, "priority_scheduling_preemption_threshold");
    if (schedule_policy != SchedulePolicy::kPriority)
      throw FieldError(
          "priority_scheduling_preemption_threshold",
          "priority_scheduling_preemption_threshold needs the priority schedule policy (this engine runs " +
              std::string(to_string(schedule_policy)) + ")");
  }
}

Histogram::Histogram(std::vector<double> b) : bounds(std::move(b)), counts(bounds.size() + 1, 0) {}

void Histogram::observe(double v) {
  const size_t i = static_cast<size_t>(std::lower_bound(bounds.begin(), bounds.end(), v) - bounds.begin());
  ++counts[i];
  sum += v;
  ++count;
}

namespace {

EngineStats empty_stats() {
  EngineStats s;
  const std::vector<double> latency = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25,
                                       0.5,   1.0,    2.5,   5.0,  10.0,  30.0, 60.0, 120.0};
  s.ttft_s = Histogram(latency);
  s.e2e_s = Histogram(latency);
  s.inter_token_s = Histogram({0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0});
  s.decode_batch_size = Histogram({1, 2, 4, 8, 16, 32, 64, 128, 256, 512});
  s.expert_step_tokens = Histogram({0, 7, 15, 63});
  return s;
}

uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

}  // namespace

struct Engine::Impl {
  Engine* self;
  std::unique_ptr<model::CausalLM> model;
  int64_t vocab = 0;
  int64_t context_length = 0;
  std::vector<TokenId> eos_ids;

  // Guarded by mu: what other threads touch.
  mutable std::mutex mu;
  std::condition_variable work_cv;      // wakes the inference thread
  std::condition_variable progress_cv;  // a step completed (health probe)
  std::deque<std::unique_ptr<RequestState>> pending;  // submitted, not yet seen by the scheduler
  std::unordered_set<RequestId> live;                 // submitted and not finished
  std::unordered_set<RequestId> abort_ids;
  RequestId next_id = 1;
  bool accepting = true;
  bool stop = false;
  bool drain = true;
  bool started = false;
  std::atomic<bool> ready{false};
  bool warmed = false;        // the warm-up forward has run (warm_cv)
  std::string warm_up_error;  // and failed with this
  std::condition_variable warm_cv;
  // flush_prefix_cache()'s callers since the last step (under mu): any of them asks the next step to decide.
  std::vector<std::shared_ptr<std::promise<Engine::FlushResult>>> flush_waiters;
  int64_t n_waiting_owned = 0;  // waiting.size(), published for submit's queue bound
  int64_t n_running_owned = 0;
  EngineStats stats;

  // Owned by the inference thread (or the manual-mode caller).
  std::deque<std::unique_ptr<RequestState>> waiting;
  std::vector<std::unique_ptr<RequestState>> running;  // admission order: oldest first
  KvBlockAllocator blocks;
  std::optional<PrefixCache> cache;  // EngineOptions::enable_prefix_cache, for models with copy_prefix
  int64_t step_index = 0;
  // SGLang's new_token_ratio (EngineOptions::schedule_conservativeness): the share of a running request's remaining
  // max_new_tokens that admission keeps room for; init_ratio while idle, decays by ratio_decay a decode step to
  // min_ratio, raised after a preemption.
  static constexpr int64_t kClipMaxNewTokens = 4096;  // SGLang's CLIP_MAX_NEW_TOKENS
  static constexpr int64_t kRetractDecodeSteps = 20;  // SGLang's RETRACT_DECODE_STEPS
  double init_ratio = 0.0, min_ratio = 0.0, ratio_decay = 0.0, new_token_ratio = 0.0;
  std::atomic<int64_t> step_started_ns{0};                // the running step's start (steady clock), 0 between steps
  std::map<int64_t, std::vector<int64_t>> expert_tokens;  // moe layer -> per-expert tokens
  std::map<int64_t, int64_t> active_experts;              // moe layer -> sum over steps of experts hit
  std::map<std::pair<int64_t, std::string>, double> layer_seconds;  // (layer, part) -> seconds
  std::thread thread;

  Impl(Engine* e, std::unique_ptr<model::CausalLM> m, const EngineOptions& o)
      : self(e), model(std::move(m)), blocks(o.max_total_tokens, o.page_size) {
    FP4MOE_CHECK(model != nullptr) << "Engine needs a model (got nullptr)";
    const model::ModelConfig& cfg = model->config();
    vocab = cfg.vocab_size;
    context_length = o.context_length > 0 ? o.context_length : cfg.max_position_embeddings;
    FP4MOE_CHECK(context_length >= 2) << "context length " << context_length << " must be >= 2";
    // As SGLang refuses without its override: positions past the model's were never trained (RoPE tables, DSA).
    FP4MOE_CHECK(context_length <= cfg.max_position_embeddings)
        << "context length " << context_length << " is past the model's max_position_embeddings "
        << cfg.max_position_embeddings << " (" << cfg.source << "): ask for at most that";
    for (int64_t t : cfg.eos_token_ids) eos_ids.push_back(static_cast<TokenId>(t));
    if (o.enable_prefix_cache && model->new_state()->copy_prefix(0) != nullptr) cache.emplace(o.page_size);
    init_ratio = std::min(0.7 * o.schedule_conservativeness, 1.0);  // SGLang's default_init_new_token_ratio
    min_ratio = init_ratio * 0.14;                                  // its base_min_new_token_ratio
    ratio_decay = (init_ratio - min_ratio) / 600;                   // over its 600 decay steps
    new_token_ratio = init_ratio;
    stats = empty_stats();
    stats.new_token_ratio = new_token_ratio;
    stats.kv_total_tokens = blocks.capacity_tokens();
    stats.page_size = blocks.page_size();
  }

  const EngineOptions& opt() const { return self->options_; }

  // ---- scheduling (inference thread) ----

  void finish(std::unique_ptr<RequestState>& r, FinishReason reason, const std::string& error = {},
              RequestOutput base = {}) {
    // The KV of what it forwarded goes to the prefix cache (not after a failed forward).
    if (cache && r->kv && reason != FinishReason::kError && r->kv_length() > 0) {
      const std::span<const TokenId> fed = r->tokens_from(0, r->kv_length());
      cache->insert(fed, std::move(r->kv), r->blocks, blocks);
    }
    blocks.release(r->blocks);
    r->kv.reset();
    RequestOutput out = r->finish(reason, error, Clock::now(), std::move(base));
    {
      std::lock_guard<std::mutex> lock(mu);
      live.erase(r->id);
      abort_ids.erase(r->id);
      if (r->log_metrics) {
        ++stats.requests_finished_total;
        if (reason == FinishReason::kAbort) ++stats.requests_aborted_total;
        stats.e2e_s.observe(out.finished->timings.e2e_s);
      }
    }
    r->emit(out);
    r.reset();
  }

  // Moves submitted requests into `waiting` and finishes aborted ones.
  void take_pending_and_aborts() {
    std::unordered_set<RequestId> aborts;
    {
      std::lock_guard<std::mutex> lock(mu);
      while (!pending.empty()) {
        waiting.push_back(std::move(pending.front()));
        pending.pop_front();
      }
      aborts = abort_ids;
    }
    order_by_priority();
    if (aborts.empty()) return;
    for (auto& r : waiting) {
      if (aborts.count(r->id)) finish(r, FinishReason::kAbort);
    }
    for (auto& r : running) {
      if (aborts.count(r->id)) finish(r, FinishReason::kAbort);
    }
    compact();
  }

  // SchedulePolicy::kPriority: waiting and running requests stably sorted by priority (lower first, or higher first
  // without priority_low_first),
  // so that admission takes waiting.front() and a preemption running.back(), as under kFcfs.
  // (Running requests only between steps: run_step walks them by index.)
  void order_by_priority(bool running_too = true) {
    if (opt().schedule_policy != SchedulePolicy::kPriority) return;
    auto by_priority = [this](const std::unique_ptr<RequestState>& a, const std::unique_ptr<RequestState>& b) {
      return ranks_before(a->priority, b->priority);
    };
    std::stable_sort(waiting.begin(), waiting.end(), by_priority);
    if (running_too) std::stable_sort(running.begin(), running.end(), by_priority);
  }

  // Priority `a` is served before priority `b` (EngineOptions::priority_low_first: lower values first, else higher).
  bool ranks_before(int64_t a, int64_t b) const { return opt().priority_low_first ? a < b : a > b; }

  void compact() {
    waiting.erase(std::remove(waiting.begin(), waiting.end(), nullptr), waiting.end());
    running.erase(std::remove(running.begin(), running.end(), nullptr), running.end());
  }

  bool pending_work() const {
    std::lock_guard<std::mutex> lock(mu);
    return !pending.empty() || !abort_ids.empty();
  }

  struct Planned {
    RequestState* req;
    int64_t n_tokens;
  };

  // Preempts running[i] by recompute: drops its work planned for this step, frees its blocks and KV, requeues it
  // first (among its priority). Returns the prompt tokens of the prefill chunk it had planned (0: none).
  int64_t preempt(size_t i, std::vector<Planned>& plan) {
    int64_t prefill_tokens = 0;
    for (const Planned& p : plan) {
      if (p.req == running[i].get() && running[i]->in_prefill()) prefill_tokens += p.n_tokens;
    }
    plan.erase(std::remove_if(plan.begin(), plan.end(), [&](const Planned& p) { return p.req == running[i].get(); }),
               plan.end());
    std::unique_ptr<RequestState> r = std::move(running[i]);
    running.erase(running.begin() + static_cast<std::ptrdiff_t>(i));
    blocks.release(r->blocks);
    r->kv.reset();
    r->preempt();
    waiting.push_front(std::move(r));
    order_by_priority(/*running_too=*/false);
    std::lock_guard<std::mutex> lock(mu);
    ++stats.preemptions_total;
    return prefill_tokens;
  }

  // SGLang's preempt_to_schedule (EngineOptions::priority_scheduling_preemption_threshold): `r`, the first waiting
  // request, needs a slot and `need` KV tokens (its whole prefill and its own future tokens) beside `growth` (the
  // running requests' future tokens) in `room`. Takes the running requests that rank below r by more than the
  // threshold, the worst first (the newest among equals), until they free a slot and enough room; if they do, preempts
  // them (dropping their planned work of this step and giving back its prefill budget) and returns true. False (nothing
  // preempted): no such set.
  bool preempt_for(const RequestState& r, int64_t need, int64_t room, int64_t& growth, std::vector<Planned>& plan,
                   int64_t& prefill_budget, std::vector<const RequestState*>& victims_out) {
    if (!opt().priority_scheduling_preemption_threshold) return false;
    const uint64_t threshold = static_cast<uint64_t>(*opt().priority_scheduling_preemption_threshold);
    // `a` ranks before `b` by more than the threshold (the distance unsigned: the absent priority is an int64 extreme).
    auto outranks = [&](int64_t a, int64_t b) {
      return ranks_before(a, b) && (a > b ? static_cast<uint64_t>(a) - static_cast<uint64_t>(b)
                                          : static_cast<uint64_t>(b) - static_cast<uint64_t>(a)) > threshold;
    };
    // Running requests worst first: by priority, then the newest (the later index: admission order within a
    // priority, and this step's admissions come last).
    std::vector<size_t> order(running.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = i;
    std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
      const int64_t pa = running[a]->priority, pb = running[b]->priority;
      return pa != pb ? ranks_before(pb, pa) : a > b;
    });
    int64_t freed_room = 0, freed_growth = 0;
    size_t n = 0;
    for (; n < order.size(); ++n) {
      const RequestState& v = *running[order[n]];
      if (!outranks(r.priority, v.priority)) return false;  // the rest rank higher still
      freed_room += static_cast<int64_t>(v.blocks.size()) * blocks.page_size();
      freed_growth += future_tokens(v);
      const int64_t left = static_cast<int64_t>(running.size() - n - 1);
      if (left < opt().max_running_requests && (left == 0 || growth - freed_growth + need <= room + freed_room)) break;
    }
    if (n == order.size()) return false;
    // Preempt from the highest index down, so the indices left stay valid.
    std::vector<size_t> victims(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(n + 1));
    std::sort(victims.rbegin(), victims.rend());
    for (size_t i : victims) {
      growth -= future_tokens(*running[i]);
      victims_out.push_back(running[i].get());
      prefill_budget += preempt(i, plan);
    }
    return true;
  }

  // The KV tokens admission keeps for a request's future output: its remaining max_new_tokens (clipped) times
  // new_token_ratio, rounded up.
  int64_t future_tokens(const RequestState& r) const {
    const int64_t left =
        std::clamp<int64_t>(r.sampling.max_new_tokens - static_cast<int64_t>(r.generated.size()), 0, kClipMaxNewTokens);
    return static_cast<int64_t>(std::ceil(static_cast<double>(left) * new_token_ratio));
  }

  // A request's next prefill chunk: its remaining prefill within the step's budget, and, while it computes
  // prompt logprobs, within max_prompt_logits_bytes of logits.
  int64_t prefill_chunk(const RequestState& r, int64_t budget) const {
    int64_t n = std::min(r.remaining_prefill(), budget);
    if (n > 0 && r.wants_prompt_logits(r.kv_length(), n)) {
      const int64_t row_bytes = vocab * static_cast<int64_t>(sizeof(float));
      n = std::min(n, std::max<int64_t>(1, opt().max_prompt_logits_bytes / row_bytes));
    }
    return n;
  }

  // One step: schedule (admit unless `continuous`), forward, sample, stream. Returns false when
  // nothing ran.
  bool run_step(bool continuous, int64_t* n_decode_out) {
    const auto t_step = Clock::now();
    step_started_ns.store(std::max<int64_t>(1, t_step.time_since_epoch() / std::chrono::nanoseconds(1)));
    struct StepEnd {
      std::atomic<int64_t>& started;
      ~StepEnd() { started.store(0); }
    } step_end{step_started_ns};
    take_pending_and_aborts();
    if (cache) answer_flush_requests();
    int64_t n_preempted = 0;
    int64_t n_cached = 0;  // prefix-cache tokens of the requests admitted now
    int64_t step_queries = 0, step_hits = 0;  // their prompt tokens looked up / found (first admissions)
    std::vector<Planned> plan;
    // The step's prefill tokens over all requests: max_prefill_tokens, and with chunked prefill at most
    // chunked_prefill_size (SGLang's chunk budget: one prefill batch's tokens, a longer prompt continuing in the
    // next steps), so that one step's prefill delays the running requests' next tokens by a bounded amount.
    int64_t prefill_budget = opt().chunked_prefill_size > 0
                                 ? std::min(opt().max_prefill_tokens, opt().chunked_prefill_size)
                                 : opt().max_prefill_tokens;

    // Running requests, oldest first: a decode token each, or their next prefill chunk (whose
    // blocks were reserved at admission). The newest gives way when blocks run out.
    for (size_t i = 0; i < running.size(); ++i) {
      RequestState* r = running[i].get();
      if (r->in_prefill()) {
        if (continuous) continue;
        const int64_t n = prefill_chunk(*r, prefill_budget);
        if (n <= 0) continue;
        prefill_budget -= n;
        plan.push_back({r, n});
        continue;
      }
      while (!reserve_evicting(r->blocks, r->kv_length() + 1)) {
        FP4MOE_CHECK(running.size() > 0) << "no running request to preempt";
        const bool self_victim = running.back().get() == r;
        preempt(running.size() - 1, plan);  // (its prefill budget, if any, stays spent: as before)
        ++n_preempted;
        if (self_victim) break;
      }
      if (i >= running.size() || running[i].get() != r) break;  // r itself was preempted
      plan.push_back({r, 1});
    }

    // Admit waiting requests FCFS while slots, prefill budget and blocks allow. The whole prefill
    // (prompt + generated, + 1 for the first sampled token) must fit in free blocks, and beside the running
    // requests' future tokens (future_tokens) its own (SGLang's PrefillAdder: rem_total_tokens).
    if (running.empty()) new_token_ratio = init_ratio;  // nothing running: SGLang resets it
    if (n_preempted > 0 && init_ratio > 0 && !running.empty()) {
      // SGLang's retract_decode: what the requests left have decoded, plus kRetractDecodeSteps each, of their
      // max_new_tokens.
      double decoded = 0, max_new = 0;
      for (const auto& q : running) {
        decoded += static_cast<double>(q->generated.size() + kRetractDecodeSteps);
        max_new += static_cast<double>(q->sampling.max_new_tokens);
      }
      new_token_ratio = std::min(1.0, decoded / std::max(max_new, 1.0));
    }
    int64_t growth = 0;  // future tokens of the running requests
    for (const auto& q : running) growth += future_tokens(*q);
    // Requests preempted in this step for a higher-priority one wait for the next step (SGLang's preempt_list): the
    // accounting that preempted them must not re-admit them beside it at once.
    std::vector<const RequestState*> preempted_now;
    if (!continuous) {
      while (!waiting.empty() && prefill_budget > 0) {
        RequestState* r = waiting.front().get();
        const bool slots_full = static_cast<int64_t>(running.size()) >= opt().max_running_requests;
        if (slots_full && !opt().priority_scheduling_preemption_threshold) break;
        if (std::find(preempted_now.begin(), preempted_now.end(), r) != preempted_now.end()) break;
        // The longest cached prefix, leaving at least one token to forward (its logits are sampled);
        // prompt logprobs need every prompt position forwarded.
        PrefixCache::Hit hit;
        const bool may_hit = cache && r->sampling.prompt_logprobs < 0;
        // A choice whose prompt its group's leader is prefilling now waits for the leader's prefill to reach the
        // cache (a whole page at least), as SGLang prefills an n > 1 prompt once.
        if (may_hit && r->prompt_leader != 0 && r->n_all_tokens() > blocks.page_size() &&
            std::any_of(running.begin(), running.end(), [&](const std::unique_ptr<RequestState>& q) {
              return q->id == r->prompt_leader && q->in_prefill();
            }))
          break;
        if (may_hit) hit = cache->lookup(r->tokens_from(0, r->n_all_tokens()), r->n_all_tokens() - 1);
        // A lone request is always admitted (submit refused one that cannot fit the pool at all).
        const int64_t own = future_tokens(*r);
        const int64_t need = r->n_all_tokens() + 1 - hit.tokens + own;
        const int64_t room = (blocks.n_free() + (cache ? cache->n_blocks() : 0)) * blocks.page_size();
        if (slots_full || (!running.empty() && growth + need > room)) {
          // The victims must free room for the whole prefill: a hit's tokens take blocks too (KvState::copy_prefix),
          // and its entry may have to be evicted for them.
          if (!preempt_for(*r, need + hit.tokens, room, growth, plan, prefill_budget, preempted_now)) break;
          continue;  // looked at again with the room freed
        }
        if (!reserve_evicting(r->blocks, r->n_all_tokens() + 1, hit.kv)) {
          // The hit's own blocks may be what the request needs (a large entry): without the hit (its
          // entry may then be evicted too) rather than never (the request would wait forever).
          if (hit.tokens == 0 || !reserve_evicting(r->blocks, r->n_all_tokens() + 1)) break;
          hit = {};
        }
        r->kv = hit.tokens > 0 ? hit.kv->copy_prefix(hit.tokens) : model->new_state();
        n_cached += hit.tokens > 0 ? r->kv_length() : 0;
        r->admitted(Clock::now());
        if (!r->counted_prompt && may_hit) {
          r->cached_tokens = std::min<int64_t>(r->kv_length(), static_cast<int64_t>(r->prompt.size()));
          if (r->log_metrics) {
            step_queries += static_cast<int64_t>(r->prompt.size());
            step_hits += r->cached_tokens;
            std::lock_guard<std::mutex> lock(mu);
            stats.prefix_cache_queries_total += static_cast<uint64_t>(r->prompt.size());
            stats.prefix_cache_hits_total += static_cast<uint64_t>(r->cached_tokens);
          }
        }
        const int64_t n = prefill_chunk(*r, prefill_budget);
        prefill_budget -= n;
        plan.push_back({r, n});
        if (!r->counted_prompt) {
          r->counted_prompt = true;
          std::lock_guard<std::mutex> lock(mu);
          if (r->log_metrics) stats.prompt_tokens_total += static_cast<uint64_t>(r->prompt.size());
        }
        growth += own;
        running.push_back(std::move(waiting.front()));
        waiting.pop_front();
      }
    }
    if (step_queries > 0) {  // SGLang's cache_hit_rate gauge: the last prefill batch's
      std::lock_guard<std::mutex> lock(mu);
      stats.cache_hit_rate = static_cast<double>(step_hits) / static_cast<double>(step_queries);
    }
    publish_counts();
    if (plan.empty()) return false;

    // One forward over every chunk.
    std::vector<model::SeqChunk> chunks;
    std::vector<std::vector<float>> logits(plan.size());
    std::vector<int32_t> argmax(plan.size(), -1);  // model-side tokens (SeqChunk::argmax, greedy or sampled)
    std::vector<model::DeviceSampling> device_draws(plan.size());
    // Prefill chunks that carry prompt logprobs (sampling.prompt_logprobs): the first position they
    // forward (-1: none); their logits are all rows, [n, vocab], and the last row is the sampled one.
    std::vector<int64_t> prompt_rows_from(plan.size(), -1);
    std::vector<uint8_t> ends_prefill(plan.size(), 0);  // a prefill chunk that completes its request's prefill
    const bool model_argmax = model->supports_argmax();
    chunks.reserve(plan.size());
    StepInfo info;
    info.step = step_index++;
    info.continuous = continuous;
    info.n_preempted = n_preempted;
    info.n_priority_preempted = static_cast<int64_t>(preempted_now.size());
    info.n_cached_tokens = n_cached;
    int64_t n_tokens = 0;
    for (size_t i = 0; i < plan.size(); ++i) {
      RequestState* r = plan[i].req;
      const bool decode = !r->in_prefill();
      if (decode) {
        ++info.n_decode_requests;
      } else {
        ++info.n_prefill_requests;
        info.n_prefill_tokens += plan[i].n_tokens;
      }
      const bool last = r->kv_length() + plan[i].n_tokens == r->n_all_tokens();
      ends_prefill[i] = !decode && last;
      const bool prompt_rows = !decode && r->wants_prompt_logits(r->kv_length(), plan[i].n_tokens);
      const bool device_draw =
          last && !prompt_rows && model_argmax && opt().device_sampling && r->sampling.device_samplable();
      const bool want_argmax = !prompt_rows && ((last && model_argmax && !r->sampling.needs_logits()) || device_draw);
      if (prompt_rows) {
        prompt_rows_from[i] = r->kv_length();
        logits[i].resize(static_cast<size_t>(plan[i].n_tokens * vocab));
      } else if (last && !want_argmax) {
        logits[i].resize(static_cast<size_t>(vocab));
      }
      if (device_draw) device_draws[i] = r->device_sampling();
      chunks.push_back({r->kv.get(), r->tokens_from(r->kv_length(), plan[i].n_tokens),
                        logits[i].empty() ? nullptr : logits[i].data(), prompt_rows, want_argmax ? &argmax[i] : nullptr,
                        device_draw ? &device_draws[i] : nullptr});
      n_tokens += plan[i].n_tokens;
    }
    model::ForwardTrace trace;
    if (opt().debug_step_delay_s > 0)
      std::this_thread::sleep_for(std::chrono::duration<double>(opt().debug_step_delay_s));
    const auto t0 = Clock::now();
    // A failed forward leaves the states unchanged. A SequenceError blames one entry: that request fails alone
    // and the others of the step run its work again next step (a device draw is held until its token is
    // appended, RequestState::device_sampling, so the re-run draws the same token); any other error fails every
    // request of the step.
    bool failed = false;
    std::string failure;
    int64_t culprit = -1;
    try {
      model->forward(chunks, &trace);
    } catch (const model::SequenceError& e) {
      failed = true;
      failure = e.what();
      if (e.entry() >= 0 && e.entry() < static_cast<int64_t>(plan.size()) && plan.size() > 1) culprit = e.entry();
    } catch (const std::exception& e) {
      failed = true;
      failure = e.what();
    }
    if (failed) {
      const std::string msg =
          culprit >= 0 ? "forward of step " + std::to_string(info.step) + " failed for this request (the other " +
                             std::to_string(plan.size() - 1) + " sequences of the step go on): " + failure
                       : "forward of step " + std::to_string(info.step) + " (" + std::to_string(plan.size()) +
                             " sequences, " + std::to_string(n_tokens) + " tokens) failed: " + failure;
      std::fprintf(stderr, "fp4moe engine: %s\n", msg.c_str());
      for (size_t i = 0; i < plan.size(); ++i) {
        if (culprit >= 0 && static_cast<int64_t>(i) != culprit) continue;
        for (auto& r : running) {
          if (r.get() == plan[i].req) finish(r, FinishReason::kError, msg);
        }
      }
      compact();
      publish_counts();
      return true;
    }
    const auto t1 = Clock::now();
    // A completed prefill goes to the prefix cache now, not only when its request finishes (SGLang's
    // cache_unfinished_req): requests sharing its prompt that arrive while it decodes find it.
    if (cache) {
      for (size_t i = 0; i < plan.size(); ++i) {
        if (ends_prefill[i]) cache_prefill(*plan[i].req);
      }
    }
    info.forward_s = std::chrono::duration<double>(t1 - t0).count();

    // Sample, stream, finish.
    for (size_t i = 0; i < plan.size(); ++i) {
      RequestState* r = plan[i].req;
      const int64_t n_rows = plan[i].n_tokens;
      if (prompt_rows_from[i] >= 0) {
        r->on_prompt_logits(prompt_rows_from[i], n_rows, logits[i].data(), vocab);
        if (prompt_rows_from[i] + n_rows != r->n_all_tokens()) continue;  // not the prefill's last chunk
      }
      if (logits[i].empty() && chunks[i].argmax == nullptr) continue;
      const int64_t before = static_cast<int64_t>(r->generated.size());
      const float* last_row = logits[i].data() + (prompt_rows_from[i] >= 0 ? (n_rows - 1) * vocab : 0);
      RequestOutput out = chunks[i].argmax != nullptr ? r->on_argmax(argmax[i], t1, eos_ids, context_length)
                                                      : r->on_logits(last_row, t1, eos_ids, context_length);
      {
        std::lock_guard<std::mutex> lock(mu);
        if (r->log_metrics && r->count_output) {
          stats.generation_tokens_total += static_cast<uint64_t>(r->generated.size() - before);
          if (before == 0) stats.ttft_s.observe(r->ttft_s());
          if (before > 0) stats.inter_token_s.observe(r->last_inter_token_s());
        }
      }
      if (r->finish_reason()) {
        for (auto& q : running) {
          if (q.get() == r)
            finish(q, *r->finish_reason(), r->finish_error(), std::move(out));  // one event: token + finished
        }
      } else {
        // --stream-interval N (SGLang's): the first token at once, then tokens 1 + N, 1 + 2N, ... bring what is held.
        // A request's own stream_interval (SGLang's sampling_params.stream_interval) goes before the server's.
        const int64_t n_out = static_cast<int64_t>(r->generated.size());
        const int64_t interval = r->sampling.stream_interval > 0 ? r->sampling.stream_interval : opt().stream_interval;
        const bool due = interval <= 1 || (n_out - 1) % interval == 0;
        if ((opt().num_continuous_decode_steps > 1 && before > 0) || !due) {
          r->hold(std::move(out), due);  // a continuous run's: delivered at its end by scheduled_step
        } else if (r->has_held()) {
          r->hold(std::move(out));
          r->flush_held();
        } else {
          r->emit(out);
        }
      }
    }
    compact();

    info.n_running = static_cast<int64_t>(running.size());
    info.n_waiting = static_cast<int64_t>(waiting.size());
    info.kv_used_tokens = request_blocks() * blocks.page_size();
    info.cuda_graph = trace.cuda_graph_steps > 0;
    for (const model::MoeLayerTrace& t : trace.moe_layers) {
      std::vector<int64_t>& acc = expert_tokens[t.layer];
      if (acc.size() < t.tokens_per_expert.size()) acc.resize(t.tokens_per_expert.size(), 0);
      for (size_t e = 0; e < t.tokens_per_expert.size(); ++e) acc[e] += t.tokens_per_expert[e];
      for (int64_t c : t.tokens_per_expert) active_experts[t.layer] += c > 0 ? 1 : 0;
    }
    for (const model::LayerTiming& t : trace.layer_times) layer_seconds[{t.layer, t.part}] += t.seconds;
    if (info.n_decode_requests > 0) new_token_ratio = std::max(new_token_ratio - ratio_decay, min_ratio);
    {
      std::lock_guard<std::mutex> lock(mu);
      ++stats.steps_total;
      stats.new_token_ratio = new_token_ratio;
      if (continuous) ++stats.continuous_steps_total;
      stats.forward_tokens_total += static_cast<uint64_t>(n_tokens);
      stats.forward_seconds_total += info.forward_s;
      stats.step_seconds_total += std::chrono::duration<double>(Clock::now() - t_step).count();
      if (info.n_decode_requests > 0) stats.decode_batch_size.observe(static_cast<double>(info.n_decode_requests));
      stats.moe_layers.clear();
      stats.expert_tokens.clear();
      stats.active_experts.clear();
      for (const auto& [layer, counts] : expert_tokens) {
        stats.moe_layers.push_back(layer);
        stats.expert_tokens.push_back(counts);
        stats.active_experts.push_back(active_experts[layer]);
      }
      for (const model::MoeLayerTrace& t : trace.moe_layers) {
        for (int64_t c : t.tokens_per_expert) stats.expert_step_tokens.observe(static_cast<double>(c));
      }
      if (!trace.layer_times.empty()) ++stats.layer_timed_steps_total;
      stats.cuda_graph_steps_total += static_cast<uint64_t>(trace.cuda_graph_steps);
      stats.layer_seconds.clear();
      for (const auto& [key, seconds] : layer_seconds) stats.layer_seconds.push_back({key.first, key.second, seconds});
    }
    publish_counts();
    progress_cv.notify_all();
    if (opt().step_observer) opt().step_observer(info);
    if (n_decode_out) *n_decode_out = info.n_prefill_requests == 0 ? info.n_decode_requests : 0;
    return true;
  }

  void publish_counts() {
    std::lock_guard<std::mutex> lock(mu);
    n_waiting_owned = static_cast<int64_t>(waiting.size());
    n_running_owned = static_cast<int64_t>(running.size());
    stats.n_running = n_running_owned;
    stats.n_waiting = n_waiting_owned + static_cast<int64_t>(pending.size());
    stats.kv_used_tokens = request_blocks() * blocks.page_size();
    stats.prefix_cache_tokens = cache ? cache->cached_tokens() : 0;
  }

  // Keeps a copy of a running request's KV (its whole pages, charged blocks of their own) unless the
  // cache already holds them or no block is free even after evicting older entries.
  void cache_prefill(const RequestState& r) {
    const int64_t n = r.kv_length() / blocks.page_size() * blocks.page_size();
    if (n == 0) return;
    const std::span<const TokenId> tokens = r.tokens_from(0, n);
    if (cache->covers(tokens)) return;
    std::vector<int32_t> table;
    if (!reserve_evicting(table, n)) return;
    std::unique_ptr<model::KvState> copy = r.kv->copy_prefix(n);
    if (!copy || !cache->insert(tokens, std::move(copy), table, blocks)) blocks.release(table);
  }

  int64_t request_blocks() const { return blocks.n_used() - (cache ? cache->n_blocks() : 0); }

  // blocks.reserve, evicting prefix cache entries (least recently used first, never the one holding
  // `keep`) while blocks are short.
  bool reserve_evicting(std::vector<int32_t>& table, int64_t n_tokens, const model::KvState* keep = nullptr) {
    while (!blocks.reserve(table, n_tokens)) {
      if (!cache || !cache->evict_one(blocks, keep)) return false;
    }
    return true;
  }

  // The /flush_cache requests since the last step: flushed when nothing runs or waits (after the pending requests were
  // taken), else refused with the counts; each waiter gets the outcome.
  void answer_flush_requests() {
    std::vector<std::shared_ptr<std::promise<Engine::FlushResult>>> waiters;
    {
      std::lock_guard<std::mutex> lock(mu);
      waiters.swap(flush_waiters);
    }
    if (waiters.empty()) return;
    Engine::FlushResult r;
    r.n_running = static_cast<int64_t>(running.size());
    r.n_waiting = static_cast<int64_t>(waiting.size());
    r.flushed = r.n_running == 0 && r.n_waiting == 0;
    if (r.flushed) {
      cache->clear(blocks);
      std::lock_guard<std::mutex> lock(mu);
      stats.prefix_cache_tokens = cache->cached_tokens();  // an idle step publishes nothing else
    }
    for (auto& w : waiters) w->set_value(r);
  }

  // A scheduled step, then up to N - 1 decode-only steps while nothing waits and every running
  // request is decoding (a new request's first token is delayed by at most one step).
  bool scheduled_step() {
    int64_t n_decode = 0;
    if (!run_step(false, &n_decode)) return false;
    for (int64_t k = 1; k < opt().num_continuous_decode_steps && n_decode > 0; ++k) {
      if (!waiting.empty() || pending_work() || running.empty()) break;
      bool all_decoding = true;
      for (const auto& r : running) all_decoding = all_decoding && !r->in_prefill();
      if (!all_decoding) break;
      n_decode = 0;
      if (!run_step(true, &n_decode)) break;
    }
    for (auto& r : running) r->flush_due();
    for (auto& r : waiting) r->flush_due();  // preempted during the run
    return true;
  }

  // Stops accepting requests and tells the loop to stop, draining first or not (a later call can only turn the
  // drain off: shutdown(false) after begin_drain() aborts what is left). Whether the thread was started.
  bool request_stop(bool drain_first) {
    bool was_started = false;
    {
      std::lock_guard<std::mutex> lock(mu);
      accepting = false;
      if (!stop) {
        stop = true;
        drain = drain_first;
      } else if (!drain_first) {
        drain = false;
      }
      was_started = started;
    }
    work_cv.notify_all();
    return was_started;
  }

  void abort_everything() {
    take_pending_and_aborts();
    for (auto& r : running) finish(r, FinishReason::kAbort);
    for (auto& r : waiting) finish(r, FinishReason::kAbort);
    running.clear();
    waiting.clear();
    publish_counts();
  }

  void warm_up() {
    auto state = model->new_state();
    const TokenId t = 0;
    std::vector<float> logits(static_cast<size_t>(vocab));
    model::SeqChunk c{state.get(), std::span<const TokenId>(&t, 1), logits.data(), false};
    model->forward(std::span<const model::SeqChunk>(&c, 1));
  }

  void loop() {
    std::string error;
    try {
      warm_up();
    } catch (const std::exception& e) {
      error = e.what();
      std::fprintf(stderr, "fp4moe engine: warm-up forward failed: %s\n", e.what());
    }
    {
      std::lock_guard<std::mutex> lock(mu);
      warmed = true;
      warm_up_error = error;
      ready = true;
    }
    warm_cv.notify_all();
    while (true) {
      const bool busy = !waiting.empty() || !running.empty();
      {
        std::unique_lock<std::mutex> lock(mu);
        if (!busy)
          work_cv.wait(lock, [&] { return stop || !pending.empty() || !abort_ids.empty() || !flush_waiters.empty(); });
        if (stop && !drain) break;
        if (stop && drain && !busy && pending.empty()) break;
      }
      try {
        // Nothing schedulable while busy cannot happen (submit() rejects what can never fit and
        // an empty batch frees every block); should it, do not spin.
        if (!scheduled_step() && busy) {
          std::unique_lock<std::mutex> lock(mu);
          work_cv.wait_for(lock, std::chrono::milliseconds(1));
        }
      } catch (const std::exception& e) {
        // A scheduling bug: fail every request rather than hang their clients.
        std::fprintf(stderr, "fp4moe engine: step failed: %s\n", e.what());
        for (auto& r : running) finish(r, FinishReason::kError, e.what());
        for (auto& r : waiting) finish(r, FinishReason::kError, e.what());
        running.clear();
        waiting.clear();
        publish_counts();
      }
    }
    abort_everything();
    if (cache) answer_flush_requests();  // a /flush_cache that came while stopping: nothing runs now
    ready = false;
  }
};

Engine::Engine(EngineOptions options, std::unique_ptr<model::CausalLM> model, std::shared_ptr<const Tokenizer> tokenizer)
    : options_(std::move(options)), tokenizer_(std::move(tokenizer)) {
  options_.validate();
  impl_ = std::make_unique<Impl>(this, std::move(model), options_);
}

Engine::~Engine() {
  try {
    shutdown(false);
  } catch (...) {
  }
}

void Engine::start() {
  std::lock_guard<std::mutex> lock(impl_->mu);
  FP4MOE_CHECK(!impl_->started) << "Engine::start() called twice";
  FP4MOE_CHECK(!impl_->stop) << "Engine::start() after shutdown()";
  impl_->started = true;
  impl_->thread = std::thread([this] { impl_->loop(); });
}

void Engine::shutdown(bool drain) {
  if (impl_->request_stop(drain)) {
    if (impl_->thread.joinable()) impl_->thread.join();
  } else {
    if (drain) run_until_idle();
    impl_->abort_everything();
  }
}

void Engine::begin_drain() { impl_->request_stop(/*drain=*/true); }

std::optional<Rejection> Engine::check_request(const Request& request) const {
  auto reject = [](RejectKind kind, std::string msg) {
    return std::optional<Rejection>(Rejection{kind, std::move(msg)});
  };
  const int64_t n_prompt = static_cast<int64_t>(request.prompt_ids.size());
  if (n_prompt == 0) return reject(RejectKind::kBadParam, "prompt is empty (0 tokens); give at least 1 token");
  for (int64_t i = 0; i < n_prompt; ++i) {
    const TokenId t = request.prompt_ids[static_cast<size_t>(i)];
    if (t < 0 || t >= impl_->vocab) {
      return reject(RejectKind::kBadParam, "prompt token " + std::to_string(t) + " at position " + std::to_string(i) +
                                               " is outside the vocabulary [0, " + std::to_string(impl_->vocab) + ")");
    }
  }
  try {
    request.sampling.validate(impl_->vocab);
  } catch (const FieldError& e) {
    return std::optional<Rejection>(Rejection{RejectKind::kBadParam, e.what(), e.field()});
  } catch (const Error& e) {  // a check that names no field
    return reject(RejectKind::kBadParam, e.what());
  }
  if (request.priority != 0 && options_.schedule_policy != SchedulePolicy::kPriority) {
    return reject(RejectKind::kBadParam, "priority " + std::to_string(request.priority) +
                                             " needs the priority schedule policy (the server runs " +
                                             to_string(options_.schedule_policy) + ")");
  }
  const int64_t total = n_prompt + request.sampling.max_new_tokens;
  if (total > impl_->context_length) {
    return reject(RejectKind::kTooLong, "prompt " + std::to_string(n_prompt) + " tokens + max_new_tokens " +
                                            std::to_string(request.sampling.max_new_tokens) + " = " +
                                            std::to_string(total) + " tokens > context length " +
                                            std::to_string(impl_->context_length));
  }
  const int64_t kv_cap = impl_->blocks.capacity_tokens();
  if (total > kv_cap) {
    return reject(RejectKind::kTooLong, "prompt " + std::to_string(n_prompt) + " tokens + max_new_tokens " +
                                            std::to_string(request.sampling.max_new_tokens) + " = " +
                                            std::to_string(total) + " tokens > KV capacity " + std::to_string(kv_cap) +
                                            " tokens (max_total_tokens " + std::to_string(options_.max_total_tokens) +
                                            ", page_size " + std::to_string(options_.page_size) + ")");
  }
  return std::nullopt;
}

SubmitResult Engine::submit(Request request, OutputCallback callback) {
  std::vector<Submission> one;
  one.push_back({std::move(request), std::move(callback)});
  GroupSubmitResult g = submit_group(std::move(one));
  SubmitResult res;
  if (g.ok()) res.id = g.ids.front();
  res.rejection = std::move(g.rejection);
  return res;
}

GroupSubmitResult Engine::submit_group(std::vector<Submission> group) {
  GroupSubmitResult res;
  auto reject = [&](size_t index, Rejection r) {
    res.rejection = std::move(r);
    res.rejected_index = index;
    std::lock_guard<std::mutex> lock(impl_->mu);
    ++impl_->stats.requests_rejected_total;
    return std::move(res);
  };
  FP4MOE_CHECK(!group.empty()) << "submit_group: an empty group";
  for (size_t i = 0; i < group.size(); ++i) {
    if (std::optional<Rejection> r = check_request(group[i].request)) return reject(i, std::move(*r));
  }
  const int64_t n = static_cast<int64_t>(group.size());
  if (n > options_.max_queued_requests) {  // never admissible: not a 503 to retry
    return reject(
        0, {RejectKind::kBadParam, std::to_string(n) + " requests admitted together exceed max_queued_requests " +
                                       std::to_string(options_.max_queued_requests)});
  }
  {
    std::unique_lock<std::mutex> lock(impl_->mu);
    if (!impl_->accepting) {
      lock.unlock();
      return reject(0, {RejectKind::kShuttingDown, "the engine is shutting down and accepts no new requests"});
    }
    const int64_t queued = impl_->n_waiting_owned + static_cast<int64_t>(impl_->pending.size());
    if (queued + n > options_.max_queued_requests) {
      lock.unlock();
      return reject(0, {RejectKind::kQueueFull,
                        "the waiting queue is full: " + std::to_string(queued) + " requests waiting + " +
                            std::to_string(n) + (n == 1 ? " new" : " new (one request's choices, admitted together)") +
                            " > max_queued_requests " + std::to_string(options_.max_queued_requests)});
    }
    std::map<std::vector<TokenId>, RequestId> first_with_prompt;  // a group's choices of one prompt (n > 1)
    for (Submission& sub : group) {
      const RequestId id = impl_->next_id++;
      const uint64_t seed = sub.request.sampling.seed ? *sub.request.sampling.seed : splitmix64(id);
      if (sub.request.log_metrics) ++impl_->stats.requests_submitted_total;
      const auto [first, inserted] = first_with_prompt.try_emplace(sub.request.prompt_ids, id);
      impl_->pending.push_back(std::make_unique<RequestState>(id, std::move(sub.request), std::move(sub.callback),
                                                              tokenizer_.get(), impl_->vocab, seed, Clock::now()));
      if (!inserted) impl_->pending.back()->prompt_leader = first->second;
      impl_->live.insert(id);
      res.ids.push_back(id);
    }
    impl_->stats.n_waiting = impl_->n_waiting_owned + static_cast<int64_t>(impl_->pending.size());
  }
  impl_->work_cv.notify_one();
  return res;
}

bool Engine::abort(RequestId id) {
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    if (!impl_->live.count(id)) return false;
    impl_->abort_ids.insert(id);
  }
  impl_->work_cv.notify_one();
  return true;
}

bool Engine::is_ready() const { return impl_->ready.load(); }

std::optional<std::string> Engine::wait_warm_up() const {
  std::unique_lock<std::mutex> lock(impl_->mu);
  FP4MOE_CHECK(impl_->started) << "Engine::wait_warm_up() before start()";
  impl_->warm_cv.wait(lock, [&] { return impl_->warmed; });
  if (impl_->warm_up_error.empty()) return std::nullopt;
  return impl_->warm_up_error;
}

bool Engine::prefix_cache_enabled() const { return impl_->cache.has_value(); }

double Engine::running_step_seconds() const {
  const int64_t started = impl_->step_started_ns.load();
  if (started == 0) return 0.0;
  const int64_t now = Clock::now().time_since_epoch() / std::chrono::nanoseconds(1);
  return static_cast<double>(std::max<int64_t>(now - started, 0)) * 1e-9;
}

Engine::FlushResult Engine::flush_prefix_cache(std::chrono::milliseconds timeout) {
  FlushResult r;
  if (!impl_->cache) {
    r.enabled = false;
    return r;
  }
  auto waiter = std::make_shared<std::promise<FlushResult>>();
  std::future<FlushResult> outcome = waiter->get_future();
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    impl_->flush_waiters.push_back(waiter);
  }
  if (!impl_->started) {  // manual mode: the caller's thread owns the queues; decide now
    impl_->take_pending_and_aborts();
    impl_->answer_flush_requests();
    return outcome.get();
  }
  impl_->work_cv.notify_one();
  if (outcome.wait_for(timeout) != std::future_status::ready) {
    // Withdrawn, so that the caller told "not flushed" is not flushed later; unless a step has taken it already,
    // which then answers at once.
    std::lock_guard<std::mutex> lock(impl_->mu);
    auto& w = impl_->flush_waiters;
    if (const auto it = std::find(w.begin(), w.end(), waiter); it != w.end()) {
      w.erase(it);
      r.timed_out = true;
      return r;
    }
  }
  return outcome.get();
}

EngineStats Engine::stats() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  EngineStats s = impl_->stats;
  s.ready = impl_->ready.load();
  return s;
}

bool Engine::run_health_probe(std::chrono::milliseconds timeout) {
  if (!is_ready()) return false;
  {
    std::unique_lock<std::mutex> lock(impl_->mu);
    const bool busy = impl_->n_running_owned + impl_->n_waiting_owned + static_cast<int64_t>(impl_->pending.size()) > 0;
    if (busy) {
      const uint64_t steps = impl_->stats.steps_total;
      return impl_->progress_cv.wait_for(lock, timeout, [&] { return impl_->stats.steps_total != steps; });
    }
  }
  auto done = std::make_shared<std::promise<bool>>();
  Request probe;
  probe.prompt_ids = {0};
  probe.sampling.max_new_tokens = 1;
  probe.sampling.temperature = 0.0;
  probe.sampling.ignore_eos = true;
  probe.log_metrics = false;  // not user traffic
  SubmitResult r = submit(std::move(probe), [done](const RequestOutput& out) {
    if (out.finished) done->set_value(out.finished->reason == FinishReason::kLength ||
                                      out.finished->reason == FinishReason::kStop);
  });
  if (!r.ok()) return r.rejection->kind == RejectKind::kQueueFull;  // overloaded, but alive
  std::future<bool> f = done->get_future();
  if (f.wait_for(timeout) != std::future_status::ready) {
    abort(r.id);
    return false;
  }
  return f.get();
}

bool Engine::step() {
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    FP4MOE_CHECK(!impl_->started) << "Engine::step() is for manual mode; start() was called";
  }
  impl_->ready = true;
  return impl_->scheduled_step();
}

void Engine::run_until_idle() {
  while (step()) {
  }
}

const model::ModelConfig& Engine::model_config() const { return impl_->model->config(); }
int64_t Engine::context_length() const { return impl_->context_length; }
int64_t Engine::kv_capacity_tokens() const { return impl_->blocks.capacity_tokens(); }

}  // namespace fp4moe::engine
