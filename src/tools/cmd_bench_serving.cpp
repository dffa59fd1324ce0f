// `fp4moe bench-serving`: an online serving benchmark against a running server, reporting what
// sglang.bench_serving reports (request throughput, input / output tokens/s, E2E latency, TTFT, TPOT
// and ITL mean / median / p99).
//
//   fp4moe bench-serving --url http://127.0.0.1:30000 --num-prompts 256 --max-concurrency 64
//       --input-len 128 --output-len 32 [--random-range-ratio 0.5] [--seed S]
//   fp4moe bench-serving --dataset prompts.jsonl ...   # lines {"prompt": "..."} or {"input_ids": [...]},
//                                                       # optional "output_len"
//   ... --max-concurrency 1,4,16,64 --output-file runs.jsonl --plot latency.svg
//
// Each request is a streaming POST /generate (ignore_eos; greedy, or --temperature / --top-p / --top-k
// with a per-request seed) so the output length is fixed; TTFT
// is the time to the first streamed token, ITL each gap between token-carrying chunks, TPOT
// (E2E - TTFT) / (output tokens - 1). Several --max-concurrency values run one after another; each
// run appends one JSON line to --output-file and is one point of the --plot SVG (output tokens/s vs
// median and p99 E2E latency). Tested by tests/server/test_server_e2e.cpp (BenchServing).
#include <CLI/CLI.hpp>
#include <fmt/core.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <memory>
#include <mutex>
#include <numeric>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <system_error>
#include <thread>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/file.h"
#include "format/json_file.h"
#include "server/http_client.h"
#include "tools/cli_options.h"
#include "tools/commands.h"
#include "tools/stream_timing.h"
#include "tune/tune_cache.h"

