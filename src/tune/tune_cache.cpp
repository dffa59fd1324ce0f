// The autotune cache: keys, staleness, JSON round trip, lookups and the config chooser's fallback
// to the planner. Needs no GPU. Tested by tests/tune/test_tune_cache.cpp.
#include "tune/tune_cache.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/error.h"
#include "core/file.h"
#include "format/json_file.h"
#include "plan/layout_sm90_w4a16.h"
#include "plan/planner.h"
#include "plan/w4a16_smem.h"

#include "fp4moe_git_commit.h"  // FP4MOE_GIT_COMMIT, generated at build time (cmake/git_commit.cmake)

#ifndef FP4MOE_VERSION
#define FP4MOE_VERSION "unknown"
#endif

namespace fp4moe::tune {

namespace {

std::string bucket_list_string() {
  std::string s;
  for (int64_t b : kTokenBuckets) {
    if (!s.empty()) s += ',';
    s += std::to_string(b);
  }
  return s;
}

bool is_bucket(int64_t v) {
  return std::find(std::begin(kTokenBuckets), std::end(kTokenBuckets), v) != std::end(kTokenBuckets);
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

// The comma-separated tokens of `text` (empty tokens kept, so they can be named).
std::vector<std::string_view> split_commas(std::string_view text) {
  std::vector<std::string_view> out;
  size_t start = 0;
  while (true) {
    const size_t comma = text.find(',', start);
    out.push_back(trim(text.substr(start, comma == std::string_view::npos ? std::string_view::npos : comma - start)));
    if (comma == std::string_view::npos) break;
    start = comma + 1;
  }
  return out;
}

std::optional<int64_t> parse_positive(std::string_view s) {
  int64_t v = 0;
  const auto [ptr, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || ptr != s.data() + s.size() || v <= 0) return std::nullopt;
  return v;
}

template <typename T>
T field(const nlohmann::json& j, const char* name, const std::string& where) {
  FP4MOE_CHECK(j.is_object() && j.contains(name)) << where << ": missing field '" << name << "'";
  try {
    return j.at(name).get<T>();
  } catch (const nlohmann::json::exception& e) {
    FP4MOE_FAIL() << where << ": field '" << name << "' has the wrong type (" << j.at(name).dump() << "): " << e.what();
  }
  return T{};
}

bool entry_less(const TuneEntry& a, const TuneEntry& b) {
  return std::tie(a.shape, a.bucket) < std::tie(b.shape, b.bucket);
}

}  // namespace

int64_t token_bucket(int64_t tokens_per_expert) {
  FP4MOE_CHECK(tokens_per_expert >= 0) << "token_bucket: tokens per expert must be >= 0, got " << tokens_per_expert;
  for (int64_t b : kTokenBuckets) {
    if (tokens_per_expert <= b) return b;
  }
  return std::end(kTokenBuckets)[-1];
}

std::vector<int64_t> parse_positive_list(std::string_view text, std::string_view option) {
  std::vector<int64_t> out;
  const std::vector<std::string_view> tokens = split_commas(text);
  for (size_t i = 0; i < tokens.size(); ++i) {
    const std::optional<int64_t> v = parse_positive(tokens[i]);
    FP4MOE_CHECK(v.has_value()) << option << " '" << text << "': entry " << i + 1 << " '" << tokens[i]
                                << "' is not a positive integer";
    out.push_back(*v);
  }
  return out;
}

std::vector<int64_t> parse_bucket_list(std::string_view text) {
  std::vector<int64_t> out;
  const std::vector<std::string_view> tokens = split_commas(text);
  for (size_t i = 0; i < tokens.size(); ++i) {
    const std::optional<int64_t> v = parse_positive(tokens[i]);
    FP4MOE_CHECK(v.has_value()) << "--tokens '" << text << "': entry " << i + 1 << " '" << tokens[i]
                                << "' is not a positive integer";
    FP4MOE_CHECK(is_bucket(*v)) << "--tokens '" << text << "': entry " << i + 1 << " '" << tokens[i]
                                << "' is not a token-count bucket (tokens per expert; buckets: " << bucket_list_string()
                                << ")";
    if (std::find(out.begin(), out.end(), *v) == out.end()) out.push_back(*v);
  }
  return out;
}

std::string GemmShape::to_string() const {
  return "E=" + std::to_string(n_experts) + ",N=" + std::to_string(n) + ",K=" + std::to_string(k);
}

std::vector<GemmShape> parse_shape_list(std::string_view text) {
  const std::vector<std::string_view> tokens = split_commas(text);
  std::vector<int64_t> values;
  for (size_t i = 0; i < tokens.size(); ++i) {
    const std::optional<int64_t> v = parse_positive(tokens[i]);
    FP4MOE_CHECK(v.has_value()) << "--shape '" << text << "': entry " << i + 1 << " '" << tokens[i]
                                << "' is not a positive integer (expected E,N,K[,E,N,K...])";
    values.push_back(*v);
  }
  FP4MOE_CHECK(values.size() % 3 == 0) << "--shape '" << text << "': " << values.size()
                                       << " numbers is not a multiple of 3 (expected E,N,K[,E,N,K...])";
  std::vector<GemmShape> out;
  for (size_t i = 0; i < values.size(); i += 3) {
    const GemmShape s{values[i], values[i + 1], values[i + 2]};
    const std::string n_refusal = plan::w4a16_n_refusal(s.n), k_refusal = plan::w4a16_k_refusal(s.k);
    FP4MOE_CHECK(n_refusal.empty()) << "--shape '" << text << "': entry " << i + 2 << " " << n_refusal;
    FP4MOE_CHECK(k_refusal.empty()) << "--shape '" << text << "': entry " << i + 3 << " " << k_refusal;
    out.push_back(s);
  }
  return out;
}

void check_shape(const GemmShape& s, const std::string& what) {
  FP4MOE_CHECK(s.n_experts >= 1 && s.n > 0 && s.k > 0) << what << ": shape " << s.to_string() << " must be positive";
  for (const std::string& refusal : {plan::w4a16_n_refusal(s.n), plan::w4a16_k_refusal(s.k)}) {
    FP4MOE_CHECK(refusal.empty()) << what << ": " << refusal;
  }
}

std::string layout_version() { return layout_version(plan::kW4A16Configs, plan::kNumW4A16Configs); }

std::string layout_version(const plan::W4A16Config* configs, int n_configs) {
  uint64_t h = 1469598103934665603ull;  // FNV-1a 64 offset basis
  auto mix = [&h](uint32_t v) {
    for (int i = 0; i < 4; ++i) {
      h ^= (v >> (8 * i)) & 0xFFu;
      h *= 1099511628211ull;
    }
  };
  mix(static_cast<uint32_t>(n_configs));
  for (int i = 0; i < n_configs; ++i) {
    const plan::W4A16Config& c = configs[i];
    mix(c.block_w);
    mix(c.block_t);
    mix(c.block_k);
    mix(c.stages);
    mix(plan::W4A16Layout::make(c).total_bytes());  // a kind's shared-memory layout changing (e.g. an mbarrier added)
    mix(plan::W4A16Layout::make(c).ring_warp_bytes);
    mix(c.n_threads());  // rows per warp changing (kStream: one row tile per warp, then two) at the same bytes
    // The name too: it spells every field that changes the kernel (a field added to W4A16Config
    // later, such as a kernel kind, reaches the hash through it).
    for (char ch : plan::w4a16_config_name(c)) mix(static_cast<uint8_t>(ch));
  }
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(h));
  return buf;
}

std::string build_id() { return std::string(FP4MOE_VERSION) + "+" + FP4MOE_GIT_COMMIT; }

nlohmann::json TuneKey::to_json() const {
  return {{"gpu_name", gpu_name},         {"n_sms", n_sms},       {"cuda_runtime", cuda_runtime},
          {"cuda_driver", cuda_driver},   {"build_id", build_id}, {"layout_version", layout_version}};
}

TuneKey TuneKey::from_json(const nlohmann::json& j) {
  const std::string where = "tune cache key";
  TuneKey k;
  k.gpu_name = field<std::string>(j, "gpu_name", where);
  k.n_sms = field<int>(j, "n_sms", where);
  k.cuda_runtime = field<int>(j, "cuda_runtime", where);
  k.cuda_driver = field<int>(j, "cuda_driver", where);
  k.build_id = field<std::string>(j, "build_id", where);
  k.layout_version = field<std::string>(j, "layout_version", where);
  return k;
}

std::string TuneKey::to_string() const {
  std::ostringstream os;
  os << gpu_name << ", " << n_sms << " SMs, CUDA runtime " << cuda_runtime << ", driver " << cuda_driver << ", build "
     << build_id << ", layout " << layout_version;
  return os.str();
}

std::vector<KeyDiff> diff_keys(const TuneKey& o, const TuneKey& n) {
  std::vector<KeyDiff> out;
  auto q = [](const std::string& s) { return "'" + s + "'"; };
  if (o.gpu_name != n.gpu_name) out.push_back({"gpu_name", q(o.gpu_name), q(n.gpu_name)});
  if (o.n_sms != n.n_sms) out.push_back({"n_sms", std::to_string(o.n_sms), std::to_string(n.n_sms)});
  if (o.cuda_runtime != n.cuda_runtime) {
    out.push_back({"cuda_runtime", std::to_string(o.cuda_runtime), std::to_string(n.cuda_runtime)});
  }
  if (o.cuda_driver != n.cuda_driver) {
    out.push_back({"cuda_driver", std::to_string(o.cuda_driver), std::to_string(n.cuda_driver)});
  }
  if (o.build_id != n.build_id) out.push_back({"build_id", q(o.build_id), q(n.build_id)});
  if (o.layout_version != n.layout_version) out.push_back({"layout_version", q(o.layout_version), q(n.layout_version)});
  return out;
}

std::string describe_stale(const std::string& path, const std::vector<KeyDiff>& diffs) {
  std::string s = "stale tune cache " + (path.empty() ? std::string("(in memory)") : path) +
                  " (tuned under another key, not used):";
  for (size_t i = 0; i < diffs.size(); ++i) {
    s += i == 0 ? " " : "; ";
    s += diffs[i].field + " " + diffs[i].old_value + " -> " + diffs[i].new_value;
  }
  return s;
}

TuneCache TuneCache::from_json(const nlohmann::json& j, const std::string& origin) {
  FP4MOE_CHECK(j.is_object()) << origin << ": expected a JSON object, got " << j.type_name();
  const std::string format = field<std::string>(j, "format", origin);
  FP4MOE_CHECK(format == kCacheFormat) << origin << ": format '" << format << "', expected '" << kCacheFormat << "'";
  TuneCache c;
  FP4MOE_CHECK(j.contains("key")) << origin << ": missing field 'key'";
  if (!j.at("key").is_null()) c.key_ = TuneKey::from_json(j.at("key"));
  FP4MOE_CHECK(j.contains("entries") && j.at("entries").is_array()) << origin << ": missing array 'entries'";
  FP4MOE_CHECK(c.key_.has_value() || j.at("entries").empty())
      << origin << ": " << j.at("entries").size() << " entries without a key";
  size_t i = 0;
  for (const nlohmann::json& e : j.at("entries")) {
    const std::string where = origin + ": entry " + std::to_string(i++);
    TuneEntry t;
    FP4MOE_CHECK(e.is_object() && e.contains("shape")) << where << ": missing field 'shape'";
    t.shape.n_experts = field<int64_t>(e.at("shape"), "E", where);
    t.shape.n = field<int64_t>(e.at("shape"), "N", where);
    t.shape.k = field<int64_t>(e.at("shape"), "K", where);
    FP4MOE_CHECK(t.shape.n_experts > 0 && t.shape.n > 0 && t.shape.k > 0) << where << ": bad shape " << t.shape.to_string();
    t.bucket = field<int64_t>(e, "tokens_bucket", where);
    FP4MOE_CHECK(is_bucket(t.bucket)) << where << ": tokens_bucket " << t.bucket << " is not one of "
                                      << bucket_list_string();
    t.config = field<std::string>(e, "config", where);
    t.config_id = field<int>(e, "config_id", where);
    FP4MOE_CHECK(t.config_id >= 0 && t.config_id < plan::kNumW4A16Configs &&
                 plan::w4a16_config_name(plan::kW4A16Configs[t.config_id]) == t.config)
        << where << ": config_id " << t.config_id << " is not config '" << t.config << "' of this build ("
        << plan::kNumW4A16Configs << " configs)";
    t.time_us = field<double>(e, "time_us", where);
    t.runner_up = field<std::string>(e, "runner_up", where);
    t.runner_up_id = field<int>(e, "runner_up_id", where);
    t.runner_up_us = field<double>(e, "runner_up_us", where);
    t.iters = field<int>(e, "iters", where);
    t.n_candidates = field<int>(e, "candidates", where);
    for (const TuneEntry& prev : c.entries_) {
      FP4MOE_CHECK(!(prev.shape == t.shape && prev.bucket == t.bucket))
          << where << ": duplicate entry for " << t.shape.to_string() << " bucket " << t.bucket;
    }
    c.entries_.push_back(t);
  }
  std::sort(c.entries_.begin(), c.entries_.end(), entry_less);
  return c;
}

nlohmann::json TuneCache::to_json() const {
  nlohmann::json entries = nlohmann::json::array();
  for (const TuneEntry& t : entries_) {
    entries.push_back({{"shape", {{"E", t.shape.n_experts}, {"N", t.shape.n}, {"K", t.shape.k}}},
                       {"tokens_bucket", t.bucket},
                       {"config", t.config},
                       {"config_id", t.config_id},
                       {"time_us", t.time_us},
                       {"runner_up", t.runner_up},
                       {"runner_up_id", t.runner_up_id},
                       {"runner_up_us", t.runner_up_us},
                       {"iters", t.iters},
                       {"candidates", t.n_candidates}});
  }
  return {{"format", kCacheFormat},
          {"key", key_ ? key_->to_json() : nlohmann::json(nullptr)},
          {"entries", entries}};
}

TuneCache TuneCache::load(const std::string& path) {
  TuneCache empty;
  empty.path_ = path;
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) return empty;
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    empty.warnings_.push_back("cannot read tune cache " + path + ": " + std::strerror(errno) + "; ignoring it");
    return empty;
  }
  std::stringstream text;
  text << in.rdbuf();
  try {
    TuneCache c = from_json(format::parse_json_text(text.str(), path), path);
    c.path_ = path;
    return c;
  } catch (const std::exception& e) {
    empty.warnings_.push_back("ignoring corrupt tune cache " + path + " (" + std::to_string(text.str().size()) +
                              " bytes): " + e.what());
    return empty;
  }
}

