// The autotune cache on the CPU: token buckets, shape and list parsing (errors name the bad token),
// the layout version hash, key differences and the stale message, the JSON round trip through a
// file, corrupt files (reported with the path, ignored), put() under a new key, the config
// chooser's fallback to the planner (and its reason), feasible configs per GPU, and the routing
// counts (uniform, seeded Zipf). No GPU needed.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <random>
#include <string>

#include "core/error.h"
#include "plan/gpu_table.h"
#include "plan/w4a16_smem.h"
#include "testing/testing.h"
#include "tune/routing_counts.h"
#include "tune/tune_cache.h"

namespace fp4moe::tune {
namespace {

// Success when `needle` occurs in `hay` (fp4moe::Error messages carry "check failed: <cond>: "
// before and " [file:line]" after the text the tests pin).
::testing::AssertionResult Contains(const std::string& hay, const std::string& needle) {
  if (hay.find(needle) != std::string::npos) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "'" << needle << "'\n  not in '" << hay << "'";
}
#define EXPECT_HAS(hay, needle) EXPECT_TRUE(Contains(hay, needle))

// The message of the fp4moe::Error `fn` throws ("" when it throws nothing).
using fp4moe::testing::error_of;

TuneKey key_a() {
  return TuneKey{"NVIDIA H200", 132, 13000, 13000, "0.1.0+abc", layout_version()};
}

TuneEntry entry(GemmShape s, int64_t bucket, int config, double us, int runner_up, double runner_us) {
  TuneEntry e;
  e.shape = s;
  e.bucket = bucket;
  e.config_id = config;
  e.config = plan::w4a16_config_name(plan::kW4A16Configs[config]);
  e.time_us = us;
  e.runner_up_id = runner_up;
  e.runner_up = runner_up >= 0 ? plan::w4a16_config_name(plan::kW4A16Configs[runner_up]) : "";
  e.runner_up_us = runner_us;
  e.iters = 30;
  e.n_candidates = 9;
  return e;
}

std::filesystem::path temp_dir(const std::string& name) {
  const auto dir = std::filesystem::temp_directory_path() /
                   ("fp4moe_tune_" + name + "_" + std::to_string(testing::test_seed()) + "_" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

const GemmShape kGateUp{32, 4096, 6144};
const GemmShape kDown{32, 6144, 2048};

TEST(TokenBucket, NextPowerOfTwoCappedAt512) {
  EXPECT_EQ(token_bucket(0), 1);
  EXPECT_EQ(token_bucket(1), 1);
  EXPECT_EQ(token_bucket(2), 2);
  EXPECT_EQ(token_bucket(3), 4);
  EXPECT_EQ(token_bucket(5), 8);
  EXPECT_EQ(token_bucket(9), 16);
  EXPECT_EQ(token_bucket(64), 64);
  EXPECT_EQ(token_bucket(65), 128);
  EXPECT_EQ(token_bucket(257), 512);
  EXPECT_EQ(token_bucket(512), 512);
  EXPECT_EQ(token_bucket(513), 512);
  EXPECT_EQ(token_bucket(100000), 512);
  for (int64_t b : kTokenBuckets) EXPECT_EQ(token_bucket(b), b);
  EXPECT_NE(error_of([] { token_bucket(-1); }).find("got -1"), std::string::npos);
}

TEST(Parsing, BucketListNamesTheBadToken) {
  EXPECT_EQ(parse_bucket_list("1,2,8,8,512"), (std::vector<int64_t>{1, 2, 8, 512}));
  EXPECT_HAS(error_of([] { parse_bucket_list("1,3"); }),
             "--tokens '1,3': entry 2 '3' is not a token-count bucket (tokens per expert; buckets: "
             "1,2,4,8,16,32,64,128,256,512)");
  EXPECT_HAS(error_of([] { parse_bucket_list("1,,2"); }), "--tokens '1,,2': entry 2 '' is not a positive integer");
  EXPECT_HAS(error_of([] { parse_positive_list("4,-1", "--tokens"); }),
             "--tokens '4,-1': entry 2 '-1' is not a positive integer");
}

TEST(Parsing, ShapeListNamesTheBadEntry) {
  const std::vector<GemmShape> s = parse_shape_list("32,4096,6144, 32,6144,2048");
  ASSERT_EQ(s.size(), 2u);
  EXPECT_EQ(s[0], kGateUp);
  EXPECT_EQ(s[1], kDown);
  EXPECT_EQ(s[1].to_string(), "E=32,N=6144,K=2048");
  EXPECT_HAS(error_of([] { parse_shape_list("32,40x96,6144"); }),
             "--shape '32,40x96,6144': entry 2 '40x96' is not a positive integer (expected E,N,K[,E,N,K...])");
  EXPECT_HAS(error_of([] { parse_shape_list("32,4096"); }),
            "--shape '32,4096': 2 numbers is not a multiple of 3 (expected E,N,K[,E,N,K...])");
  EXPECT_HAS(error_of([] { parse_shape_list("32,4096,6144,1,4100,64"); }),
             "--shape '32,4096,6144,1,4100,64': entry 5 N=4100 must be a positive multiple of 8 (16 B output stores; N "
             "% 8 = 4)");
  EXPECT_HAS(error_of([] { parse_shape_list("1,64,100"); }),
             "--shape '1,64,100': entry 3 K=100 must be a positive multiple of 16 (one NVFP4 block; K % 16 = 4)");
  EXPECT_NE(error_of([] { parse_shape_list("0,64,64"); }).find("entry 1 '0'"), std::string::npos);
  EXPECT_NE(error_of([] { check_shape({1, 64, 72}, "cfg down"); }).find("cfg down: K=72"), std::string::npos);
}

TEST(LayoutVersion, HashesEveryConfigField) {
  const std::string v = layout_version();
  EXPECT_EQ(v.size(), 16u);
  EXPECT_EQ(v.find_first_not_of("0123456789abcdef"), std::string::npos) << v;
  EXPECT_EQ(v, layout_version(plan::kW4A16Configs, plan::kNumW4A16Configs));
  std::vector<plan::W4A16Config> table(plan::kW4A16Configs, plan::kW4A16Configs + plan::kNumW4A16Configs);
  std::mt19937_64 rng(testing::test_seed());
  const size_t i = rng() % table.size();
  auto changed = table;
  changed[i].stages = changed[i].stages == 4 ? 3 : 4;  // one field of one config
  EXPECT_NE(layout_version(changed.data(), static_cast<int>(changed.size())), v) << "config " << i;
  auto swapped = table;
  std::swap(swapped[0], swapped[1]);  // reordering changes what a cached id means
  EXPECT_NE(layout_version(swapped.data(), static_cast<int>(swapped.size())), v);
  EXPECT_NE(layout_version(table.data(), static_cast<int>(table.size()) - 1), v);
}

TEST(TuneKey, DiffNamesEachFieldOldAndNew) {
  TuneKey b = key_a();
  EXPECT_TRUE(diff_keys(key_a(), b).empty());
  b.gpu_name = "NVIDIA H100 80GB HBM3";
  b.n_sms = 114;
  b.cuda_driver = 13010;
  const std::vector<KeyDiff> d = diff_keys(key_a(), b);
  ASSERT_EQ(d.size(), 3u);
  EXPECT_EQ(describe_stale("/c/tune.json", d),
            "stale tune cache /c/tune.json (tuned under another key, not used): gpu_name 'NVIDIA H200' -> 'NVIDIA H100 "
            "80GB HBM3'; n_sms 132 -> 114; cuda_driver 13000 -> 13010");
  TuneKey c = key_a();
  c.build_id = "0.1.0+def";
  c.layout_version = "0000000000000000";
  c.cuda_runtime = 12080;
  const std::vector<KeyDiff> d2 = diff_keys(key_a(), c);
  ASSERT_EQ(d2.size(), 3u);
  EXPECT_EQ(d2[0].field, "cuda_runtime");
  EXPECT_EQ(d2[1].field, "build_id");
  EXPECT_EQ(d2[1].old_value, "'0.1.0+abc'");
  EXPECT_EQ(d2[2].field, "layout_version");
  EXPECT_EQ(TuneKey::from_json(key_a().to_json()), key_a());
  nlohmann::json j = key_a().to_json();
  j.erase("n_sms");
  EXPECT_HAS(error_of([&] { TuneKey::from_json(j); }), "tune cache key: missing field 'n_sms'");
}

TEST(BuildId, VersionPlusCommit) {
  const std::string id = build_id();
  EXPECT_EQ(id.rfind("0.", 0), 0u) << id;  // project version first
  EXPECT_NE(id.find('+'), std::string::npos) << id;
}

// save renames over the path: a link is followed to its file (kept as a link), a device is refused, and a cache nested
// thousands deep loads as corrupt (it segfaulted the parse) instead of crashing.
TEST(TuneCache, SaveFollowsLinksAndRefusesDevices) {
  TuneCache c;
  c.put(key_a(), entry(kDown, 8, 3, 21.5, 4, 22.25));
  const auto dir = temp_dir("links");
  std::filesystem::create_symlink(dir / "real.json", dir / "link.json");
  c.save((dir / "link.json").string());
  EXPECT_TRUE(std::filesystem::is_symlink(dir / "link.json"));
  EXPECT_EQ(TuneCache::load((dir / "real.json").string()).to_json(), c.to_json());
  std::filesystem::create_symlink("/dev/null", dir / "null.json");
  EXPECT_THROW(c.save((dir / "null.json").string()), Error);
  std::ofstream(dir / "deep.json") << std::string(100000, '[') << std::string(100000, ']');
  const TuneCache deep = TuneCache::load((dir / "deep.json").string());
  ASSERT_FALSE(deep.warnings().empty());
  EXPECT_NE(deep.warnings()[0].find("JSON nests deeper than 256 levels"), std::string::npos) << deep.warnings()[0];
}

TEST(TuneCache, RoundTripsThroughAFile) {
  TuneCache c;
  c.put(key_a(), entry(kDown, 8, 3, 21.5, 4, 22.25));
  c.put(key_a(), entry(kGateUp, 1, 2, 40.0, -1, 0));
  c.put(key_a(), entry(kGateUp, 8, 3, 41.0, 0, 43.5));
  c.put(key_a(), entry(kGateUp, 8, 5, 39.0, 3, 41.0));  // replaces (kGateUp, 8)
  ASSERT_EQ(c.entries().size(), 3u);
  EXPECT_TRUE(c.warnings().empty());
  const auto dir = temp_dir("roundtrip");
  const std::string path = (dir / "sub" / "tune.json").string();  // parent created by save
  c.save(path);
  const TuneCache d = TuneCache::load(path);
  EXPECT_TRUE(d.warnings().empty()) << d.warnings().front();
  EXPECT_EQ(d.path(), path);
  ASSERT_TRUE(d.key().has_value());
  EXPECT_EQ(*d.key(), key_a());
  EXPECT_EQ(d.to_json(), c.to_json());
  ASSERT_EQ(d.entries().size(), 3u);
  EXPECT_EQ(d.lookup(key_a(), kGateUp, 8), 5);
  EXPECT_EQ(d.lookup(key_a(), kGateUp, 5), 5);  // bucket 8
  EXPECT_EQ(d.lookup(key_a(), kGateUp, 1), 2);
  EXPECT_EQ(d.lookup(key_a(), kDown, 7), 3);
  EXPECT_EQ(d.lookup(key_a(), kDown, 16), std::nullopt);
  EXPECT_EQ(d.lookup(key_a(), GemmShape{32, 4096, 2048}, 8), std::nullopt);
  const TuneEntry* e = d.find(key_a(), kGateUp, 8);
  ASSERT_NE(e, nullptr);
  EXPECT_EQ(e->config, plan::w4a16_config_name(plan::kW4A16Configs[5]));
  EXPECT_EQ(e->runner_up_id, 3);
  EXPECT_DOUBLE_EQ(e->runner_up_us, 41.0);
  std::filesystem::remove_all(dir);
}

TEST(TuneCache, StaleKeyIsNeverUsed) {
  TuneCache c;
  c.put(key_a(), entry(kGateUp, 8, 3, 41.0, 0, 43.5));
  for (int field = 0; field < 6; ++field) {
    TuneKey k = key_a();
    if (field == 0) k.gpu_name = "NVIDIA H100";
    if (field == 1) k.n_sms = 114;
    if (field == 2) k.cuda_runtime = 12080;
    if (field == 3) k.cuda_driver = 12080;
    if (field == 4) k.build_id = "0.1.0+fff";
    if (field == 5) k.layout_version = "0123456789abcdef";
    EXPECT_EQ(c.lookup(k, kGateUp, 8), std::nullopt) << "field " << field;
    EXPECT_EQ(c.stale_fields(k).size(), 1u) << "field " << field;
  }
  // put() under a new key drops the old setup's entries and says so.
  TuneKey k = key_a();
  k.n_sms = 114;
  c.put(k, entry(kDown, 1, 0, 10.0, 1, 11.0));
  ASSERT_EQ(c.entries().size(), 1u);
  EXPECT_EQ(*c.key(), k);
  ASSERT_EQ(c.warnings().size(), 1u);
  EXPECT_NE(c.warnings()[0].find("n_sms 132 -> 114"), std::string::npos) << c.warnings()[0];
  EXPECT_NE(c.warnings()[0].find("its 1 entries are discarded"), std::string::npos) << c.warnings()[0];
  EXPECT_EQ(c.lookup(key_a(), kGateUp, 8), std::nullopt);
}

TEST(TuneCache, MissingFileIsEmptyWithoutWarning) {
  const auto dir = temp_dir("missing");
  const TuneCache c = TuneCache::load((dir / "none.json").string());
  EXPECT_FALSE(c.key().has_value());
  EXPECT_TRUE(c.entries().empty());
  EXPECT_TRUE(c.warnings().empty());
  std::filesystem::remove_all(dir);
}

TEST(TuneCache, CorruptFileIsReportedWithItsPathAndIgnored) {
  const auto dir = temp_dir("corrupt");
  TuneCache good;
  good.put(key_a(), entry(kGateUp, 8, 3, 41.0, 0, 43.5));
  struct Case {
    std::string name, text, expect;
  };
  nlohmann::json bad_config = good.to_json();
  bad_config["entries"][0]["config"] = "w4a16_swapab_m96n64k64_s9";  // no such config
  nlohmann::json bad_bucket = good.to_json();
  bad_bucket["entries"][0]["tokens_bucket"] = 3;
  nlohmann::json bad_format = good.to_json();
  bad_format["format"] = "fp4moe.tune.v0";
  nlohmann::json no_time = good.to_json();
  no_time["entries"][0].erase("time_us");
  const std::vector<Case> cases = {
      {"truncated.json", good.to_json().dump().substr(0, 40), "parse error"},
      {"bad_config.json", bad_config.dump(), "entry 0: config_id 3 is not config 'w4a16_swapab_m96n64k64_s9'"},
      {"bad_bucket.json", bad_bucket.dump(), "entry 0: tokens_bucket 3 is not one of 1,2,4"},
      {"bad_format.json", bad_format.dump(), "format 'fp4moe.tune.v0', expected 'fp4moe.tune.v1'"},
      {"no_time.json", no_time.dump(), "entry 0: missing field 'time_us'"},
      {"array.json", "[1, 2]", "expected a JSON object, got array"},
  };
  for (const Case& k : cases) {
    const std::string path = (dir / k.name).string();
    std::ofstream(path) << k.text;
    const TuneCache c = TuneCache::load(path);
    EXPECT_FALSE(c.key().has_value()) << k.name;
    EXPECT_TRUE(c.entries().empty()) << k.name;
    ASSERT_EQ(c.warnings().size(), 1u) << k.name;
    EXPECT_EQ(c.warnings()[0].rfind("ignoring corrupt tune cache " + path, 0), 0u) << c.warnings()[0];
    EXPECT_NE(c.warnings()[0].find(k.expect), std::string::npos) << k.name << ": " << c.warnings()[0];
    EXPECT_EQ(c.lookup(key_a(), kGateUp, 8), std::nullopt) << k.name;
  }
  std::filesystem::remove_all(dir);
}

TEST(TuneCache, DefaultPathHonoursTheEnvironment) {
  const char* old = std::getenv("FP4MOE_TUNE_CACHE");
  const std::string saved = old ? old : "";
  ::setenv("FP4MOE_TUNE_CACHE", "/tmp/x/tune.json", 1);
  EXPECT_EQ(default_cache_path(), "/tmp/x/tune.json");
  ::unsetenv("FP4MOE_TUNE_CACHE");
  if (const char* home = std::getenv("HOME")) {
    EXPECT_EQ(default_cache_path(), std::string(home) + "/.cache/fp4moe/tune.json");
  }
  if (old) ::setenv("FP4MOE_TUNE_CACHE", saved.c_str(), 1);
}

TEST(FeasibleConfigs, AllShippedConfigsOnHopperFewerWithLessSmem) {
  const std::vector<int> ids = feasible_configs(kGateUp, 8, plan::require_gpu("h200"));
  EXPECT_EQ(ids.size(), static_cast<size_t>(plan::kNumW4A16Configs));
  std::vector<int> sorted = ids;
  std::sort(sorted.begin(), sorted.end());
  for (int i = 0; i < plan::kNumW4A16Configs; ++i) EXPECT_EQ(sorted[static_cast<size_t>(i)], i);
  // A GPU with less shared memory, no wgmma and no TMA (sm_89): exactly the pipeline configs whose layout fits
  // its opt-in limit (wgmma m128n32_s4 fits it, 98368 B, and the stream configs do: both are out by the
  // architecture).
  const plan::GpuSpec small = plan::require_gpu("rtx-4090");
  const std::vector<int> fit = feasible_configs(kGateUp, 8, small);
  for (int i = 0; i < plan::kNumW4A16Configs; ++i) {
    const bool fits = plan::w4a16_smem_refusal(plan::kW4A16Configs[i], small.smem_optin_per_block).empty() &&
                      plan::kW4A16Configs[i].kind == plan::W4A16Kind::kPipeline;
    EXPECT_EQ(std::find(fit.begin(), fit.end(), i) != fit.end(), fits) << plan::w4a16_config_name(plan::kW4A16Configs[i]);
  }
}

TEST(ConfigChooser, FallsBackToThePlannerAndSaysWhy) {
  const plan::GpuSpec h200 = plan::require_gpu("h200");
  const auto dir = temp_dir("chooser");
  const std::string path = (dir / "tune.json").string();
  for (int64_t tokens : {1, 5, 64, 300}) {
    const int top = feasible_configs(kGateUp, token_bucket(tokens), h200).front();
    // No file.
    const ConfigChooser none(TuneCache::load(path), key_a(), h200);
    const ConfigChoice c0 = none.choose_config(kGateUp, tokens);
    EXPECT_FALSE(c0.autotuned);
    EXPECT_EQ(c0.config_id, top);
    EXPECT_EQ(c0.reason, "planner top choice " + plan::w4a16_config_name(plan::kW4A16Configs[top]) +
                             " for E=32,N=4096,K=6144 bucket " + std::to_string(token_bucket(tokens)) +
                             " on h200 (no tune cache at " + path + ")");
  }
  // An entry for another (shape, bucket) only.
  TuneCache c;
  c.put(key_a(), entry(kGateUp, 8, 1, 41.0, 0, 43.5));
  c.save(path);
  const ConfigChooser tuned(TuneCache::load(path), key_a(), h200);
  const ConfigChoice hit = tuned.choose_config(kGateUp, 7);
  EXPECT_TRUE(hit.autotuned);
  EXPECT_EQ(hit.config_id, 1);
  EXPECT_EQ(hit.reason, "autotuned: " + plan::w4a16_config_name(plan::kW4A16Configs[1]) +
                            " 41 us (median of 30, 9 configs timed; runner-up " +
                            plan::w4a16_config_name(plan::kW4A16Configs[0]) +
                            " 43.5 us) for E=32,N=4096,K=6144 bucket 8 from " + path);
  const ConfigChoice miss = tuned.choose_config(kDown, 7);
  EXPECT_FALSE(miss.autotuned);
  EXPECT_EQ(miss.config_id, feasible_configs(kDown, 8, h200).front());
  EXPECT_NE(miss.reason.find("(no entry for E=32,N=6144,K=2048 bucket 8 in " + path + "; run `fp4moe tune`)"),
            std::string::npos)
      << miss.reason;
  // The same file under another key: the planner, and the stale fields in the reason.
  TuneKey other = key_a();
  other.gpu_name = "NVIDIA H100";
  const ConfigChooser stale(TuneCache::load(path), other, h200);
  const ConfigChoice s = stale.choose_config(kGateUp, 7);
  EXPECT_FALSE(s.autotuned);
  EXPECT_NE(s.reason.find("stale tune cache " + path + " (tuned under another key, not used): gpu_name 'NVIDIA H200' "
                          "-> 'NVIDIA H100'"),
            std::string::npos)
      << s.reason;
  // A corrupt file: the planner, and the warning in the reason.
  std::ofstream(path) << "{";
  const ConfigChooser corrupt(TuneCache::load(path), key_a(), h200);
  const ConfigChoice k = corrupt.choose_config(kGateUp, 7);
  EXPECT_FALSE(k.autotuned);
  EXPECT_NE(k.reason.find("(ignoring corrupt tune cache " + path), std::string::npos) << k.reason;
  std::filesystem::remove_all(dir);
}

// set_fallback replaces the planner where the cache has no winner (the GPU models pass the kernels'
// measured defaults); describe() gives the load log's line.
TEST(ConfigChooser, FallbackAndDescription) {
  const plan::GpuSpec h200 = plan::require_gpu("h200");
  const auto dir = temp_dir("chooser_fallback");
  const std::string path = (dir / "tune.json").string();
  std::vector<int64_t> asked, asked_experts;
  auto fallback = [&](const GemmShape& shape, int64_t tokens) {
    asked.push_back(tokens);
    asked_experts.push_back(shape.n_experts);
    return tokens <= 8 ? 0 : 11;
  };
  ConfigChooser none(TuneCache::load(path), key_a(), h200);
  EXPECT_EQ(none.describe(), "no tune cache at " + path + ": the planner's top choice for every shape");
  none.set_fallback(fallback, "built-in default");
  EXPECT_EQ(none.describe(), "no tune cache at " + path + ": built-in default for every shape");
  const ConfigChoice a = none.choose_config(kGateUp, 5), b = none.choose_config(kGateUp, 37);
  EXPECT_EQ(asked, (std::vector<int64_t>{5, 37}));  // the tokens per expert, not the bucket
  EXPECT_EQ(asked_experts, (std::vector<int64_t>{kGateUp.n_experts, kGateUp.n_experts}));  // and the shape's
  EXPECT_EQ(a.config_id, 0);
  EXPECT_EQ(b.config_id, 11);
  EXPECT_FALSE(a.autotuned);
  EXPECT_EQ(a.reason, "built-in default " + plan::w4a16_config_name(plan::kW4A16Configs[0]) +
                          " for E=32,N=4096,K=6144 at 5 tokens per expert (no tune cache at " + path + ")");
  // A winner for gate_up bucket 8: used there; the fallback elsewhere, with why.
  TuneCache c;
  c.put(key_a(), entry(kGateUp, 8, 1, 41.0, 0, 43.5));
  c.save(path);
  ConfigChooser tuned(TuneCache::load(path), key_a(), h200);
  tuned.set_fallback(fallback, "built-in default");
  EXPECT_EQ(tuned.describe(), "tune cache " + path + ": 1 winners for this GPU and build (used where one exists for "
                              "the shape and token bucket, else built-in default)");
  EXPECT_TRUE(tuned.choose_config(kGateUp, 7).autotuned);
  EXPECT_EQ(tuned.choose_config(kGateUp, 7).config_id, 1);
  const ConfigChoice miss = tuned.choose_config(kDown, 7);
  EXPECT_EQ(miss.config_id, 0);
  // choose_config_id: the same ids without the reasons (cached winner, fallback; the planner below).
  EXPECT_EQ(tuned.choose_config_id(kGateUp, 7), 1);
  EXPECT_EQ(tuned.choose_config_id(kDown, 7), 0);
  EXPECT_EQ(tuned.choose_config_id(kGateUp, 37), 11);
  ConfigChooser planner(TuneCache::load(path), key_a(), h200);  // no fallback: the planner's top choice
  for (int64_t tokens : {1, 7, 37, 300}) {
    EXPECT_EQ(planner.choose_config_id(kDown, tokens), planner.choose_config(kDown, tokens).config_id) << tokens;
  }
  EXPECT_NE(miss.reason.find("(no entry for E=32,N=6144,K=2048 bucket 8 in " + path), std::string::npos) << miss.reason;
  // Stale: the fallback for every shape, and the stale fields in the description.
  TuneKey other = key_a();
  other.n_sms = 114;
  ConfigChooser stale(TuneCache::load(path), other, h200);
  stale.set_fallback(fallback, "built-in default");
  EXPECT_EQ(stale.choose_config(kGateUp, 7).config_id, 0);
  EXPECT_NE(stale.describe().find("n_sms 132 -> 114"), std::string::npos) << stale.describe();
  EXPECT_NE(stale.describe().find(": built-in default for every shape"), std::string::npos) << stale.describe();
  // A fallback that returns no config id is refused with the name and the number.
  ConfigChooser bad(TuneCache::load(path), key_a(), h200);
  bad.set_fallback([](const GemmShape&, int64_t) { return 99; }, "broken default");
  EXPECT_NE(error_of([&] { bad.choose_config(kDown, 1); }).find("the fallback broken default returned config id 99"),
            std::string::npos);
  std::filesystem::remove_all(dir);
}

TEST(RoutingCounts, UniformAndOffsets) {
  EXPECT_EQ(uniform_counts(3, 5), (std::vector<int32_t>{5, 5, 5}));
  EXPECT_EQ(offsets_of({2, 0, 3}), (std::vector<int32_t>{0, 2, 2, 5}));
  EXPECT_EQ(describe_counts({2, 0, 3, 0}), "max 3, min 0, 2 empty");
  EXPECT_NE(error_of([] { offsets_of({1, -2}); }).find("count -2 of expert 1"), std::string::npos);
}

TEST(RoutingCounts, ZipfKeepsTheTotalAndIsSkewedAndSeeded) {
  const uint64_t seed = testing::test_seed();
  for (int64_t tokens : {1, 8, 64, 512}) {
    const int64_t total = 32 * tokens;
    const std::vector<int32_t> c = zipf_counts(32, total, 1.1, seed);
    ASSERT_EQ(c.size(), 32u);
    EXPECT_EQ(std::accumulate(c.begin(), c.end(), int64_t{0}), total) << "tokens " << tokens;
    EXPECT_EQ(c, zipf_counts(32, total, 1.1, seed)) << "same seed, same draw";
    if (tokens >= 64) {
      // Rank 1 has probability 1 / H(32, 1.1) ~ 0.29: far above the uniform 1/32.
      const int32_t mx = *std::max_element(c.begin(), c.end());
      EXPECT_GT(mx, 5 * tokens) << "seed " << seed << " tokens " << tokens;
      EXPECT_LT(mx, 12 * tokens) << "seed " << seed << " tokens " << tokens;
    }
  }
  EXPECT_NE(zipf_counts(32, 32 * 64, 1.1, seed), zipf_counts(32, 32 * 64, 1.1, seed + 1));
  EXPECT_EQ(zipf_counts(4, 0, 1.1, seed), (std::vector<int32_t>{0, 0, 0, 0}));
}

}  // namespace
}  // namespace fp4moe::tune