namespace fp4moe::tools {
namespace {

using nlohmann::json;
using Clock = std::chrono::steady_clock;

struct BenchArgs {
  // Which API the requests take (sglang.bench_serving's --backend names): sglang (SGLang's /generate), openai
  // (/v1/completions; vllm the same) or openai-chat (/v1/chat/completions: text prompts only, each one user message).
  std::string backend = "sglang";
  std::string url = "http://127.0.0.1:30000";
  std::string api_key;  // the server's --api-key
  int64_t num_prompts = 64;
  std::string max_concurrency;  // "N" or "N1,N2,..."; empty = num_prompts
  int64_t input_len = 128;
  int64_t output_len = 32;
  double range_ratio = 1.0;
  std::string dataset;
  // "random" or SGLang's "generated-shared-prefix": gsp_groups x gsp_prompts_per_group prompts, each a
  // group's random system prompt + its own random question (what the prefix cache is for).
  std::string dataset_name = "random";
  int64_t gsp_groups = 64, gsp_prompts_per_group = 16, gsp_system_prompt_len = 2048, gsp_question_len = 128,
          gsp_output_len = 256;
  bool flush_cache = true;  // POST /flush_cache before each run (when the server has a prefix cache)
  uint64_t seed = 1;
  std::string output_file;
  bool output_details = false;  // --output-details: per-request lists in each --output-file line
  std::string plot;
  double timeout_s = 600;
  double temperature = 0.0;  // 0: greedy; > 0 with top_p / top_k: sampled (seeded per request)
  double top_p = 1.0;
  int64_t top_k = -1;
  // Arrivals (sglang.bench_serving's / vllm bench serve's --request-rate): requests per second, inf = all at once;
  // the gaps are drawn from a gamma distribution of shape `burstiness` (1: a Poisson process, as both draw them).
  double request_rate = std::numeric_limits<double>::infinity();
  double burstiness = 1.0;
  // --dataset-name sharegpt (sglang.bench_serving's default load): a ShareGPT JSON file's conversations, each its
  // first turn as the prompt and its second's length in tokens as the output length (or --sharegpt-output-len).
  std::string dataset_path;
  int64_t sharegpt_output_len = 0;   // 0: the second turn's length
  int64_t sharegpt_context_len = 0;  // > 0: skip conversations whose prompt + output is longer
  // sglang.bench_serving's request options: a JSON object merged into every request's body (top level, after the
  // bench's own fields), EOS honoured, whole replies instead of streams, and requests sent before the timed runs.
  std::string extra_request_body;
  json extra;  // extra_request_body parsed (run_bench)
  bool disable_ignore_eos = false;
  bool disable_stream = false;
  int64_t warmup_requests = 1;
};

// --backend: sglang.bench_serving's names (sglang / sglang-native: /generate; sglang-oai / vllm: /v1/completions;
// sglang-oai-chat / vllm-chat: /v1/chat/completions) and vllm bench serve's (openai, openai-chat).
const std::vector<std::string> kBackends = {"sglang", "sglang-native", "sglang-oai", "sglang-oai-chat",
                                            "vllm",   "vllm-chat",     "openai",     "openai-chat"};
bool is_native(const std::string& backend) { return backend == "sglang" || backend == "sglang-native"; }
bool is_chat(const std::string& backend) {
  return backend == "sglang-oai-chat" || backend == "vllm-chat" || backend == "openai-chat";
}

// When each request is sent, in seconds from the run's start: request 0 at once, then gaps of mean 1 / rate drawn
// from Gamma(burstiness, 1 / (rate x burstiness)) with a generator seeded by --seed (the same arrivals every run and
// every concurrency level). All zeros for an infinite rate.
std::vector<double> arrival_times(const BenchArgs& a, size_t n) {
  std::vector<double> t(n, 0.0);
  if (!std::isfinite(a.request_rate)) return t;
  std::mt19937_64 rng(a.seed ^ 0x5eed'a771'7a15'0000ull);
  std::gamma_distribution<double> gap(a.burstiness, 1.0 / (a.request_rate * a.burstiness));
  for (size_t i = 1; i < n; ++i) t[i] = t[i - 1] + gap(rng);
  return t;
}

// The requests' sampling flags as the server reads them (seeded per request when sampled).
engine::SamplingParams sampling_of(const BenchArgs& a) {
  engine::SamplingParams sp;
  sp.temperature = a.temperature;
  sp.top_p = a.top_p;
  sp.top_k = a.top_k;
  return sp;
}

struct Prompt {
  json body_prompt;  // {"input_ids": [...]} or {"text": "..."}
  int64_t output_len = 0;
};

struct RequestResult {
  bool ok = false;
  std::string error;
  int64_t prompt_len = 0;
  int64_t output_len = 0;
  int64_t cached_len = 0;  // prompt tokens the server took from its prefix cache (meta_info.cached_tokens)
  double ttft_s = 0, latency_s = 0;
  std::vector<double> itl_s;
};

struct Summary {
  int64_t concurrency = 0;
  int64_t completed = 0, failed = 0;
  double duration_s = 0;
  int64_t total_input = 0, total_output = 0, total_cached = 0;
  std::vector<double> e2e_ms, ttft_ms, tpot_ms, itl_ms;
  std::vector<RequestResult> requests;  // --output-details: every request in prompt order
  std::string first_error;
};

double percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  const double rank = p / 100.0 * static_cast<double>(v.size() - 1);  // numpy's linear interpolation
  const size_t lo = static_cast<size_t>(std::floor(rank));
  const size_t hi = std::min(lo + 1, v.size() - 1);
  return v[lo] + (v[hi] - v[lo]) * (rank - static_cast<double>(lo));
}
double mean(const std::vector<double>& v) {
  return v.empty() ? 0.0 : std::accumulate(v.begin(), v.end(), 0.0) / static_cast<double>(v.size());
}

// What one run builds before its first request (every prompt, as token ids): at most kMaxPrompts prompts and
// kMaxPromptTokens tokens (~2 GB of JSON); --num-prompts 10^8 died with std::bad_alloc.
constexpr int64_t kMaxPrompts = 10'000'000, kMaxPromptTokens = int64_t{1} << 27;
void check_prompt_budget(int64_t groups, int64_t per_group, int64_t tokens_each, const char* count_flags,
                         const char* length_flags) {
  FP4MOE_CHECK(groups <= kMaxPrompts / per_group) << count_flags << " = " << groups << " x " << per_group
                                                  << " prompts is past " << kMaxPrompts << ", the most one run builds";
  FP4MOE_CHECK(tokens_each <= kMaxPromptTokens / (groups * per_group))
      << groups * per_group << " prompts of " << length_flags << " = " << tokens_each << " tokens are past "
      << kMaxPromptTokens << " prompt tokens, the most one run builds before its first request";
}

// The prompt flags' values, checked before the server is asked anything.
void check_prompt_flags(const BenchArgs& a) {
  FP4MOE_CHECK(a.dataset.empty() || a.dataset_name == "random")
      << "--dataset " << a.dataset << " (JSON-lines prompts) and --dataset-name " << a.dataset_name
      << " are two loads: give one";
  FP4MOE_CHECK(a.dataset.empty() || a.dataset_path.empty())
      << "--dataset " << a.dataset << " (JSON-lines prompts) and --dataset-path " << a.dataset_path
      << " (a ShareGPT file) are two loads: give one";
  if (!a.dataset.empty()) return;  // its prompts are read before the server is asked too
  FP4MOE_CHECK(a.dataset_name != "sharegpt" || !a.dataset_path.empty())
      << "--dataset-name sharegpt needs --dataset-path FILE (a ShareGPT JSON file)";
  FP4MOE_CHECK(a.dataset_name != "generated-shared-prefix" || a.dataset_path.empty())
      << "--dataset-path is a ShareGPT file for --dataset-name sharegpt or random; generated-shared-prefix makes its "
         "own prompts (JSON-lines prompts: --dataset)";
  if (a.dataset_name == "sharegpt") {
    FP4MOE_CHECK((a.sharegpt_output_len == 0 || a.sharegpt_output_len >= 4) && a.sharegpt_context_len >= 0)
        << "--sharegpt-output-len " << a.sharegpt_output_len << " must be 0 (the conversation's own) or >= 4 (as "
        << "sglang.bench_serving takes it), --sharegpt-context-len " << a.sharegpt_context_len << " >= 0 (0: no limit)";
    return;
  }
  if (a.dataset_name == "generated-shared-prefix") {
    FP4MOE_CHECK(a.gsp_groups >= 1 && a.gsp_prompts_per_group >= 1 && a.gsp_system_prompt_len >= 0 &&
                 a.gsp_question_len >= 1 && a.gsp_output_len >= 1)
        << "--gsp-num-groups " << a.gsp_groups << ", --gsp-prompts-per-group " << a.gsp_prompts_per_group
        << ", --gsp-question-len " << a.gsp_question_len << " and --gsp-output-len " << a.gsp_output_len
        << " must be >= 1, --gsp-system-prompt-len " << a.gsp_system_prompt_len << " >= 0";
    FP4MOE_CHECK(a.gsp_system_prompt_len <= kMaxPromptTokens && a.gsp_question_len <= kMaxPromptTokens)
        << "--gsp-system-prompt-len " << a.gsp_system_prompt_len << " and --gsp-question-len " << a.gsp_question_len
        << " must be <= " << kMaxPromptTokens << " tokens, the most one run builds";
    check_prompt_budget(a.gsp_groups, a.gsp_prompts_per_group, a.gsp_system_prompt_len + a.gsp_question_len,
                        "--gsp-num-groups x --gsp-prompts-per-group", "--gsp-system-prompt-len + --gsp-question-len");
    return;
  }
  FP4MOE_CHECK(a.input_len >= 1 && a.output_len >= 1)
      << "--input-len " << a.input_len << " and --output-len " << a.output_len << " must be >= 1";
  check_prompt_budget(a.num_prompts, 1, a.input_len, "--num-prompts", "--input-len");
}

// A random length of at most `full`: uniform over [full x --random-range-ratio (at least 1), full].
int64_t draw_len(std::mt19937_64& rng, int64_t full, double range_ratio) {
  const int64_t lo = std::max<int64_t>(1, static_cast<int64_t>(std::floor(static_cast<double>(full) * range_ratio)));
  return std::uniform_int_distribution<int64_t>(std::min(lo, full), full)(rng);
}

// The run's prompts (check_prompt_flags first); vocab: the server's, for the generated ones' token ids.
std::vector<Prompt> make_prompts(const BenchArgs& a, int64_t vocab) {
  std::vector<Prompt> out;
  std::mt19937_64 rng(a.seed);
  auto len_in = [&](int64_t full) { return draw_len(rng, full, a.range_ratio); };
  if (!a.dataset.empty()) {
    std::istringstream lines(read_file(a.dataset));
    std::string line;
    int64_t n_line = 0;
    while (std::getline(lines, line) && static_cast<int64_t>(out.size()) < a.num_prompts) {
      ++n_line;
      if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
      const json j = format::parse_json_text(line, a.dataset + ":" + std::to_string(n_line));
      Prompt p;
      if (j.contains("input_ids")) p.body_prompt = {{"input_ids", j["input_ids"]}};
      else if (j.contains("prompt") && j["prompt"].is_string()) p.body_prompt = {{"text", j["prompt"]}};
      else FP4MOE_FAIL() << a.dataset << ":" << n_line << ": needs \"prompt\" (a string) or \"input_ids\"";
      if (j.contains("output_len")) {
        FP4MOE_CHECK(j["output_len"].is_number_integer())
            << a.dataset << ":" << n_line << ": output_len must be an integer, got " << j["output_len"].dump();
        p.output_len = j["output_len"].get<int64_t>();
      } else {
        p.output_len = a.output_len;
      }
      FP4MOE_CHECK(p.output_len >= 1) << a.dataset << ":" << n_line << ": output_len " << p.output_len << " must be >= 1";
      out.push_back(std::move(p));
    }
    FP4MOE_CHECK(!out.empty()) << a.dataset << " has no prompts";
    // Fewer prompts than --num-prompts: they repeat in order.
    const size_t n_read = out.size();
    while (static_cast<int64_t>(out.size()) < a.num_prompts) out.push_back(out[out.size() % n_read]);
    return out;
  }
  std::uniform_int_distribution<int64_t> tok(0, vocab - 1);
  if (a.dataset_name == "generated-shared-prefix") {
    for (int64_t g = 0; g < a.gsp_groups; ++g) {
      std::vector<int64_t> system(static_cast<size_t>(a.gsp_system_prompt_len));
      for (auto& t : system) t = tok(rng);
      for (int64_t q = 0; q < a.gsp_prompts_per_group; ++q) {
        std::vector<int64_t> ids = system;
        for (int64_t i = 0; i < a.gsp_question_len; ++i) ids.push_back(tok(rng));
        out.push_back({json{{"input_ids", ids}}, a.gsp_output_len});
      }
    }
    std::shuffle(out.begin(), out.end(), rng);  // groups interleave, as requests would arrive
    return out;
  }
  for (int64_t i = 0; i < a.num_prompts; ++i) {
    std::vector<int64_t> ids(static_cast<size_t>(len_in(a.input_len)));
    for (auto& t : ids) t = tok(rng);
    out.push_back({json{{"input_ids", ids}}, len_in(a.output_len)});
  }
  return out;
}

// --dataset-name sharegpt, as sglang.bench_serving samples it: the conversations with two turns or more, shuffled
// (--seed), each its first turn's text as the prompt and its second turn's length in tokens as the output length
// (--sharegpt-output-len instead when given); a conversation whose prompt or output is under 2 tokens, or (with
// --sharegpt-context-len) whose prompt + output is longer, is skipped, until --num-prompts are taken. Token counts
// come from the server's tokenizer (POST /v1/tokenize, a batch at a time). The file is read (sharegpt_pairs) before
// the server is asked anything.
using TurnPairs = std::vector<std::pair<std::string, std::string>>;  // (first turn, second turn)
TurnPairs sharegpt_pairs(const BenchArgs& a) {
  const std::string& path = a.dataset_path;
  const json data = format::parse_json_text(read_file(path), path);
  FP4MOE_CHECK(data.is_array()) << path << ": a ShareGPT file is a JSON list of conversations, got a "
                                << data.type_name();
  TurnPairs pairs;
  int64_t n_malformed = 0;
  for (size_t i = 0; i < data.size(); ++i) {
    const json& c = data[i];
    const json* turns = c.is_object() && c.contains("conversations")  ? &c["conversations"]
                        : c.is_object() && c.contains("conversation") ? &c["conversation"]
                                                                      : nullptr;
    if (turns == nullptr || !turns->is_array() || turns->size() < 2) continue;
    // A turn's text: "value" (ShareGPT's) or "content"; a conversation whose first two turns have none is skipped.
    auto text = [&](size_t k) -> const json* {
      const json& t = (*turns)[k];
      const json* v = !t.is_object()          ? nullptr
                      : t.contains("value")   ? &t["value"]
                      : t.contains("content") ? &t["content"]
                                              : nullptr;
      return v != nullptr && v->is_string() ? v : nullptr;
    };
    const json *first = text(0), *second = text(1);
    if (first == nullptr || second == nullptr) {
      ++n_malformed;
      continue;
    }
    pairs.emplace_back(first->get<std::string>(), second->get<std::string>());
  }
  FP4MOE_CHECK(!pairs.empty()) << path << " holds no conversation of two turns or more whose first two turns have a "
                               << "\"value\" (or \"content\") string (" << n_malformed << " skipped for that)";
  std::mt19937_64 rng(a.seed);
  std::shuffle(pairs.begin(), pairs.end(), rng);
  return pairs;
}
// POSTs `body` to the server's `path` (/v1/tokenize, /v1/detokenize with a list) and returns the reply's `field`, a
// list of n entries (one an input); fails naming the route and the reply otherwise.
json post_for_list(const BenchArgs& a, server::HttpClient& client, const char* path, const json& body,
                   const char* field, size_t n) {
  auto r = client.post(path, body.dump());
  FP4MOE_CHECK(r.status == 200) << a.url << path << " answered " << r.status << " " << r.error << " "
                                << r.body.substr(0, 300);
  json j = json::parse(r.body, nullptr, false);
  FP4MOE_CHECK(j.is_object() && j.contains(field) && j[field].is_array() && j[field].size() == n)
      << a.url << path << ": no \"" << field << "\" for each of " << n << " inputs: " << r.body.substr(0, 300);
  return std::move(j[field]);
}

// The server's tokenizer over a batch of texts: the reply's `field` ("count": each text's token count, "tokens": its
// ids), one entry a text.
json server_tokenize(const BenchArgs& a, server::HttpClient& client, const std::vector<std::string>& texts,
                     bool add_special, const char* field) {
  return post_for_list(a, client, "/v1/tokenize", json{{"prompt", texts}, {"add_special_tokens", add_special}}, field,
                       texts.size());
}

std::vector<Prompt> sharegpt_prompts(const BenchArgs& a, const TurnPairs& pairs, server::HttpClient& client) {
  const std::string& path = a.dataset_path;
  auto counts = [&](const std::vector<std::string>& texts, bool add_special) {
    return server_tokenize(a, client, texts, add_special, "count").get<std::vector<int64_t>>();
  };
  std::vector<Prompt> out;
  constexpr size_t kBatch = 256;
  for (size_t at = 0; at < pairs.size() && static_cast<int64_t>(out.size()) < a.num_prompts; at += kBatch) {
    std::vector<std::string> prompts, completions;
    for (size_t i = at; i < std::min(pairs.size(), at + kBatch); ++i) {
      prompts.push_back(pairs[i].first);
      completions.push_back(pairs[i].second);
    }
    const std::vector<int64_t> n_prompt = counts(prompts, true);
    const std::vector<int64_t> n_completion = a.sharegpt_output_len > 0
                                                  ? std::vector<int64_t>(prompts.size(), a.sharegpt_output_len)
                                                  : counts(completions, true);
    for (size_t i = 0; i < prompts.size() && static_cast<int64_t>(out.size()) < a.num_prompts; ++i) {
      if (n_prompt[i] < 2 || n_completion[i] < 2) continue;
      if (a.sharegpt_context_len > 0 && n_prompt[i] + n_completion[i] > a.sharegpt_context_len) continue;
      out.push_back({json{{"text", prompts[i]}}, n_completion[i]});
    }
  }
  FP4MOE_CHECK(!out.empty()) << path << ": no conversation passed the filters (prompt and output of 2 tokens or more"
                             << (a.sharegpt_context_len > 0 ? ", together at most --sharegpt-context-len " +
                                                                  std::to_string(a.sharegpt_context_len)
                                                            : std::string())
                             << ")";
  return out;
}

// --dataset-name random --dataset-path FILE, as sglang.bench_serving's random dataset with a ShareGPT file: prompts of
// the random lengths (--input-len, --random-range-ratio: the distribution without a file, not its draws) made of real
// text: a conversation's first turn in the server's tokens (no special tokens), repeated up to the length less the
// special tokens the server adds to a text prompt (current SGLang subtracts them too) and cut there, decoded by the
// server (POST /v1/detokenize, batches of at most kDetokenizeIds ids) and sent as text, so that every backend (chat
// too) takes it and the routing sees text, not random ids. Conversations in the file's shuffled order (--seed), from
// the start again when there are fewer than --num-prompts; ones without a token are skipped. The server's count of the
// decoded text can differ from the drawn length where a cut falls inside a character or a repeat seam re-tokenizes.
std::vector<Prompt> random_text_prompts(const BenchArgs& a, const TurnPairs& pairs, server::HttpClient& client) {
  std::mt19937_64 rng(a.seed);
  auto len_in = [&](int64_t full) { return draw_len(rng, full, a.range_ratio); };
  constexpr size_t kBatch = 256;
  std::vector<std::vector<int64_t>> sources;  // the first turns' tokens, in order, until --num-prompts have some
  for (size_t at = 0; at < pairs.size() && static_cast<int64_t>(sources.size()) < a.num_prompts; at += kBatch) {
    std::vector<std::string> texts;
    for (size_t i = at; i < std::min(pairs.size(), at + kBatch); ++i) texts.push_back(pairs[i].first);
    for (const json& ids : server_tokenize(a, client, texts, false, "tokens")) {
      if (!ids.empty() && static_cast<int64_t>(sources.size()) < a.num_prompts)
        sources.push_back(ids.get<std::vector<int64_t>>());
    }
  }
  FP4MOE_CHECK(!sources.empty()) << a.dataset_path << ": no conversation's first turn has a token";
  // What the server adds to a text prompt (a BOS, GLM's [gMASK]<sop>): the empty text's tokens with special tokens.
  const int64_t n_special = server_tokenize(a, client, {std::string()}, true, "count")[0].get<int64_t>();
  std::vector<Prompt> out;
  std::vector<std::vector<int64_t>> ids;
  for (int64_t i = 0; i < a.num_prompts; ++i) {
    const std::vector<int64_t>& src = sources[static_cast<size_t>(i) % sources.size()];
    std::vector<int64_t> p(static_cast<size_t>(std::max<int64_t>(1, len_in(a.input_len) - n_special)));
    for (size_t k = 0; k < p.size(); ++k) p[k] = src[k % src.size()];
    ids.push_back(std::move(p));
    out.push_back({json(), len_in(a.output_len)});
  }
  // Batches of whole prompts up to kDetokenizeIds ids (a prompt longer than that alone): each request body stays well
  // under the server's 64 MiB limit (ids of 6 digits + a comma: ~7 MB).
  constexpr size_t kDetokenizeIds = size_t{1} << 20;
  for (size_t at = 0; at < ids.size();) {
    size_t end = at, n_ids = 0;
    while (end < ids.size() && (end == at || n_ids + ids[end].size() <= kDetokenizeIds) && end - at < kBatch)
      n_ids += ids[end++].size();
    const std::vector<std::vector<int64_t>> batch(ids.begin() + static_cast<std::ptrdiff_t>(at),
                                                  ids.begin() + static_cast<std::ptrdiff_t>(end));
    const json texts = post_for_list(a, client, "/v1/detokenize", json{{"tokens", batch}}, "text", batch.size());
    for (size_t k = 0; k < batch.size(); ++k) out[at + k].body_prompt = {{"text", texts[k]}};
    at = end;
  }
  return out;
}

// SGLang's sampling_params fields, which /generate reads inside sampling_params only (--extra-request-body puts them
// there for the native backends).
bool is_sampling_field(const std::string& key) {
  static const std::set<std::string> kFields = {"max_new_tokens",
                                                "min_new_tokens",
                                                "temperature",
                                                "top_p",
                                                "top_k",
                                                "min_p",
                                                "frequency_penalty",
                                                "presence_penalty",
                                                "repetition_penalty",
                                                "stop",
                                                "stop_token_ids",
                                                "ignore_eos",
                                                "skip_special_tokens",
                                                "no_stop_trim",
                                                "regex",
                                                "json_schema",
                                                "seed",
                                                "sampling_seed",
                                                "logit_bias"};
  return kFields.count(key) > 0;
}

RequestResult send_one(const BenchArgs& a, const Prompt& p, uint64_t seed) {
  RequestResult r;
  const std::string& url = a.url;
  const double timeout_s = a.timeout_s;
  // The sampling fields: in sampling_params (/generate) or at the top (the OpenAI routes, vLLM's extra fields).
  const bool openai = !is_native(a.backend), chat = is_chat(a.backend);
  json sampling = {{openai ? "max_tokens" : "max_new_tokens", p.output_len},
                   {"temperature", a.temperature},
                   {"ignore_eos", !a.disable_ignore_eos}};
  if (a.temperature > 0.0) {
    sampling["top_p"] = a.top_p;
    sampling["top_k"] = a.top_k;
    // As an int64 (the server takes any int64 and reads a negative one as its two's complement: the same draws);
    // a uint64 past INT64_MAX was a 400 for every request.
    sampling["seed"] = static_cast<int64_t>(seed);
  }
  json body;
  if (!openai) {
    body = p.body_prompt;
    body["sampling_params"] = std::move(sampling);
  } else {
    body = std::move(sampling);
    const json& prompt = p.body_prompt.contains("text") ? p.body_prompt["text"] : p.body_prompt["input_ids"];
    if (chat) {
      body["messages"] = json::array({{{"role", "user"}, {"content", prompt}}});  // text (checked before the run)
    } else {
      body["prompt"] = prompt;
    }
    // Every chunk's usage so far gives its token count (vLLM's continuous_usage_stats).
    if (!a.disable_stream) body["stream_options"] = {{"include_usage", true}, {"continuous_usage_stats", true}};
  }
  body["stream"] = !a.disable_stream;
  // --extra-request-body: top level, but on /generate the sampling fields go into sampling_params (merged, key by key),
  // where the server reads them; the output bound the replies are checked against is the body's own.
  for (const auto& [key, value] : a.extra.items()) {
    if (!openai && key == "sampling_params") {
      for (const auto& [k, v] : value.items()) body["sampling_params"][k] = v;
    } else if (!openai && is_sampling_field(key)) {
      body["sampling_params"][key] = value;
    } else {
      body[key] = value;
    }
  }
  const json& limits = openai ? body : body["sampling_params"];
  const char* max_key = openai ? "max_tokens" : "max_new_tokens";
  const bool own_max = limits.contains(max_key) && limits[max_key].is_number_integer();
  server::HttpClient client(url, timeout_s);
  client.set_bearer_token(a.api_key);
  const auto t0 = Clock::now();
  tools::StreamTiming timing;
  timing.max_tokens = own_max ? limits[max_key].get<int64_t>() : p.output_len;
  std::string bad_chunk;
  const char* path = !openai ? "/generate" : chat ? "/v1/chat/completions" : "/v1/completions";
  auto on_data = [&](std::string_view data) {
    const double now_s = std::chrono::duration<double>(Clock::now() - t0).count();
    if (openai ? timing.on_openai_chunk(data, now_s) : timing.on_chunk(data, now_s)) return true;
    bad_chunk = std::string(data.substr(0, 200));
    return false;
  };
  // --disable-stream: the whole reply at once, read as one last chunk (its counts); the first token's time is the
  // reply's, and there are no inter-token times (sglang.bench_serving's non-streamed requests).
  auto res = a.disable_stream ? client.post(path, body.dump()) : client.post_sse(path, body.dump(), on_data);
  r.latency_s = std::chrono::duration<double>(Clock::now() - t0).count();
  if (a.disable_stream && res.status == 200) {
    on_data(res.body);
    timing.itl_s.clear();
  }
  r.output_len = timing.completion_tokens;
  r.prompt_len = timing.prompt_len;
  r.cached_len = timing.cached_len;
  r.ttft_s = a.disable_stream ? r.latency_s : timing.ttft();
  r.itl_s = std::move(timing.itl_s);
  if (!bad_chunk.empty())
    r.error = std::string(a.disable_stream ? "unexpected reply" : "unexpected stream chunk") + " (or a count past " +
              max_key + " " + std::to_string(timing.max_tokens) + "): " + bad_chunk;
  else if (res.status == -1)
    r.error = res.error;
  else if (res.status != 200)
    r.error = "HTTP " + std::to_string(res.status) + " " + res.body.substr(0, 300) +
              (res.error.empty() ? std::string() : " (" + res.error + ")");
  else if (timing.completion_tokens == 0)
    r.error = a.disable_stream ? "no tokens in the reply" : "no tokens streamed";
  else r.ok = true;
  return r;
}

// Sends prompts[i] at arrivals[i] seconds from the start (all at once when `arrivals` is empty) through at most
// `concurrency` requests in flight, seeded seed_of(i); the results in prompt order.
template <typename SeedOf>
std::vector<RequestResult> run_concurrently(const BenchArgs& a, const std::vector<Prompt>& prompts, int64_t concurrency,
                                            const std::vector<double>& arrivals, SeedOf seed_of) {
  std::vector<RequestResult> results(prompts.size());
  std::atomic<size_t> next{0};
  const auto t0 = Clock::now();
  std::vector<std::thread> workers;
  const int64_t n_workers = std::min<int64_t>(concurrency, static_cast<int64_t>(prompts.size()));
  // A worker a request in flight: a thread that cannot be made ends the run with the reason, after the ones made
  // have finished (an exception past joinable threads aborted the process).
  std::string spawn_error;
  for (int64_t w = 0; w < n_workers && spawn_error.empty(); ++w) {
    try {
      workers.emplace_back([&] {
        for (size_t i = next++; i < prompts.size(); i = next++) {
          if (!arrivals.empty())
            std::this_thread::sleep_until(
                t0 + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(arrivals[i])));
          try {
            results[i] = send_one(a, prompts[i], seed_of(i));
          } catch (const std::exception& e) {  // a failed request, not an exception escaping a thread (an abort)
            results[i].error = e.what();
          }
        }
      });
    } catch (const std::system_error& e) {
      spawn_error = e.what();
      next = prompts.size();  // the workers made take no new request
    }
  }
  for (auto& t : workers) t.join();
  FP4MOE_CHECK(spawn_error.empty()) << "--max-concurrency " << concurrency << ": worker " << workers.size() + 1
                                    << " of " << n_workers << " could not be started (" << spawn_error
                                    << "); give a smaller --max-concurrency";
  return results;
}

Summary run_level(const BenchArgs& a, const std::vector<Prompt>& prompts, int64_t concurrency) {
  // A request waits for its arrival time and then for a free worker (--max-concurrency), as the Python clients hold
  // arrivals behind their concurrency semaphore.
  const std::vector<double> arrivals = arrival_times(a, prompts.size());
  const auto t0 = Clock::now();
  const std::vector<RequestResult> results =
      run_concurrently(a, prompts, concurrency, arrivals, [&](size_t i) { return a.seed * 1000003 + i; });
  Summary s;
  s.concurrency = concurrency;
  s.duration_s = std::chrono::duration<double>(Clock::now() - t0).count();
  if (a.output_details) s.requests = results;
  for (const auto& r : results) {
    if (!r.ok) {
      ++s.failed;
      if (s.first_error.empty()) s.first_error = r.error;
      continue;
    }
    ++s.completed;
    s.total_input += r.prompt_len;
    s.total_output += r.output_len;
    s.total_cached += r.cached_len;
    s.e2e_ms.push_back(r.latency_s * 1e3);
    s.ttft_ms.push_back(r.ttft_s * 1e3);
    if (r.output_len > 1) s.tpot_ms.push_back((r.latency_s - r.ttft_s) / static_cast<double>(r.output_len - 1) * 1e3);
    for (double d : r.itl_s) s.itl_ms.push_back(d * 1e3);
  }
  return s;
}

json summary_json(const BenchArgs& a, const Summary& s) {
  const double d = s.duration_s > 0 ? s.duration_s : 1e-9;
  json j = {{"backend", a.backend},
            {"url", a.url},
            {"request_rate", std::isfinite(a.request_rate) ? json(a.request_rate) : json("inf")},
            {"burstiness", a.burstiness},
            {"dataset", a.dataset.empty() ? a.dataset_name : a.dataset},
            {"disable_stream", a.disable_stream},
            {"disable_ignore_eos", a.disable_ignore_eos},
            {"extra_request_body", a.extra},
            {"warmup_requests", a.warmup_requests},
            {"max_concurrency", s.concurrency},
            {"num_prompts", s.completed + s.failed},
            {"completed", s.completed},
            {"failed", s.failed},
            {"duration", s.duration_s},
            {"total_input_tokens", s.total_input},
            {"total_output_tokens", s.total_output},
            {"total_cached_input_tokens", s.total_cached},
            {"request_throughput", static_cast<double>(s.completed) / d},
            {"input_throughput", static_cast<double>(s.total_input) / d},
            {"output_throughput", static_cast<double>(s.total_output) / d},
            {"total_throughput", static_cast<double>(s.total_input + s.total_output) / d},
            {"concurrency", std::accumulate(s.e2e_ms.begin(), s.e2e_ms.end(), 0.0) / 1e3 / d}};
  auto stats = [&](const char* name, const std::vector<double>& v) {
    j[std::string("mean_") + name + "_ms"] = mean(v);
    j[std::string("median_") + name + "_ms"] = percentile(v, 50);
    j[std::string("p95_") + name + "_ms"] = percentile(v, 95);
    j[std::string("p99_") + name + "_ms"] = percentile(v, 99);
    j[std::string("max_") + name + "_ms"] = v.empty() ? 0.0 : *std::max_element(v.begin(), v.end());
  };
  stats("e2e_latency", s.e2e_ms);
  stats("ttft", s.ttft_ms);
  stats("tpot", s.tpot_ms);
  stats("itl", s.itl_ms);
  if (!s.first_error.empty()) j["first_error"] = s.first_error;
  if (a.output_details) {  // sglang.bench_serving's per-request lists, in prompt order (seconds)
    json input_lens = json::array(), output_lens = json::array(), ttfts = json::array(), itls = json::array(),
         errors = json::array();
    for (const RequestResult& r : s.requests) {
      input_lens.push_back(r.prompt_len);
      output_lens.push_back(r.ok ? r.output_len : 0);
      ttfts.push_back(r.ok ? r.ttft_s : 0.0);
      itls.push_back(r.ok ? json(r.itl_s) : json::array());
      errors.push_back(r.ok ? std::string() : r.error);
    }
    j["input_lens"] = std::move(input_lens);
    j["output_lens"] = std::move(output_lens);
    j["ttfts"] = std::move(ttfts);
    j["itls"] = std::move(itls);
    j["errors"] = std::move(errors);
  }
  // What the run asked for (sglang.bench_serving's names), so that a line of --output-file says how it was made.
  if (a.dataset_name == "sharegpt") {
    j["dataset_path"] = a.dataset_path;
    j["sharegpt_output_len"] = a.sharegpt_output_len;
    j["sharegpt_context_len"] = a.sharegpt_context_len;
  } else if (a.dataset.empty() && a.dataset_name == "random") {
    if (!a.dataset_path.empty()) j["dataset_path"] = a.dataset_path;
    j["random_input_len"] = a.input_len;
    j["random_output_len"] = a.output_len;
    j["random_range_ratio"] = a.range_ratio;
  } else if (a.dataset.empty()) {
    j["gsp_num_groups"] = a.gsp_groups;
    j["gsp_prompts_per_group"] = a.gsp_prompts_per_group;
    j["gsp_system_prompt_len"] = a.gsp_system_prompt_len;
    j["gsp_question_len"] = a.gsp_question_len;
    j["gsp_output_len"] = a.gsp_output_len;
  }
  j["seed"] = a.seed;
  j["sampling"] = a.temperature > 0.0 ? json{{"temperature", a.temperature}, {"top_p", a.top_p}, {"top_k", a.top_k}}
                                      : json{{"temperature", 0.0}};
  return j;
}

void print_summary(const json& j) {
  auto line = [](const std::string& k, const std::string& v) { fmt::print("{:<40} {}\n", k, v); };
  auto f2 = [](double v) { return fmt::format("{:.2f}", v); };
  auto section = [](const std::string& t) {
    const size_t pad = t.size() < 50 ? (50 - t.size()) / 2 : 0;
    fmt::print("{}{}{}\n", std::string(pad, '-'), t, std::string(50 - t.size() - pad, '-'));
  };
  fmt::print("\n{:=^50}\n", " Serving Benchmark Result ");
  line("Backend:", j["backend"].get<std::string>());
  line("Traffic request rate:",
       j["request_rate"].is_string() ? "inf" : fmt::format("{:g}", j["request_rate"].get<double>()));
  line("Max request concurrency:", std::to_string(j["max_concurrency"].get<int64_t>()));
  line("Successful requests:", std::to_string(j["completed"].get<int64_t>()));
  line("Failed requests:", std::to_string(j["failed"].get<int64_t>()));
  line("Benchmark duration (s):", f2(j["duration"]));
  line("Total input tokens:", std::to_string(j["total_input_tokens"].get<int64_t>()));
  const int64_t n_in = j["total_input_tokens"].get<int64_t>(), n_cached = j["total_cached_input_tokens"].get<int64_t>();
  line("Prefix-cached input tokens:",
       fmt::format("{} ({:.1f}%)", n_cached, n_in > 0 ? 100.0 * static_cast<double>(n_cached) / n_in : 0.0));
  line("Total generated tokens:", std::to_string(j["total_output_tokens"].get<int64_t>()));
  line("Request throughput (req/s):", f2(j["request_throughput"]));
  line("Input token throughput (tok/s):", f2(j["input_throughput"]));
  line("Output token throughput (tok/s):", f2(j["output_throughput"]));
  line("Total token throughput (tok/s):", f2(j["total_throughput"]));
  line("Concurrency:", f2(j["concurrency"]));
  auto block = [&](const std::string& title, const std::string& key, const std::string& label, bool p95_max) {
    section(title);
    line("Mean " + label + " (ms):", f2(j["mean_" + key + "_ms"]));
    line("Median " + label + " (ms):", f2(j["median_" + key + "_ms"]));
    if (p95_max) line("P95 " + label + " (ms):", f2(j["p95_" + key + "_ms"]));
    line("P99 " + label + " (ms):", f2(j["p99_" + key + "_ms"]));
    if (p95_max) line("Max " + label + " (ms):", f2(j["max_" + key + "_ms"]));
  };
  block("End-to-End Latency", "e2e_latency", "E2E Latency", false);
  block("Time to First Token", "ttft", "TTFT", false);
  block("Time per Output Token (excl. 1st token)", "tpot", "TPOT", false);
  block("Inter-Token Latency", "itl", "ITL", true);
  fmt::print("{}\n", std::string(50, '='));
  if (j.contains("first_error")) fmt::print("first error: {}\n", j["first_error"].get<std::string>());
}

// An axis label of a grid of steps `step`: as many decimals as tell neighbours apart (0 from a step of 10 on;
// "0 1 2 2 3 4" for a 0.9 ms step before).
std::string tick_label(double value, double step) {
  const int decimals = step >= 10 ? 0 : std::clamp(static_cast<int>(std::ceil(-std::log10(step))) + 1, 0, 4);
  return fmt::format("{:.{}f}", value, decimals);
}

// Latency vs throughput: one point per run (output tokens/s, E2E latency), median and p99 series.
std::string render_plot(const std::vector<json>& runs) {
  const double W = 640, H = 420, L = 70, R = 20, T = 40, B = 50;
  double x_max = 0, y_max = 0;
  for (const auto& r : runs) {
    x_max = std::max(x_max, r["output_throughput"].get<double>());
    y_max = std::max(y_max, r["p99_e2e_latency_ms"].get<double>());
  }
  x_max = x_max > 0 ? x_max * 1.1 : 1;
  y_max = y_max > 0 ? y_max * 1.1 : 1;
  auto px = [&](double x) { return L + x / x_max * (W - L - R); };
  auto py = [&](double y) { return H - B - y / y_max * (H - T - B); };
  std::ostringstream o;
  o << fmt::format(R"svg(<svg xmlns="http://www.w3.org/2000/svg" width="{}" height="{}" font-family="sans-serif" font-size="11">)svg", W, H)
    << "\n";
  o << fmt::format(R"svg(<rect width="{}" height="{}" fill="white"/>)svg", W, H) << "\n";
  o << fmt::format(R"svg(<text x="{}" y="20" font-size="14" text-anchor="middle">fp4moe bench-serving: latency vs throughput</text>)svg", W / 2)
    << "\n";
  for (int i = 0; i <= 5; ++i) {
    const double xv = x_max * i / 5, yv = y_max * i / 5;
    o << fmt::format(R"svg(<line x1="{:.1f}" y1="{}" x2="{:.1f}" y2="{}" stroke="#ddd"/>)svg", px(xv), T, px(xv), H - B) << "\n";
    o << fmt::format(R"svg(<line x1="{}" y1="{:.1f}" x2="{}" y2="{:.1f}" stroke="#ddd"/>)svg", L, py(yv), W - R, py(yv)) << "\n";
    o << fmt::format(R"svg(<text x="{:.1f}" y="{}" text-anchor="middle">{}</text>)svg", px(xv), H - B + 15,
                     tick_label(xv, x_max / 5))
      << "\n";
    o << fmt::format(R"svg(<text x="{}" y="{:.1f}" text-anchor="end">{}</text>)svg", L - 5, py(yv) + 4,
                     tick_label(yv, y_max / 5))
      << "\n";
  }
  o << fmt::format(R"svg(<text x="{}" y="{}" text-anchor="middle">output tokens/s</text>)svg", (L + W - R) / 2, H - 12) << "\n";
  o << fmt::format(R"svg(<text x="15" y="{}" text-anchor="middle" transform="rotate(-90 15 {})">E2E latency (ms)</text>)svg",
                   (T + H - B) / 2, (T + H - B) / 2)
    << "\n";
  auto series = [&](const char* key, const char* color, const char* name, int i_series) {
    std::string pts;
    for (const auto& r : runs) {
      pts += fmt::format("{:.1f},{:.1f} ", px(r["output_throughput"].get<double>()), py(r[key].get<double>()));
    }
    o << fmt::format(R"svg(<polyline points="{}" fill="none" stroke="{}" stroke-width="2"/>)svg", pts, color) << "\n";
    for (const auto& r : runs) {
      const double x = px(r["output_throughput"].get<double>()), y = py(r[key].get<double>());
      o << fmt::format(R"svg(<circle cx="{:.1f}" cy="{:.1f}" r="4" fill="{}"/>)svg", x, y, color) << "\n";
      o << fmt::format(R"svg(<text x="{:.1f}" y="{:.1f}" fill="{}">c={}</text>)svg", x + 6, y - 6, color,
                       r["max_concurrency"].get<int64_t>())
        << "\n";
    }
    o << fmt::format(R"svg(<text x="{}" y="{}" fill="{}">{}</text>)svg", L + 10, T + 15 + 15 * i_series, color, name) << "\n";
  };
  series("median_e2e_latency_ms", "#1f77b4", "median E2E", 0);
  series("p99_e2e_latency_ms", "#d62728", "p99 E2E", 1);
  o << "</svg>\n";
  return o.str();
}

void run_bench(BenchArgs a) {
  FP4MOE_CHECK(a.num_prompts >= 1 && a.num_prompts <= kMaxPrompts)
      << "--num-prompts " << a.num_prompts << " must be in [1, " << kMaxPrompts << "]";
  FP4MOE_CHECK(a.range_ratio > 0 && a.range_ratio <= 1) << "--random-range-ratio " << a.range_ratio << " must be in (0, 1]";
  FP4MOE_CHECK(std::isfinite(a.timeout_s) && a.timeout_s > 0) << "--timeout " << a.timeout_s << " must be > 0 seconds";
  // Below a request a day the arrival times overflow the clock's sleep (past ~9.2e9 s every request went out at once).
  constexpr double kMinRate = 1.0 / 86400;
  FP4MOE_CHECK(a.request_rate >= kMinRate)
      << "--request-rate " << a.request_rate << " must be >= " << kMinRate << " requests/s (one a day), or inf";
  FP4MOE_CHECK(std::isfinite(a.burstiness) && a.burstiness > 0) << "--burstiness " << a.burstiness << " must be > 0";
  check_sampling_flags(sampling_of(a));
  FP4MOE_CHECK(a.warmup_requests >= 0) << "--warmup-requests " << a.warmup_requests << " must be >= 0";
  if (!a.extra_request_body.empty()) {
    a.extra = json::parse(a.extra_request_body, nullptr, false);
    FP4MOE_CHECK(a.extra.is_object()) << "--extra-request-body must be a JSON object, got: " << a.extra_request_body;
    for (const char* own : {"stream", "stream_options"})
      FP4MOE_CHECK(!a.extra.contains(own))
          << "--extra-request-body sets \"" << own << "\", which the benchmark sets itself (--disable-stream)";
    // Each request is one choice (its counts and timings are one reply's).
    const json* sp = a.extra.contains("sampling_params") ? &a.extra["sampling_params"] : nullptr;
    FP4MOE_CHECK(sp == nullptr || sp->is_object())
        << "--extra-request-body's sampling_params must be an object, got " << sp->dump();
    for (const char* many : {"n", "best_of"})
      FP4MOE_CHECK(!a.extra.contains(many) && (sp == nullptr || !sp->contains(many)))
          << "--extra-request-body sets \"" << many << "\": each benchmark request is one choice";
  }
  check_prompt_flags(a);
  const std::vector<int64_t> levels = a.max_concurrency.empty()
                                          ? std::vector<int64_t>{}  // every prompt at once: known once they are made
                                          : tune::parse_positive_list(a.max_concurrency, "--max-concurrency");
  // A path that cannot be written fails before the run, not after it; so does a dataset that cannot be read.
  if (!a.output_file.empty()) check_writable_file(a.output_file, "--output-file");
  if (!a.plot.empty()) check_writable_file(a.plot, "--plot");
  std::vector<Prompt> prompts;
  if (!a.dataset.empty()) prompts = make_prompts(a, 0);
  const TurnPairs turns = !a.dataset_path.empty() ? sharegpt_pairs(a) : TurnPairs{};  // sharegpt, or random's text

  server::HttpClient client(a.url, 30);
  client.set_bearer_token(a.api_key);
  auto info = client.get("/get_server_info");
  FP4MOE_CHECK(info.status == 200) << a.url << "/get_server_info: "
                                   << (info.status == -1 ? info.error
                                                         : "answered " + std::to_string(info.status) + " " +
                                                               info.body.substr(0, 300));
  const json server_info = json::parse(info.body, nullptr, false);
  FP4MOE_CHECK(server_info.is_object()) << a.url << "/get_server_info is not JSON: " << info.body.substr(0, 300);
  int64_t vocab = 0;  // only the generated prompts need it
  if (a.dataset_name == "sharegpt") {
    prompts = sharegpt_prompts(a, turns, client);
  } else if (a.dataset.empty() && !a.dataset_path.empty()) {
    prompts = random_text_prompts(a, turns, client);
  } else if (a.dataset.empty()) {
    const json v = server_info.value("vocab_size", json());
    FP4MOE_CHECK(format::json_int_in(v, 1, INT32_MAX))
        << a.url << "/get_server_info: vocab_size is " << (v.is_null() ? std::string("missing") : v.dump())
        << ", expected a positive integer (the random prompts draw token ids below it)";
    vocab = v.get<int64_t>();
    prompts = make_prompts(a, vocab);
  }
  if (is_chat(a.backend)) {
    for (size_t i = 0; i < prompts.size(); ++i)
      FP4MOE_CHECK(prompts[i].body_prompt.contains("text"))
          << "--backend " << a.backend << " sends each prompt as a user message's text: prompt " << i << " of "
          << (a.dataset.empty() ? a.dataset_name : a.dataset)
          << " is token ids (random prompts without --dataset-path and generated-shared-prefix ones are; use "
             "--dataset-name sharegpt, random with --dataset-path, or a --dataset of {\"prompt\": ...} lines)";
  }
  // Each run starts from an empty prefix cache, so that a run does not find the prompts of the one
  // before it (the same prompts) cached; --no-flush-cache keeps what is there.
  const bool flush = a.flush_cache && !server_info.value("disable_radix_cache", true);
  // Warm-up (sglang.bench_serving's --warmup-requests): N copies of the first prompt, at most 32 tokens out, sent
  // together (at most kMaxWarmupInFlight at a time) and untimed; the run stops before anything is measured only when
  // none of them succeeds (as sglang's).
  if (a.warmup_requests > 0 && !prompts.empty()) {
    constexpr int64_t kMaxWarmupInFlight = 256;
    Prompt p = prompts.front();
    p.output_len = std::min<int64_t>(p.output_len, 32);
    const std::vector<RequestResult> warm =
        run_concurrently(a, std::vector<Prompt>(a.warmup_requests, p),
                         std::min(a.warmup_requests, kMaxWarmupInFlight), {}, [&](size_t) { return a.seed; });
    const auto ok = std::count_if(warm.begin(), warm.end(), [](const RequestResult& r) { return r.ok; });
    FP4MOE_CHECK(ok > 0) << "all " << a.warmup_requests << " warm-up request(s) failed; first: " << warm.front().error;
    if (ok < a.warmup_requests)
      fmt::print(stderr, "warning: {} of {} warm-up requests failed; first: {}\n", a.warmup_requests - ok,
                 a.warmup_requests,
                 std::find_if(warm.begin(), warm.end(), [](const RequestResult& r) { return !r.ok; })->error);
  }
  std::vector<json> runs;
  for (int64_t c : levels.empty() ? std::vector<int64_t>{static_cast<int64_t>(prompts.size())} : levels) {
    if (flush) {
      // The server flushes only when nothing runs or waits (SGLang's rule): requests of the previous run that were
      // given up on (timed out, failed) may still be ending, so a refusal is retried for up to 30 s.
      auto r = client.post("/flush_cache", "");
      const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
      while (r.status == 400 && r.body.find("pending requests") != std::string::npos &&
             std::chrono::steady_clock::now() < deadline) {
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
        r = client.post("/flush_cache", "");
      }
      FP4MOE_CHECK(r.status == 200) << a.url << "/flush_cache answered " << r.status << " " << r.error << " "
                                    << r.body.substr(0, 300)
                                    << " (--no-flush-cache runs without flushing, e.g. beside other traffic)";
    }
    const Summary s = run_level(a, prompts, c);
    json j = summary_json(a, s);
    j["server"] = server_info;
    print_summary(j);
    runs.push_back(j);
    if (!a.output_file.empty()) {
      std::ofstream f(a.output_file, std::ios::app);
      FP4MOE_CHECK(f.good()) << "cannot open --output-file " << a.output_file;
      f << j.dump() << "\n";
    }
  }
  if (!a.plot.empty()) {
    std::ofstream f(a.plot);
    FP4MOE_CHECK(f.good()) << "cannot write --plot " << a.plot;
    f << render_plot(runs);
  }
  int64_t failed = 0;
  for (const auto& r : runs) failed += r["failed"].get<int64_t>();
  FP4MOE_CHECK(failed == 0) << failed << " request(s) failed; first: " << runs.front().value("first_error", std::string());
}

}  // namespace

void register_bench_serving_command(CLI::App& app) {
  auto a = std::make_shared<BenchArgs>();
  CLI::App* cmd = app.add_subcommand("bench-serving", "Online serving benchmark against a running fp4moe serve");
  cmd->add_option("--backend", a->backend,
                  "The API the requests take (sglang.bench_serving's and vllm bench serve's names): sglang or "
                  "sglang-native (/generate, the default), sglang-oai, vllm or openai (/v1/completions), "
                  "sglang-oai-chat, vllm-chat or openai-chat (/v1/chat/completions; text prompts)")
      ->check(CLI::IsMember(kBackends));
  CLI::Option* url = cmd->add_option("--url,--base-url", a->url, "Server URL (default http://127.0.0.1:30000)");
  // sglang.bench_serving's and vllm bench serve's other way to name the server (their --base-url wins over them; here
  // giving both is refused).
  auto host_port = std::make_shared<std::pair<std::string, int>>("127.0.0.1", 30000);
  CLI::Option* host =
      cmd->add_option("--host", host_port->first, "Server host, with --port instead of --base-url (default 127.0.0.1)");
  CLI::Option* port =
      cmd->add_option("--port", host_port->second, "Server port (default 30000)")->check(CLI::Range(1, 65535));
  host->excludes(url);
  port->excludes(url);
  cmd->add_option("--num-prompts", a->num_prompts, "Requests per run (default 64)");
  cmd->add_option("--max-concurrency", a->max_concurrency,
                  "Requests in flight at once; a comma list runs one after another (default: all)");
  cmd->add_option("--input-len,--random-input-len", a->input_len, "Random prompt length in tokens (default 128)");
  cmd->add_option("--output-len,--random-output-len", a->output_len, "Tokens to generate per request (default 32)");
  cmd->add_option("--random-range-ratio", a->range_ratio,
                  "Lengths drawn uniformly from [len * ratio, len] (default 1: fixed)");
  cmd->add_option("--dataset", a->dataset, "JSON-lines prompts: {\"prompt\": ...} or {\"input_ids\": [...]}");
  cmd->add_option("--dataset-name", a->dataset_name,
                  "random (default), generated-shared-prefix (--gsp-*: groups of prompts sharing a system prompt; "
                  "--num-prompts is then groups x prompts per group) or sharegpt (--dataset-path: a ShareGPT JSON "
                  "file's conversations)")
      ->check(CLI::IsMember({"random", "generated-shared-prefix", "sharegpt"}));
  cmd->add_option("--dataset-path", a->dataset_path,
                  "sharegpt: the ShareGPT JSON file (a list of {\"conversations\": [{\"value\": ...}, ...]}); "
                  "random: real text for the prompts of the random lengths (its first turns' tokens, repeated to the "
                  "length, as sglang.bench_serving)");
  cmd->add_option("--sharegpt-output-len", a->sharegpt_output_len,
                  "sharegpt: tokens to generate per request (default: the second turn's length)");
  cmd->add_option("--sharegpt-context-len", a->sharegpt_context_len,
                  "sharegpt: skip conversations whose prompt + output is longer (default: no limit)");
  cmd->add_option("--gsp-num-groups", a->gsp_groups, "generated-shared-prefix: groups (default 64)");
  cmd->add_option("--gsp-prompts-per-group", a->gsp_prompts_per_group, "Prompts per group (default 16)");
  cmd->add_option("--gsp-system-prompt-len", a->gsp_system_prompt_len, "Shared tokens per group (default 2048)");
  cmd->add_option("--gsp-question-len", a->gsp_question_len, "Own tokens per prompt (default 128)");
  cmd->add_option("--gsp-output-len", a->gsp_output_len, "Tokens to generate per prompt (default 256)");
  CLI::Option* keep = cmd->add_flag_callback(
      "--no-flush-cache", [a] { a->flush_cache = false; },
      "Keep the server's prefix cache between runs (default: POST /flush_cache before each run)");
  cmd->add_flag("--flush-cache", a->flush_cache, "Flush the server's prefix cache before each run (the default)")
      ->excludes(keep);
  cmd->add_option("--seed", a->seed, "Seed of the random prompts (default 1)")->check(unsigned_64());
  CLI::Option* output_file = cmd->add_option("--output-file", a->output_file, "Append one JSON line per run");
  cmd->add_flag("--output-details", a->output_details,
                "sglang.bench_serving's: each --output-file line also lists every request's input_lens, "
                "output_lens, ttfts, itls (seconds) and errors, in prompt order")
      ->needs(output_file);
  cmd->add_option("--plot", a->plot, "Write an SVG latency-vs-throughput chart of the runs");
  cmd->add_option("--timeout", a->timeout_s, "Per-request timeout in seconds (default 600)");
  cmd->add_option("--extra-request-body", a->extra_request_body,
                  "A JSON object merged into every request's body (on /generate SGLang's sampling fields into "
                  "sampling_params; e.g. '{\"top_k\": 20}'; sglang.bench_serving's)");
  cmd->add_flag("--disable-ignore-eos", a->disable_ignore_eos,
                "Requests stop at EOS (default: ignore_eos, every request generates its output length)");
  cmd->add_flag("--disable-stream", a->disable_stream,
                "Whole replies instead of streams: TTFT is then the request's latency, no inter-token times");
  cmd->add_option(
      "--warmup-requests", a->warmup_requests,
      "Untimed requests of the first prompt (at most 32 tokens out), sent together before the runs (default 1)");
  cmd->add_option("--api-key", a->api_key, "The server's --api-key (sent as Authorization: Bearer)");
  cmd->add_option("--temperature", a->temperature, "Sampling temperature (default 0: greedy)");
  cmd->add_option("--top-p", a->top_p, "top_p of sampled requests (default 1)");
  cmd->add_option("--top-k", a->top_k, "top_k of sampled requests (default -1: off)");
  CLI::Option* rate =
      cmd->add_option("--request-rate", a->request_rate,
                      "Requests sent per second, as a Poisson process (default inf: all at once); they still wait for "
                      "--max-concurrency");
  cmd->add_option("--burstiness", a->burstiness,
                  "Shape of the gamma-distributed gaps between requests (default 1: Poisson; < 1 burstier, > 1 more "
                  "even)")
      ->needs(rate);
  cmd->callback([a, host, port, host_port] {
    if (host->count() > 0 || port->count() > 0) {
      const std::string& h = host_port->first;  // an IPv6 literal goes in brackets
      a->url = "http://" + (h.find(':') != std::string::npos && h.front() != '[' ? "[" + h + "]" : h) + ":" +
               std::to_string(host_port->second);
    }
    run_bench(*a);
  });
}

}  // namespace fp4moe::tools