void TuneCache::save(const std::string& path) const {
  const std::filesystem::path p(path);
  std::error_code ec;
  if (p.has_parent_path()) {
    std::filesystem::create_directories(p.parent_path(), ec);
    FP4MOE_CHECK(!ec) << "cannot create the directory " << p.parent_path().string() << " for the tune cache: "
                      << ec.message();
  }
  const std::string target = rename_target(p, "the tune cache " + path).string();  // a link's file, never /dev/null
  const std::string tmp = target + ".tmp." + std::to_string(::getpid());
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    FP4MOE_CHECK(out.good()) << "cannot write the tune cache " << tmp << ": " << std::strerror(errno);
    out << to_json().dump(2) << "\n";
    out.close();
    FP4MOE_CHECK(out.good()) << "error writing the tune cache " << tmp;
  }
  std::filesystem::rename(tmp, target, ec);
  if (ec) {
    std::filesystem::remove(tmp);
    FP4MOE_FAIL() << "cannot rename " << tmp << " to " << target << ": " << ec.message();
  }
}

const TuneEntry* TuneCache::find(const TuneKey& key, const GemmShape& shape, int64_t tokens) const {
  if (!key_ || !(*key_ == key)) return nullptr;
  const int64_t bucket = token_bucket(tokens);
  for (const TuneEntry& t : entries_) {
    if (t.shape == shape && t.bucket == bucket) return &t;
  }
  return nullptr;
}

