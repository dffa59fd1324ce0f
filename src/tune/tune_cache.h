// The autotune cache of sm90_nvfp4_w4a16_grouped_gemm: which kernel config (an index into
// plan::kW4A16Configs) was fastest for a problem shape (E, N, K) and a token-count bucket, on one
// GPU with one build. Needs no GPU: the key of the running device is made by autotune.h
// (current_tune_key), everything here is plain data, JSON and the planner.
//
//   TuneCache cache = TuneCache::load(default_cache_path());      // missing file: empty; corrupt: warning
//   ConfigChooser chooser(cache, key, gpu_spec);
//   ConfigChoice c = chooser.choose_config({32, 4096, 6144}, 5);  // bucket 8
//   c.config_id; c.reason;  // "autotuned: ... 12.3 us" or "planner top choice (...)"
//
// A cache file holds one key (GPU name, SM count, CUDA runtime and driver versions, build id,
// layout version) and the winners measured under it. A lookup with a different key never returns
// a winner: the difference is reported field by field (old vs new) and `fp4moe tune` retunes.
// File format and rules: docs/gpu.md, "Autotuning". Tested by tests/tune/test_tune_cache.cpp.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <tuple>
#include <vector>

#include "plan/gpu_table.h"
#include "plan/layout_sm90_w4a16.h"

namespace fp4moe::tune {

inline constexpr const char* kCacheFormat = "fp4moe.tune.v1";

// Tokens per expert are tuned at these buckets; a count maps to the next power of two, capped at
// the last bucket (counts above 512 use the 512 winner: those tiles are already compute-bound).
inline constexpr int64_t kTokenBuckets[] = {1, 2, 4, 8, 16, 32, 64, 128, 256, 512};
// The bucket of `tokens_per_expert` (0 -> 1, 3 -> 4, 512 -> 512, 5000 -> 512); throws when < 0.
int64_t token_bucket(int64_t tokens_per_expert);
// Parses "1,3,8" (`option` names the flag in errors, e.g. "--tokens"): positive integers; throws
// naming the bad token and its position.
std::vector<int64_t> parse_positive_list(std::string_view text, std::string_view option);
// Parses "1,2,4" into buckets; each entry must already be one of kTokenBuckets (names the bad one).
std::vector<int64_t> parse_bucket_list(std::string_view text);

// One grouped GEMM: E experts, each [tokens x K] x [K x N] (N output features).
struct GemmShape {
  int64_t n_experts = 0, n = 0, k = 0;
  std::string to_string() const;  // "E=32,N=4096,K=6144"
  auto operator<=>(const GemmShape&) const = default;
};
// Parses "E,N,K[,E,N,K...]" (a multiple of 3 positive integers; N and K as the kernel takes them,
// plan::w4a16_n_refusal / w4a16_k_refusal; the launcher checks the rest). Throws fp4moe::Error naming the bad
// token and its position.
std::vector<GemmShape> parse_shape_list(std::string_view text);
// Throws unless the kernel can run the shape: E >= 1, N and K as plan::w4a16_n_refusal / w4a16_k_refusal take them
// (`what` names the shape's origin, e.g. "model.layers gate_up").
void check_shape(const GemmShape& shape, const std::string& what);

// FNV-1a 64 over the fields and the name of every kW4A16Configs entry, as 16 hex digits: changes whenever a
// config is added, removed, reordered or edited (the cached config ids would then mean other tiles).
std::string layout_version();
// The same hash over any config table (tests check that an edit changes it).
std::string layout_version(const plan::W4A16Config* configs, int n_configs);
// "<fp4moe version>+<git commit of the build>" (FP4MOE_VERSION / FP4MOE_GIT_COMMIT, cmake/git_commit.cmake).
std::string build_id();

// Where a cache was measured. Two keys must be equal in every field for a winner to be used.
struct TuneKey {
  std::string gpu_name;  // cudaDeviceProp::name, e.g. "NVIDIA H200"
  int n_sms = 0;
  int cuda_runtime = 0;  // cudaRuntimeGetVersion, e.g. 13000
  int cuda_driver = 0;   // cudaDriverGetVersion
  std::string build_id;
  std::string layout_version;

