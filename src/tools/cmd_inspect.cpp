// `fp4moe inspect <dir> [--json]`: what a checkpoint holds (architecture, layer and expert
// counts, NVFP4/BF16 modules by kind, bytes by dtype, parameters, quantization config) and every
// problem found (format/checkpoint.h). Exits 1 when there are problems.
// `fp4moe inspect --demo [--demo-dir DIR]`: writes a tiny deterministic BF16 GLM-4.5-style
// checkpoint, quantizes it to NVFP4 (format/quantize_checkpoint.h) and inspects the result.
// Tested by tests/tools/test_inspect.cpp.
#include <CLI/CLI.hpp>
#include <fmt/core.h>
#include <fmt/ranges.h>

#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <memory>

#include "core/error.h"
#include "engine/sampler.h"
#include "format/nvfp4.h"
#include "format/quantize_checkpoint.h"
#include "format/safetensors.h"
#include "model/config.h"
#include "model/registry.h"
#include "tools/commands.h"
#include "tools/inspect.h"

namespace fp4moe::tools {
namespace fs = std::filesystem;
using format::Checkpoint;
using format::LinearFormat;
using format::ModuleKind;
using ojson = nlohmann::ordered_json;

namespace {

constexpr ModuleKind kKinds[] = {ModuleKind::kAttention,    ModuleKind::kDenseMlp,
                                 ModuleKind::kSharedExpert, ModuleKind::kRoutedExpert,
                                 ModuleKind::kRouter,       ModuleKind::kLmHead,
                                 ModuleKind::kEmbedding,    ModuleKind::kOther};

std::string human_bytes(uint64_t b) {
  if (b >= (1ull << 30)) return fmt::format("{:.2f} GiB", b / double(1ull << 30));
  if (b >= (1ull << 20)) return fmt::format("{:.2f} MiB", b / double(1ull << 20));
  if (b >= (1ull << 10)) return fmt::format("{:.1f} KiB", b / double(1ull << 10));
  return fmt::format("{} B", b);
}

std::string human_count(int64_t n) {
  if (n >= 1'000'000'000) return fmt::format("{:.2f} B", n / 1e9);
  if (n >= 1'000'000) return fmt::format("{:.2f} M", n / 1e6);
  if (n >= 1'000) return fmt::format("{:.1f} K", n / 1e3);
  return std::to_string(n);
}

std::string join(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& x : v) s += (s.empty() ? "" : ", ") + x;
  return s;
}

// Routed experts found on disk per MoE layer, as "16" when all layers agree, else "16,15,16".
std::string experts_on_disk(const Checkpoint& c) {
  std::vector<int64_t> n;
  for (int64_t l = 0; l < c.config().n_layers; ++l) {
    if (c.config().layer_is_moe[static_cast<size_t>(l)]) n.push_back(c.n_experts_on_disk(l));
  }
  if (n.empty()) return "0";
  if (std::all_of(n.begin(), n.end(), [&](int64_t x) { return x == n[0]; })) return std::to_string(n[0]);
  std::string s;
  for (int64_t x : n) s += (s.empty() ? "" : ",") + std::to_string(x);
  return s;
}

// Deterministic uniform numbers in [-1, 1) (splitmix64).
struct DemoRng {
  uint64_t state;
  float next() {
    uint64_t z = (state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    return static_cast<float>(z >> 40) / static_cast<float>(1ull << 23) - 1.0f;
  }
};

}  // namespace

Findings find_problems(const Checkpoint& c, bool check_scales) {
  Findings f;
  f.problems = c.problems();
  if (check_scales) {
    for (const format::LinearModule& m : c.modules()) {
      if (m.format != LinearFormat::kNVFP4 || !m.ok) continue;  // a module with a problem has it listed already
      const TensorView s = c.store().view(m.name + ".weight_scale");
      if (std::optional<std::string> why =
              format::nvfp4_bad_block_scale(m.name, s.bytes, m.in_features / format::kNvfp4BlockSize))
        f.problems.push_back({m.name, *why});
    }
  }
  // quant_algo NVFP4 is the calibrated W4A4 export: every NVFP4 Linear has an activation scale. Missing ones load here
  // (W4A16 ignores them) but leave another engine's activation quantizer without its scale.
  if (c.quant().present && c.quant().quant_algo == "NVFP4") {
    std::vector<std::string> without;
    int64_t n_nvfp4 = 0;
    for (const format::LinearModule& m : c.modules()) {
      if (m.format != LinearFormat::kNVFP4) continue;
      ++n_nvfp4;
      if (!m.has_input_scale) without.push_back(m.name);
    }
    if (!without.empty()) {
      f.warnings.push_back(fmt::format(
          "{} of {} NVFP4 Linears have no .input_scale, e.g. {}: {} says quant_algo NVFP4 (calibrated W4A4), whose "
          "activation scales vLLM / SGLang's FP4 GEMMs read; fp4moe's W4A16 does not (a weight-only export says "
          "W4A16_NVFP4)",
          without.size(), n_nvfp4, without.front(), c.quant().source));
    }
  }
  // The model loader's view. A Linear that format::Checkpoint already names (or a part of one:
  // "<layer>.mlp.experts") is not named again; any other tensor only when Checkpoint names that tensor.
  auto named = [&](const model::TensorCheck::Problem& m) {
    for (const auto& p : c.problems()) {
      if (p.module.empty()) continue;
      if (m.name == p.module) return true;
      if (m.linear && m.name.size() > p.module.size() && m.name.compare(0, p.module.size(), p.module) == 0 &&
          m.name[p.module.size()] == '.')
        return true;
    }
    return false;
  };
  model::ModelConfig config;
  model::TensorCheck t;
  try {
    // A quantization section the loader refuses (its problems, FP8, group 32) is named by format::Checkpoint
    // already (the loader's refusal named its first problem a second time); the tensors are then not checked
    // against it, as the loader would not read them.
    std::vector<format::CheckpointProblem> quant_problems;
    config = model::read_model_config(c.dir(), &quant_problems);
    if (!quant_problems.empty() || config.quantization.unsupported()) return f;
    t = model::check_tensors(config, c.store());
  } catch (const fp4moe::Error& e) {
    f.problems.push_back({"config.json", std::string("the model loader refuses it: ") + e.what()});
    return f;
  }
  // generation_config.json on its own: its problems do not hide the tensors'.
  try {
    model::load_generation_config(c.dir(), config);
    f.loaded = true;
    f.eos_token_ids = config.eos_token_ids;
    f.generation = config.generation;
    engine::sampling_defaults_from(config.generation);
  } catch (const fp4moe::Error& e) {
    const bool served = f.loaded;  // parsed, but its sampling values are refused by serve --sampling-defaults model
    f.problems.push_back({"generation_config.json", std::string(served ? "serve --sampling-defaults model refuses it: "
                                                                       : "the model loader refuses it: ") +
                                                        e.what()});
  }
  for (auto& p : t.problems) {
    if (!named(p)) f.problems.push_back({p.name, p.name + ": " + p.message});
  }
  f.unread = std::move(t.unread);
  f.unread_files = std::move(t.unread_files);
  f.skipped = std::move(t.skipped);
  return f;
}

std::string inspect_text(const Checkpoint& c) { return inspect_text(c, find_problems(c)); }
ojson inspect_json(const Checkpoint& c) { return inspect_json(c, find_problems(c)); }

std::string inspect_text(const Checkpoint& c, const Findings& f) {
  const format::ModelConfig& m = c.config();
  std::string s;
  s += fmt::format("checkpoint    {}\n", c.dir().string());
  s += fmt::format("architecture  {} (model_type {})\n", m.architecture, m.model_type);
  s += fmt::format("layers        {} ({} dense, {} MoE){}\n", m.n_layers, m.n_dense_layers(),
                   m.n_moe_layers(),
                   m.n_nextn_layers > 0 ? fmt::format("; {} MTP layer(s) in config", m.n_nextn_layers)
                                        : "");
  s += fmt::format("experts       {} routed, top-{}, {} shared; on disk per MoE layer: {}\n",
                   m.n_routed_experts, m.n_experts_per_tok, m.n_shared_experts, experts_on_disk(c));
  s += fmt::format("sizes         hidden {}, intermediate {}, moe_intermediate {}, vocab {}\n",
                   m.hidden_size, m.intermediate_size, m.moe_intermediate_size, m.vocab_size);
  const format::QuantConfig& q = c.quant();
  if (q.present && q.foreign_method()) {
    // Another method's section (an FP8 checkpoint's quant_method "fp8"): what it is, not ModelOpt's blank fields.
    s += fmt::format("quantization  quant_method {} from {}: not read (fp4moe reads ModelOpt NVFP4)\n", q.quant_method,
                     q.source);
  } else if (q.present) {
    const std::string producer = (q.producer_name + " " + q.producer_version);
    s += fmt::format("quantization  {} (group {}) from {}, producer {}; exclude [{}]\n",
                     q.quant_algo.empty() ? "(no quant_algo)" : q.quant_algo, q.group_size, q.source,
                     producer == " " ? "(not named)" : producer, join(q.exclude_modules));
  } else {
    s += "quantization  none\n";
  }
  if (f.loaded) {
    s += fmt::format(
        "generation    eos {}{}\n",
        f.eos_token_ids.empty() ? std::string("none") : fmt::format("[{}]", fmt::join(f.eos_token_ids, ", ")),
        f.generation.has_sampling()
            ? "; sampling defaults " + f.generation.sampling_summary() + " (" + f.generation.source + ")"
            : std::string());
  }
  // An "other" column only when some Linear stores a dtype no loader reads (F16, F8_E4M3; a problem names it).
  const auto summary = c.kind_summary();
  const format::KindSummary all = c.linear_summary();
  const auto row = [&](std::string_view name, const format::KindSummary& v) {
    return fmt::format("              {:<16} {:>7} {:>7}", name, v.n_nvfp4, v.n_bf16) +
           (all.n_other > 0 ? fmt::format(" {:>7}", v.n_other) : std::string()) + "\n";
  };
  s += fmt::format("modules       {:<16} {:>7} {:>7}", "kind", "NVFP4", "BF16") +
       (all.n_other > 0 ? fmt::format(" {:>7}", "other") : std::string()) + "\n";
  for (ModuleKind k : kKinds) {
    auto it = summary.find(k);
    if (it == summary.end()) continue;
    s += row(format::module_kind_name(k), it->second);
  }
  s += row("Linears", all);
  uint64_t total = 0;
  std::string bytes;
  for (const auto& [dtype, b] : c.bytes_by_dtype()) {
    bytes += fmt::format("{}{} {}", bytes.empty() ? "" : ", ", fp4moe::dtype_name(dtype), human_bytes(b));
    total += b;
  }
  s += fmt::format("bytes         {} (total {}, {} file(s))\n", bytes, human_bytes(total),
                   c.store().files().size());
  s += fmt::format("parameters    {} ({})\n", c.n_parameters(), human_count(c.n_parameters()));
  if (f.problems.empty()) {
    s += "problems      none\n";
  } else {
    s += fmt::format("problems      {}\n", f.problems.size());
    for (const auto& p : f.problems) s += "  - " + p.message + "\n";
  }
  if (!f.warnings.empty()) {
    s += fmt::format("warnings      {}\n", f.warnings.size());
    for (const std::string& w : f.warnings) s += "  - " + w + "\n";
  }
  if (!f.unread.empty()) {
    // Not problems: the loaders skip them. Likely a config / checkpoint mismatch.
    constexpr size_t kShown = 10;
    s += fmt::format("unread        {} tensor(s) that {} does not read:\n", f.unread.size(), m.architecture);
    for (size_t i = 0; i < std::min(f.unread.size(), kShown); ++i) s += "  - " + f.unread[i] + "\n";
    if (f.unread.size() > kShown)
      s += fmt::format("  - ... and {} more (--json lists all)\n", f.unread.size() - kShown);
  }
  for (const auto& [file, n] : f.unread_files) s += fmt::format("not read      {} ({} tensors)\n", file, n);
  if (!f.skipped.empty()) s += "not checked   the tensors besides the Linears: " + f.skipped + "\n";
  return s;
}

ojson inspect_json(const Checkpoint& c, const Findings& f) {
  const format::ModelConfig& m = c.config();
  ojson j;
  j["dir"] = c.dir().string();
  j["architecture"] = m.architecture;
  j["model_type"] = m.model_type;
  std::vector<int64_t> dense, moe;
  for (int64_t l = 0; l < m.n_layers; ++l) (m.layer_is_moe[static_cast<size_t>(l)] ? moe : dense).push_back(l);
  j["layers"] = {{"n_layers", m.n_layers}, {"n_dense", m.n_dense_layers()}, {"n_moe", m.n_moe_layers()},
                 {"dense", dense}, {"moe", moe}, {"n_nextn", m.n_nextn_layers}};
  ojson on_disk = ojson::object();
  for (int64_t l : moe) on_disk[std::to_string(l)] = c.n_experts_on_disk(l);
  j["experts"] = {{"n_routed", m.n_routed_experts}, {"per_token", m.n_experts_per_tok},
                  {"n_shared", m.n_shared_experts}, {"on_disk_per_layer", on_disk}};
  j["sizes"] = {{"hidden", m.hidden_size}, {"intermediate", m.intermediate_size},
                {"moe_intermediate", m.moe_intermediate_size}, {"vocab", m.vocab_size}};
  ojson kinds = ojson::object();
  for (const auto& [k, v] : c.kind_summary()) {
    kinds[std::string(format::module_kind_name(k))] = {{"nvfp4", v.n_nvfp4}, {"bf16", v.n_bf16}, {"other", v.n_other}};
  }
  const format::KindSummary linears = c.linear_summary();
  j["modules"] = {{"by_kind", kinds},
                  {"linear_nvfp4", linears.n_nvfp4},
                  {"linear_bf16", linears.n_bf16},
                  {"linear_other", linears.n_other}};
  ojson bytes = ojson::object();
  for (const auto& [dtype, b] : c.bytes_by_dtype()) bytes[std::string(fp4moe::dtype_name(dtype))] = b;
  j["bytes_by_dtype"] = bytes;
  j["parameters"] = c.n_parameters();
  const format::QuantConfig& q = c.quant();
  j["quantization"] =
      q.present
          ? ojson{{"quant_method", q.quant_method},       {"quant_algo", q.quant_algo},
                  {"group_size", q.group_size},           {"source", q.source},
                  {"exclude_modules", q.exclude_modules}, {"producer", q.producer_name + " " + q.producer_version}}
          : ojson(nullptr);
  ojson sampling = ojson::object();
  auto put = [&](const char* key, const auto& v) {
    if (v) sampling[key] = *v;
  };
  f.generation.for_each_sampling(put);
  j["generation"] = f.loaded
                        ? ojson{{"eos_token_ids", f.eos_token_ids},
                                {"source", f.generation.source.empty() ? ojson(nullptr) : ojson(f.generation.source)},
                                {"sampling_defaults", sampling}}
                        : ojson(nullptr);
  ojson problems = ojson::array();
  for (const auto& p : f.problems) problems.push_back({{"module", p.module}, {"message", p.message}});
  j["problems"] = problems;
  j["warnings"] = f.warnings;
  j["unread"] = f.unread;
  ojson files = ojson::array();
  for (const auto& [file, n] : f.unread_files) files.push_back({{"file", file}, {"tensors", n}});
  j["unread_files"] = files;
  if (!f.skipped.empty()) j["not_checked"] = f.skipped;
  return j;
}

void write_demo_bf16_checkpoint(const fs::path& dir, uint64_t seed) {
  constexpr int64_t kHidden = 64, kHeads = 4, kKvHeads = 2, kHeadDim = 16, kVocab = 256;
  constexpr int64_t kInter = 128, kMoeInter = 32, kExperts = 8, kTopK = 2, kLayers = 2;
  fs::create_directories(dir);
  DemoRng rng{seed};
  format::SafetensorsWriter w;
  w.set_metadata("format", "pt");
  auto bf16 = [&](const std::string& name, Shape shape, float scale, float offset = 0.0f) {
    std::vector<uint16_t> v(static_cast<size_t>(shape_numel(shape)));
    for (auto& x : v) x = f32_to_bf16(offset + scale * rng.next());
    std::vector<uint8_t> bytes(v.size() * 2);
    std::memcpy(bytes.data(), v.data(), bytes.size());
    w.add(name, DType::kBF16, shape, bytes);
  };
  auto mlp = [&](const std::string& p, int64_t inter) {
    bf16(p + ".gate_proj.weight", {inter, kHidden}, 0.1f);
    bf16(p + ".up_proj.weight", {inter, kHidden}, 0.1f);
    bf16(p + ".down_proj.weight", {kHidden, inter}, 0.1f);
  };
  bf16("model.embed_tokens.weight", {kVocab, kHidden}, 0.5f);
  bf16("lm_head.weight", {kVocab, kHidden}, 0.1f);
  bf16("model.norm.weight", {kHidden}, 0.1f, 1.0f);
  for (int64_t l = 0; l < kLayers; ++l) {
    const std::string p = "model.layers." + std::to_string(l);
    bf16(p + ".input_layernorm.weight", {kHidden}, 0.1f, 1.0f);
    bf16(p + ".post_attention_layernorm.weight", {kHidden}, 0.1f, 1.0f);
    bf16(p + ".self_attn.q_proj.weight", {kHeads * kHeadDim, kHidden}, 0.1f);
    bf16(p + ".self_attn.q_proj.bias", {kHeads * kHeadDim}, 0.05f);
    bf16(p + ".self_attn.k_proj.weight", {kKvHeads * kHeadDim, kHidden}, 0.1f);
    bf16(p + ".self_attn.k_proj.bias", {kKvHeads * kHeadDim}, 0.05f);
    bf16(p + ".self_attn.v_proj.weight", {kKvHeads * kHeadDim, kHidden}, 0.1f);
    bf16(p + ".self_attn.v_proj.bias", {kKvHeads * kHeadDim}, 0.05f);
    bf16(p + ".self_attn.o_proj.weight", {kHidden, kHeads * kHeadDim}, 0.1f);
    if (l == 0) {
      mlp(p + ".mlp", kInter);
      continue;
    }
    for (int64_t e = 0; e < kExperts; ++e) mlp(p + ".mlp.experts." + std::to_string(e), kMoeInter);
    mlp(p + ".mlp.shared_experts", kMoeInter);
    bf16(p + ".mlp.gate.weight", {kExperts, kHidden}, 0.1f);
    std::vector<float> bias(kExperts);
    for (auto& b : bias) b = 0.01f * rng.next();
    std::vector<uint8_t> bytes(bias.size() * 4);
    std::memcpy(bytes.data(), bias.data(), bytes.size());
    w.add(p + ".mlp.gate.e_score_correction_bias", DType::kF32, {kExperts}, bytes);
  }
  w.write(dir / "model.safetensors");

  ojson config;
  config["architectures"] = {"Glm4MoeForCausalLM"};
  config["model_type"] = "glm4_moe";
  config["attention_bias"] = true;
  config["first_k_dense_replace"] = 1;
  config["head_dim"] = kHeadDim;
  config["hidden_act"] = "silu";
  config["hidden_size"] = kHidden;
  config["intermediate_size"] = kInter;
  config["max_position_embeddings"] = 1024;
  config["moe_intermediate_size"] = kMoeInter;
  config["n_group"] = 1;
  config["n_routed_experts"] = kExperts;
  config["n_shared_experts"] = 1;
  config["norm_topk_prob"] = true;
  config["num_attention_heads"] = kHeads;
  config["num_experts_per_tok"] = kTopK;
  config["num_hidden_layers"] = kLayers;
  config["num_key_value_heads"] = kKvHeads;
  config["partial_rotary_factor"] = 0.5;
  config["rms_norm_eps"] = 1e-5;
  config["rope_parameters"] = {{"partial_rotary_factor", 0.5}, {"rope_theta", 10000.0}, {"rope_type", "default"}};
  config["routed_scaling_factor"] = 2.5;
  config["tie_word_embeddings"] = false;
  config["topk_group"] = 1;
  config["use_qk_norm"] = false;
  config["vocab_size"] = kVocab;
  config["torch_dtype"] = "bfloat16";
  std::ofstream(dir / "config.json") << config.dump(2) << "\n";
  std::ofstream(dir / "generation_config.json") << ojson{{"use_cache", true}}.dump(2) << "\n";
}

namespace {

struct InspectArgs {
  std::string dir;
  bool json = false;
  bool demo = false;
  bool check_scales = false;
  std::string demo_dir;
};

void print_report(const Checkpoint& c, const Findings& f, bool json) {
  if (json) {
    fmt::print("{}\n", inspect_json(c, f).dump(2));
  } else {
    fmt::print("{}", inspect_text(c, f));
  }
}

void run_inspect(const InspectArgs& a) {
  if (!a.demo) {
    FP4MOE_CHECK(!a.dir.empty()) << "inspect: give a checkpoint directory, or --demo";
    Checkpoint c(a.dir);
    const Findings f = find_problems(c, a.check_scales);
    print_report(c, f, a.json);
    // The report named them: the exit status says so, without a check's source line.
    if (!f.problems.empty())
      throw Error("checkpoint " + a.dir + " has " + std::to_string(f.problems.size()) + " problem(s), listed above");
    return;
  }
  FP4MOE_CHECK(a.dir.empty()) << "inspect: --demo takes no checkpoint directory (got " << a.dir << ")";
  const bool keep = !a.demo_dir.empty();
  std::error_code ec;
  if (keep && fs::exists(a.demo_dir, ec)) {
    if (!fs::is_directory(a.demo_dir, ec))
      throw Error("inspect --demo: --demo-dir " + a.demo_dir +
                  " is a file, not a folder (the demo writes bf16/ and nvfp4/ checkpoints into it)");
    if (!fs::is_empty(a.demo_dir, ec))
      throw Error("inspect --demo: --demo-dir " + a.demo_dir + " exists and is not empty");
  }
  const fs::path root = keep ? fs::path(a.demo_dir)
                             : fs::temp_directory_path() / ("fp4moe_demo_" + std::to_string(::getpid()));
  struct Cleanup {
    fs::path p;
    bool active;
    ~Cleanup() {
      std::error_code ec;
      if (active) fs::remove_all(p, ec);
    }
  } cleanup{root, !keep};
  try {
    write_demo_bf16_checkpoint(root / "bf16", /*seed=*/20260101);
  } catch (const fs::filesystem_error& e) {  // a parent that is a file, a dangling link, no permission
    throw Error("inspect --demo: cannot write the demo checkpoints under " + root.string() + ": " + e.code().message());
  }
  format::QuantizeOptions opt;
  opt.producer_version = FP4MOE_VERSION;
  const format::QuantizeReport r = format::quantize_checkpoint(format::Checkpoint(root / "bf16"), root / "nvfp4", opt);
  if (!a.json) {
    fmt::print("demo: wrote a BF16 GLM-4.5-style checkpoint and quantized {} Linears to {} "
               "(weight-only: no calibration pass), {} kept BF16; {} -> {}\n\n",
               r.n_quantized, r.quant_algo, r.n_kept, human_bytes(r.bytes_in), human_bytes(r.bytes_out));
  }
  Checkpoint c(root / "nvfp4");
  const Findings f = find_problems(c, a.check_scales);
  print_report(c, f, a.json);
  if (!f.problems.empty())
    throw Error("demo checkpoint has " + std::to_string(f.problems.size()) + " problem(s), listed above");
}

}  // namespace

void register_inspect_command(CLI::App& app) {
  auto args = std::make_shared<InspectArgs>();
  auto* cmd = app.add_subcommand(
      "inspect", "describe a checkpoint: architecture, layers, experts, NVFP4/BF16 modules, bytes, problems");
  cmd->add_option("dir", args->dir, "checkpoint directory (config.json + *.safetensors)");
  cmd->add_flag("--json", args->json, "print JSON instead of text");
  cmd->add_flag("--check-scales", args->check_scales,
                "also read every NVFP4 block scale (an eighth of the weight bytes) and report NaN or negative ones, "
                "which the load refuses");
  CLI::Option* demo = cmd->add_flag(
      "--demo", args->demo, "build a tiny deterministic NVFP4 GLM-style checkpoint in a temp dir and inspect it");
  cmd->add_option("--demo-dir", args->demo_dir, "with --demo: write the demo checkpoints here and keep them")
      ->needs(demo);
  cmd->callback([args] { run_inspect(*args); });
}

}  // namespace fp4moe::tools