std::optional<int> TuneCache::lookup(const TuneKey& key, const GemmShape& shape, int64_t tokens) const {
  const TuneEntry* t = find(key, shape, tokens);
  if (t == nullptr) return std::nullopt;
  return t->config_id;
}

std::vector<KeyDiff> TuneCache::stale_fields(const TuneKey& key) const {
  if (!key_) return {};
  return diff_keys(*key_, key);
}

void TuneCache::put(const TuneKey& key, const TuneEntry& entry) {
  FP4MOE_CHECK(entry.config_id >= 0 && entry.config_id < plan::kNumW4A16Configs)
      << "tune cache: config id " << entry.config_id << " out of range (" << plan::kNumW4A16Configs << " configs)";
  FP4MOE_CHECK(is_bucket(entry.bucket)) << "tune cache: bucket " << entry.bucket << " is not one of " << bucket_list_string();
  if (key_ && !(*key_ == key)) {
    warnings_.push_back(describe_stale(path_, diff_keys(*key_, key)) + "; its " + std::to_string(entries_.size()) +
                        " entries are discarded");
    entries_.clear();
  }
  key_ = key;
  TuneEntry e = entry;
  e.config = plan::w4a16_config_name(plan::kW4A16Configs[e.config_id]);
  for (TuneEntry& t : entries_) {
    if (t.shape == e.shape && t.bucket == e.bucket) {
      t = e;
      return;
    }
  }
  entries_.push_back(e);
  std::sort(entries_.begin(), entries_.end(), entry_less);
}