  bool operator==(const TuneKey&) const = default;
  nlohmann::json to_json() const;
  static TuneKey from_json(const nlohmann::json& j);  // throws naming the missing/bad field
  std::string to_string() const;  // "NVIDIA H200, 132 SMs, CUDA runtime 13000, driver 13000, build ..., layout ..."
};

// One field that differs between two keys: {"gpu_name", "NVIDIA H100 80GB HBM3", "NVIDIA H200"}.
struct KeyDiff {
  std::string field, old_value, new_value;
};
std::vector<KeyDiff> diff_keys(const TuneKey& old_key, const TuneKey& new_key);
// "stale tune cache /p (tuned for another setup): gpu_name 'A' -> 'B'; n_sms 114 -> 132"
std::string describe_stale(const std::string& path, const std::vector<KeyDiff>& diffs);

// The winner for one (shape, bucket).
struct TuneEntry {
  GemmShape shape;
  int64_t bucket = 0;
  int config_id = -1;
  std::string config;        // the config's name (checked against config_id on load)
  double time_us = 0;        // median
  int runner_up_id = -1;     // -1 when only one config was feasible
  std::string runner_up;
  double runner_up_us = 0;
  int iters = 0;             // timed runs per config
  int n_candidates = 0;      // configs timed
};

class TuneCache {
 public:
  // An empty cache (no key). Saving it writes the key of the first put().
  TuneCache() = default;
  // Reads `path`. A missing file gives an empty cache with no warning; an unreadable or corrupt
  // file (bad JSON, wrong format tag, bad entry) gives an empty cache and a warning naming the
  // path and the problem: it is ignored, never half-used.
  static TuneCache load(const std::string& path);
  // Parses the JSON document (`origin` names it in errors); throws fp4moe::Error when malformed.
  static TuneCache from_json(const nlohmann::json& j, const std::string& origin);
  nlohmann::json to_json() const;
  // Writes atomically (temp file + rename), creating parent directories; throws naming the path.
  void save(const std::string& path) const;

  // The cached winner for (shape, token_bucket(tokens)) when `key` equals the cache's key.
  std::optional<int> lookup(const TuneKey& key, const GemmShape& shape, int64_t tokens) const;
  const TuneEntry* find(const TuneKey& key, const GemmShape& shape, int64_t tokens) const;
  // The fields where `key` differs from the cache's key (empty when equal or the cache has no key).
  std::vector<KeyDiff> stale_fields(const TuneKey& key) const;
  // Stores a winner measured under `key`. A different key than the cache's discards every entry
  // first (they belong to another setup), and is recorded as a warning.
  void put(const TuneKey& key, const TuneEntry& entry);

  const std::optional<TuneKey>& key() const { return key_; }
  const std::vector<TuneEntry>& entries() const { return entries_; }
  const std::string& path() const { return path_; }  // the file it was loaded from ("" when none)
  const std::vector<std::string>& warnings() const { return warnings_; }

 private:
  std::optional<TuneKey> key_;
  std::vector<TuneEntry> entries_;  // sorted by (shape, bucket)
  std::string path_;
  std::vector<std::string> warnings_;
};

// $FP4MOE_TUNE_CACHE, else $HOME/.cache/fp4moe/tune.json, else ./fp4moe-tune.json (no HOME).
std::string default_cache_path();

// The configs of kW4A16Configs the planner accepts for this shape and bucket on `gpu`, best
// planner estimate first (config ids). Throws the planner's nothing-fits message when none.
std::vector<int> feasible_configs(const GemmShape& shape, int64_t bucket, const plan::GpuSpec& gpu);

struct ConfigChoice {
  int config_id = -1;
  bool autotuned = false;
  std::string reason;  // "autotuned (12.3 us, runner-up ...)" or "planner top choice (no cache entry ...)"
};

// The kernel config the GPU MoE layer should launch: the cached winner when the cache's key
// matches, else the planner's top choice for the bucket (or the fallback given to set_fallback),
// with the reason (stale fields, corrupt file, no entry) in ConfigChoice::reason. Thread-safe;
// planner results are memoized per (shape, bucket).
class ConfigChooser {
 public:
  ConfigChooser(TuneCache cache, TuneKey key, plan::GpuSpec gpu);
  ConfigChoice choose_config(const GemmShape& shape, int64_t tokens_per_expert) const;
  // The same config id without the reason string (what a GPU MoE layer's eager forward asks for
  // every launch: no string building on the hot path).
  int choose_config_id(const GemmShape& shape, int64_t tokens_per_expert) const;
  const TuneCache& cache() const { return cache_; }
  const TuneKey& key() const { return key_; }
  // Where the cache has no winner: `fallback(shape, tokens_per_expert)` (named `what` in the reasons)
  // instead of the planner's top choice. The GPU models pass the kernels' measured defaults
  // (w4a16_default_config): the planner's roofline cannot rank the wgmma tiles against each other.
  void set_fallback(std::function<int(const GemmShape&, int64_t)> fallback, std::string what);
  // One line for a model's load log: "tune cache PATH: N winners for this GPU and build (used where
  // they exist, else ...)", or why none is used ("no tune cache at PATH", the stale fields, the
  // corrupt-file warning).
  std::string describe() const;

 private:
  std::string no_winner_note() const;  // why choose_config found no cached winner (cache-wide part)
  // The id and, when autotuned, the cache entry it came from (nullptr: the fallback or the planner).
  int pick(const GemmShape& shape, int64_t tokens_per_expert, const TuneEntry** entry) const;
  TuneCache cache_;
  TuneKey key_;
  plan::GpuSpec gpu_;
  std::function<int(const GemmShape&, int64_t)> fallback_;
  std::string fallback_what_;
  std::string stale_note_;  // describe_stale(...) when the cache's key differs, else ""
  mutable std::mutex mutex_;
  mutable std::map<std::tuple<int64_t, int64_t, int64_t, int64_t>, int> planner_memo_;
};

// The config id of a kW4A16Configs name; throws listing the names.
int config_id_by_name(std::string_view name);

}  // namespace fp4moe::tune
