// BF16 -> ModelOpt NVFP4 checkpoint conversion. See quantize_checkpoint.h; tested by
// tests/format/test_quantize_checkpoint.cpp.
#include "format/quantize_checkpoint.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <optional>
#include <set>
#include <sstream>
#include <system_error>
#include <utility>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/file.h"
#include "format/checkpoint.h"
#include "format/json_file.h"
#include "format/nvfp4.h"
#include "format/safetensors.h"

namespace fp4moe::format {
namespace fs = std::filesystem;
using ojson = nlohmann::ordered_json;

namespace {

constexpr float kInputScaleDivisor = kE2M1Max * kE4M3Max;  // 2688: amax / (6 * 448)

bool ends_with(const std::string& s, std::string_view suffix) {
  return s.size() >= suffix.size() && std::string_view(s).substr(s.size() - suffix.size()) == suffix;
}

void write_json(const fs::path& p, const ojson& j) {
  std::ofstream out(p, std::ios::binary);
  FP4MOE_CHECK(out.good()) << "cannot write " << p.string();
  out << j.dump(2) << "\n";
  FP4MOE_CHECK(out.good()) << "write failed: " << p.string();
}

float weight_global_scale(const TensorView& w, const std::string& module) {
  switch (w.dtype) {
    case DType::kBF16:
      return nvfp4_global_scale_bf16(w.as<uint16_t>(), module + ".weight", w.shape.back());
    case DType::kF32:
      return nvfp4_global_scale(w.as<float>(), module + ".weight", w.shape.back());
    default:
      FP4MOE_FAIL() << module << ".weight is " << dtype_name(w.dtype) << " "
                    << shape_to_string(w.shape) << "; quantize reads BF16 or F32 weights";
  }
  return 0.0f;
}

}  // namespace

std::vector<std::string> default_quantize_exclusions() { return {"lm_head", "model.layers.*.mlp.gate"}; }

std::string scale_group_of(const std::string& module) {
  const size_t dot = module.rfind('.');
  if (dot == std::string::npos) return module;
  const std::string parent = module.substr(0, dot);
  const std::string leaf = module.substr(dot + 1);
  if (leaf == "q_proj" || leaf == "k_proj" || leaf == "v_proj") {
    // GQA attention only; MLA's q_proj (no k/v siblings) stays alone, which the same key gives.
    return parent + ".qkv";
  }
  if (leaf == "gate_proj" || leaf == "up_proj") return parent + ".gate_up";
  return module;
}

namespace {

// quantize_exclusions as the QuantConfig that applies them (is_excluded).
QuantConfig exclusion_config(const std::vector<std::string>& extra, const Checkpoint& in) {
  for (const std::string& p : extra) {
    FP4MOE_CHECK(!p.empty()) << "quantize: --exclude '' is an empty pattern (it names no module; give a module name or "
                                "an fnmatch pattern such as 'model.layers.*.self_attn')";
  }
  QuantConfig q;
  q.present = true;
  auto add = [&](const std::string& p) {
    if (std::find(q.exclude_modules.begin(), q.exclude_modules.end(), p) == q.exclude_modules.end())
      q.exclude_modules.push_back(p);
  };
  for (const auto& list : {default_quantize_exclusions(), extra})
    for (const std::string& p : list) add(p);
  // Added only where they keep something the list above would quantize.
  std::vector<std::string> must_stay = {"model.layers.*.self_attn.indexer.weights_proj"};
  const ModelConfig& c = in.config();
  for (int64_t l = c.n_layers; l < c.n_layers + c.n_nextn_layers; ++l)
    must_stay.push_back("model.layers." + std::to_string(l) + ".*");
  std::vector<std::string> added;
  for (const std::string& p : must_stay) {
    const bool keeps = std::any_of(in.modules().begin(), in.modules().end(), [&](const LinearModule& m) {
      return m.kind != ModuleKind::kEmbedding && wildcard_match(p, m.name) && !q.is_excluded(m.name);
    });
    if (keeps) added.push_back(p);
  }
  for (const std::string& p : added) add(p);
  return q;
}

// The Linears of `in` that `exclusions` leaves to quantize (sorted; embeddings stay). Refuses, naming them, those whose
// K is not a multiple of the block, with one --exclude pattern for them all where the first one's name with its
// indices as '*' matches only such modules.
std::vector<const LinearModule*> quantizable_modules(const Checkpoint& in, const QuantConfig& exclusions) {
  std::vector<const LinearModule*> out, bad;
  for (const LinearModule& m : in.modules()) {
    if (m.kind == ModuleKind::kEmbedding || exclusions.is_excluded(m.name)) continue;
    (m.in_features % kNvfp4BlockSize == 0 ? out : bad).push_back(&m);
  }
  FP4MOE_CHECK(!out.empty() || !bad.empty())
      << "quantize: the exclusion patterns leave no Linear to quantize in " << in.dir().string();
  if (bad.empty()) return out;
  // Each bad module's name with its indices as '*' ("model.layers.*.mlp.experts.*.down_proj") where that matches no
  // module that quantizes, else its own name: the --exclude options that keep them all (and only them) in BF16.
  const auto index_pattern = [](const std::string& name) {
    std::string pattern;
    for (size_t i = 0; i < name.size(); ++i) {
      const char c = name[i];
      if (std::isdigit(static_cast<unsigned char>(c)) && (i == 0 || name[i - 1] == '.')) {
        while (i + 1 < name.size() && std::isdigit(static_cast<unsigned char>(name[i + 1]))) ++i;
        pattern += '*';
      } else {
        pattern += c;
      }
    }
    return pattern;
  };
  std::vector<std::string> excludes;
  for (const LinearModule* m : bad) {
    if (std::any_of(excludes.begin(), excludes.end(), [&](const std::string& e) { return wildcard_match(e, m->name); }))
      continue;
    const std::string pattern = index_pattern(m->name);
    const bool exact =
        std::none_of(out.begin(), out.end(), [&](const LinearModule* g) { return wildcard_match(pattern, g->name); });
    excludes.push_back(exact ? pattern : m->name);
  }
  std::ostringstream names;
  for (size_t i = 0; i < std::min<size_t>(bad.size(), 3); ++i)
    names << (i ? ", " : "") << bad[i]->name << " (K=" << bad[i]->in_features << ")";
  if (bad.size() > 3) names << ", ...";
  constexpr size_t kShown = 8;
  std::ostringstream options;
  for (size_t i = 0; i < std::min(excludes.size(), kShown); ++i)
    options << (i ? " " : "") << "--exclude '" << excludes[i] << "'";
  if (excludes.size() > kShown) options << " ... (" << excludes.size() << " options in all)";
  throw Error("quantize: " + std::to_string(bad.size()) +
              " Linear(s) have in_features K not a multiple of the NVFP4 block (" + std::to_string(kNvfp4BlockSize) +
              "): " + names.str() + "; keep them in BF16 with " + options.str());
}

// The output files of quantize_checkpoint (its groups and scales computed), each appended to `written` once written.
void write_output(const Checkpoint& in, const fs::path& out_dir, const QuantizeOptions& options,
                  const std::map<std::string, std::string>& group_of, const std::map<std::string, float>& group_scale,
                  const std::map<std::string, float>& group_input_amax, QuantizeReport& report,
                  std::vector<fs::path>& written) {
  // One output file per input file (model.safetensors, or shards + index), so memory holds one
  // shard's output at a time; a module's tensors land in the shard that held its weight.
  const fs::path& in_dir = in.dir();
  std::vector<const SafetensorsFile*> files;
  for (const auto& f : in.store().files()) {
    if (options.skip_files.count(f->path().filename().string()) == 0) files.push_back(f.get());
  }
  const bool sharded = files.size() > 1;
  ojson weight_map = ojson::object();
  uint64_t total_size = 0;
  for (size_t i_file = 0; i_file < files.size(); ++i_file) {
    std::string file_name = "model.safetensors";
    if (sharded) {
      char buf[64];
      std::snprintf(buf, sizeof(buf), "model-%05zu-of-%05zu.safetensors", i_file + 1, files.size());
      file_name = buf;
    }
    SafetensorsWriter writer;
    writer.set_metadata("format", "pt");
    auto add = [&](const std::string& name, DType dtype, const Shape& shape, std::span<const uint8_t> bytes) {
      writer.add(name, dtype, shape, bytes);
      weight_map[name] = file_name;
      total_size += bytes.size();
      report.bytes_out += bytes.size();
    };
    for (const TensorInfo& info : files[i_file]->tensors()) {
      const std::string& name = info.name;
      const TensorView v = files[i_file]->view(info);
      report.bytes_in += v.bytes.size();
      const std::string module = ends_with(name, ".weight") ? name.substr(0, name.size() - 7) : "";
      auto g = group_of.find(module);
      if (g == group_of.end()) {
        add(name, v.dtype, v.shape, v.bytes);
        continue;
      }
      const float gs = group_scale.at(g->second);
      // An all-zero group has gs 0; nvfp4_quantize then picks 1.0 itself (ModelOpt: NaN).
      const Nvfp4Matrix q = gs > 0.0f ? nvfp4_quantize(v, gs) : nvfp4_quantize(v);
      add(module + ".weight", DType::kU8, {q.n_rows, q.n_cols / 2}, q.packed);
      add(module + ".weight_scale", DType::kF8_E4M3, {q.n_rows, q.n_cols / kNvfp4BlockSize}, q.scales);
      auto scalar = [&](const std::string& tensor, float value) {
        uint8_t b[4];
        std::memcpy(b, &value, 4);
        add(tensor, DType::kF32, {}, b);
      };
      scalar(module + ".weight_scale_2", q.global_scale);
      if (report.has_input_scales) {
        scalar(module + ".input_scale", group_input_amax.at(g->second) / kInputScaleDivisor);
      }
    }
    writer.write(out_dir / file_name);
    written.push_back(out_dir / file_name);
  }
  if (sharded) {
    ojson index;
    index["metadata"] = {{"total_size", total_size}};
    index["weight_map"] = weight_map;
    write_json(out_dir / "model.safetensors.index.json", index);
    written.push_back(out_dir / "model.safetensors.index.json");
  }

  // config.json: the input's, with quantization_config (placed before torch_dtype, as HF writes).
  const ojson producer = {{"name", options.producer_name}, {"version", options.producer_version}};
  ojson config = read_json_file<ojson>(in_dir / "config.json");
  std::optional<ojson> torch_dtype;
  if (config.contains("torch_dtype")) {
    torch_dtype = config["torch_dtype"];
    config.erase("torch_dtype");
  }
  ojson group0;
  group0["weights"] = {{"dynamic", false}, {"num_bits", 4}, {"type", "float"}, {"group_size", 16}};
  if (report.has_input_scales) {
    group0["input_activations"] = {{"dynamic", false}, {"num_bits", 4}, {"type", "float"}, {"group_size", 16}};
  }
  group0["targets"] = {"Linear"};
  ojson qc;
  qc["quant_method"] = "modelopt";
  qc["quant_algo"] = report.quant_algo;
  qc["ignore"] = report.exclude_modules;
  qc["config_groups"] = {{"group_0", group0}};
  qc["producer"] = producer;
  config["quantization_config"] = qc;
  if (torch_dtype) config["torch_dtype"] = *torch_dtype;
  write_json(out_dir / "config.json", config);
  written.push_back(out_dir / "config.json");

  ojson hf;
  hf["producer"] = producer;
  hf["quantization"] = {{"quant_algo", report.quant_algo},
                        {"kv_cache_quant_algo", nullptr},
                        {"group_size", 16},
                        {"exclude_modules", report.exclude_modules}};
  write_json(out_dir / "hf_quant_config.json", hf);
  written.push_back(out_dir / "hf_quant_config.json");

  // Everything else that is not weights (generation_config.json, tokenizer files, ...).
  std::set<std::string> skip = {"config.json", "hf_quant_config.json", "model.safetensors.index.json"};
  for (const auto& e : fs::directory_iterator(in_dir)) {
    const std::string file = e.path().filename().string();
    if (!e.is_regular_file() || skip.count(file) || e.path().extension() == ".safetensors") continue;
    fs::copy_file(e.path(), out_dir / file, fs::copy_options::overwrite_existing);
    written.push_back(out_dir / file);
  }
}

}  // namespace

std::vector<std::string> quantize_exclusions(const std::vector<std::string>& extra, const Checkpoint& in) {
  return exclusion_config(extra, in).exclude_modules;
}

std::vector<std::string> modules_to_quantize(const Checkpoint& in, const std::vector<std::string>& extra_exclude) {
  std::vector<std::string> out;
  for (const LinearModule* m : quantizable_modules(in, exclusion_config(extra_exclude, in))) out.push_back(m->name);
  return out;
}

std::vector<std::string> unmatched_exclusions(const Checkpoint& in, const std::vector<std::string>& extra) {
  if (extra.empty()) return {};
  std::vector<std::string> out;
  for (const std::string& p : extra) {
    QuantConfig one;
    one.present = true;
    one.exclude_modules = {p};
    const bool matches = std::any_of(in.modules().begin(), in.modules().end(), [&](const LinearModule& m) {
      return m.kind != ModuleKind::kEmbedding && one.is_excluded(m.name);
    });
    if (!matches && std::find(out.begin(), out.end(), p) == out.end()) out.push_back(p);
  }
  return out;
}

void create_output_dir(const fs::path& out_dir) {
  std::error_code ec;
  fs::create_directories(out_dir, ec);
  FP4MOE_CHECK(!ec) << "quantize: cannot create the output directory " << out_dir.string() << ": " << ec.message();
}

QuantizeOutput::QuantizeOutput(fs::path dir) : dir_(fs::absolute(std::move(dir))) {
  // The topmost directory on the way down that does not exist yet: what the run makes.
  for (fs::path p = dir_; !fs::exists(p); p = p.parent_path()) {
    made_ = p;
    if (p == p.parent_path()) break;
  }
  create_output_dir(dir_);
}

QuantizeOutput::~QuantizeOutput() {
  if (committed_ || made_.empty()) return;
  // Only directories the run made, and only while empty (fs::remove refuses a non-empty one): a file someone else
  // put there stays, and so does the directory holding it.
  std::error_code ec;
  for (fs::path p = dir_;; p = p.parent_path()) {
    if (!fs::remove(p, ec) || p == made_ || p == p.parent_path()) break;
  }
}

void check_quantize_paths(const Checkpoint& in, const fs::path& out_dir) {
  const fs::path& in_dir = in.dir();
  FP4MOE_CHECK(!(fs::exists(out_dir) && fs::equivalent(in_dir, out_dir)))
      << "quantize: output directory " << out_dir.string() << " is the input directory";
  FP4MOE_CHECK(!fs::exists(out_dir) || fs::is_directory(out_dir))
      << "quantize: output directory " << out_dir.string() << " exists and is not a directory";
  FP4MOE_CHECK(!fs::exists(out_dir) || fs::is_empty(out_dir))
      << "quantize: output directory " << out_dir.string()
      << " already exists and is not empty (stale shards would mix with the new ones)";
  // The output can be created: its nearest existing ancestor is a writable directory (checked before the
  // calibration and the quantization, not after them).
  check_can_create_in(fs::absolute(out_dir), "quantize: output directory " + out_dir.string(), "created",
                      /*walk_up=*/true);
  in.require_valid();
  const int64_t n_nvfp4 = in.linear_summary().n_nvfp4;
  FP4MOE_CHECK(n_nvfp4 == 0 && !in.quant().present)
      << "quantize: " << in_dir.string() << " is already quantized (" << n_nvfp4
      << " NVFP4 modules, quant config from '" << in.quant().source << "')";
}

QuantizeReport quantize_checkpoint(const Checkpoint& in, const fs::path& out_dir, const QuantizeOptions& options) {
  check_quantize_paths(in, out_dir);

  QuantizeReport report;
  const QuantConfig exclusions = exclusion_config(options.exclude, in);
  report.exclude_modules = exclusions.exclude_modules;

  // Modules to quantize, grouped by shared scale.
  std::map<std::string, std::vector<const LinearModule*>> groups;
  std::map<std::string, std::string> group_of;  // module -> group
  for (const LinearModule* m : quantizable_modules(in, exclusions)) {
    const std::string g = scale_group_of(m->name);
    groups[g].push_back(m);
    group_of[m->name] = g;
    ++report.n_quantized;
  }
  for (const LinearModule& m : in.modules())
    if (m.kind != ModuleKind::kEmbedding && exclusions.is_excluded(m.name)) ++report.n_kept;

  // weight_scale_2 per group: max over members of amax / 2688 (== amax(group) / 2688).
  std::map<std::string, float> group_scale;
  for (const auto& [g, members] : groups) {
    float gs = 0.0f;
    for (const LinearModule* m : members) {
      gs = std::max(gs, weight_global_scale(in.tensor(m->name + ".weight"), m->name));
    }
    group_scale[g] = gs;
    if (members.size() > 1) ++report.n_scale_groups;
  }

  // input_scale per group: all or nothing.
  std::map<std::string, float> group_input_amax;
  if (!options.input_amax.empty()) {
    std::vector<std::string> missing;
    for (const auto& [name, g] : group_of) {
      auto it = options.input_amax.find(name);
      if (it == options.input_amax.end()) {
        missing.push_back(name);
        continue;
      }
      FP4MOE_CHECK(std::isfinite(it->second) && it->second > 0.0f)
          << "quantize: calibrated input amax of " << name << " is " << it->second
          << ", expected a finite positive value";
      group_input_amax[g] = std::max(group_input_amax[g], it->second);
    }
    if (!missing.empty()) {
      FP4MOE_FAIL() << "quantize: calibration gave input amax for "
                    << group_of.size() - missing.size() << " of " << group_of.size()
                    << " quantized modules; missing " << missing.size() << ", first "
                    << missing.front() << " (refusing to write partial input_scale tensors)";
    }
    for (const auto& [name, amax] : options.input_amax) {
      FP4MOE_CHECK(group_of.count(name) == 1)
          << "quantize: input amax given for " << name << ", which is not a quantized Linear";
    }
    report.has_input_scales = true;
  }
  report.quant_algo = report.has_input_scales ? "NVFP4" : "W4A16_NVFP4";

  // Tensors: quantized modules replace .weight by the four NVFP4 tensors; the rest is copied. What this run writes
  // is recorded: a failure part-way (a full disk) removes exactly those files (out_dir was empty), not a half
  // checkpoint, and nothing it did not write.
  create_output_dir(out_dir);
  std::vector<fs::path> written;
  try {
    write_output(in, out_dir, options, group_of, group_scale, group_input_amax, report, written);
  } catch (...) {
    std::error_code ec;
    for (const fs::path& p : written) fs::remove(p, ec);
    throw;
  }
  return report;
}

}  // namespace fp4moe::format