std::string default_cache_path() {
  if (const char* env = std::getenv("FP4MOE_TUNE_CACHE"); env != nullptr && *env != '\0') return env;
  if (const char* home = std::getenv("HOME"); home != nullptr && *home != '\0') {
    return std::string(home) + "/.cache/fp4moe/tune.json";
  }
  return "fp4moe-tune.json";
}

int config_id_by_name(std::string_view name) {
  std::string known;
  for (int i = 0; i < plan::kNumW4A16Configs; ++i) {
    const std::string n = plan::w4a16_config_name(plan::kW4A16Configs[i]);
    if (n == name) return i;
    if (i > 0) known += ", ";
    known += n;
  }
  FP4MOE_FAIL() << "unknown W4A16 config '" << name << "'; known: " << known;
  return -1;
}

std::vector<int> feasible_configs(const GemmShape& shape, int64_t bucket, const plan::GpuSpec& gpu) {
  plan::GemmProblem p;
  p.name = "gemm " + shape.to_string() + " tokens/expert=" + std::to_string(bucket);
  p.n_groups = shape.n_experts;
  p.m = static_cast<double>(bucket);
  p.n = shape.n;
  p.k = shape.k;
  p.total_tokens = shape.n_experts * bucket;
  plan::PlanOptions options;
  options.family = plan::KernelFamily::kSm90W4A16;
  const plan::GemmPlan plan = plan::plan_gemm(p, gpu, options);
  FP4MOE_CHECK(!plan.ranked.empty()) << plan.error;
  std::vector<int> ids;
  for (const plan::CandidateResult& r : plan.ranked) {
    const int id = r.candidate.base_tile_index;
    FP4MOE_CHECK(id >= 0 && id < plan::kNumW4A16Configs)
        << "planner candidate " << r.candidate.to_string() << " has config id " << id << " outside 0.."
        << plan::kNumW4A16Configs - 1;
    ids.push_back(id);
  }
  return ids;
}

ConfigChooser::ConfigChooser(TuneCache cache, TuneKey key, plan::GpuSpec gpu)
    : cache_(std::move(cache)), key_(std::move(key)), gpu_(std::move(gpu)) {
  const std::vector<KeyDiff> diffs = cache_.stale_fields(key_);
  if (!diffs.empty()) stale_note_ = describe_stale(cache_.path(), diffs);
}

int ConfigChooser::pick(const GemmShape& shape, int64_t tokens_per_expert, const TuneEntry** entry) const {
  const int64_t bucket = token_bucket(tokens_per_expert);
  *entry = cache_.find(key_, shape, bucket);
  if (*entry != nullptr) return (*entry)->config_id;
  if (fallback_) {
    const int id = fallback_(shape, tokens_per_expert);
    FP4MOE_CHECK(id >= 0 && id < plan::kNumW4A16Configs)
        << "tune: the fallback " << fallback_what_ << " returned config id " << id << " (ids 0.."
        << plan::kNumW4A16Configs - 1 << ")";
    return id;
  }
  std::lock_guard<std::mutex> lock(mutex_);
  const auto memo_key = std::make_tuple(shape.n_experts, shape.n, shape.k, bucket);
  auto it = planner_memo_.find(memo_key);
  if (it == planner_memo_.end()) it = planner_memo_.emplace(memo_key, feasible_configs(shape, bucket, gpu_).front()).first;
  return it->second;
}

int ConfigChooser::choose_config_id(const GemmShape& shape, int64_t tokens_per_expert) const {
  const TuneEntry* entry = nullptr;
  return pick(shape, tokens_per_expert, &entry);
}

ConfigChoice ConfigChooser::choose_config(const GemmShape& shape, int64_t tokens_per_expert) const {
  const int64_t bucket = token_bucket(tokens_per_expert);
  ConfigChoice out;
  const TuneEntry* t = nullptr;
  out.config_id = pick(shape, tokens_per_expert, &t);
  out.autotuned = t != nullptr;
  if (t != nullptr) {
    std::ostringstream os;
    os << "autotuned: " << t->config << " " << t->time_us << " us (median of " << t->iters << ", "
       << t->n_candidates << " configs timed";
    if (t->runner_up_id >= 0) os << "; runner-up " << t->runner_up << " " << t->runner_up_us << " us";
    os << ") for " << shape.to_string() << " bucket " << bucket << " from " << cache_.path();
    out.reason = os.str();
    return out;
  }
  std::string why = no_winner_note();
  if (why.empty()) {
    why = "no entry for " + shape.to_string() + " bucket " + std::to_string(bucket) + " in " +
          (cache_.path().empty() ? std::string("the tune cache") : cache_.path()) + "; run `fp4moe tune`";
  }
  const std::string name = plan::w4a16_config_name(plan::kW4A16Configs[out.config_id]);
  out.reason = fallback_ ? fallback_what_ + " " + name + " for " + shape.to_string() + " at " +
                               std::to_string(tokens_per_expert) + " tokens per expert (" + why + ")"
                         : "planner top choice " + name + " for " + shape.to_string() + " bucket " +
                               std::to_string(bucket) + " on " + gpu_.name + " (" + why + ")";
  return out;
}

std::string ConfigChooser::no_winner_note() const {
  if (!stale_note_.empty()) return stale_note_;
  if (!cache_.warnings().empty()) return cache_.warnings().front();
  if (!cache_.key().has_value()) return cache_.path().empty() ? "no tune cache" : "no tune cache at " + cache_.path();
  return "";
}

void ConfigChooser::set_fallback(std::function<int(const GemmShape&, int64_t)> fallback, std::string what) {
  fallback_ = std::move(fallback);
  fallback_what_ = std::move(what);
}

std::string ConfigChooser::describe() const {
  const std::string otherwise = fallback_ ? fallback_what_ : std::string("the planner's top choice");
  const std::string note = no_winner_note();
  if (!note.empty()) return note + ": " + otherwise + " for every shape";
  return "tune cache " + cache_.path() + ": " + std::to_string(cache_.entries().size()) +
         " winners for this GPU and build (used where one exists for the shape and token bucket, else " + otherwise + ")";
}

}  // namespace fp4moe::tune
