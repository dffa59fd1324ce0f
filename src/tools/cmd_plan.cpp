// `fp4moe plan`: the shared-memory tile planner on the command line (docs/planner.md).
//
//   fp4moe plan --gpu h200 --problem moe:E=256,topk=8,H=6144,I=2048 --tokens 1,16,64,512,4096
//   fp4moe plan --gpu rtx-pro-6000 --kernel cutlass-sm120-moe --problem moe:E=256,topk=8,H=6144,I=2048
//   fp4moe plan --gpu rtx-pro-6000 --kernel cutlass-sm120-moe --problem ... --emit-blocklist
//   fp4moe plan --gpu b200 --model /path/to/GLM-5 --decode --ep 8 --concurrency 1,16,64,256,1024
//   ... --json  (schema fp4moe.plan.v1 / fp4moe.decode.v1, docs/planner.md)
//
// Without --gpu the CUDA runtime's device 0 is used (an error when there is none). With --gpu and
// a device of the same product present, the runtime's limits override the table and every
// disagreement is printed. Tested by tests/tools/test_cmd_plan.cpp (runs the built binary).
#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "format/json_file.h"
#include "model/presets.h"
#include "plan/decode.h"
#include "plan/gpu_table.h"
#include "plan/kernel_families.h"
#include "plan/plan_report.h"
#include "plan/planner.h"
#include "tools/cli_options.h"
#include "tools/commands.h"

namespace fp4moe::tools {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

struct PlanArgs {
  std::string gpu, kernel, problem, tokens, model, concurrency = "1,16,64,256,1024", routing;
  std::string cutlass = "b46b16d";
  bool json_out = false, blocklist = false, decode = false, no_runtime = false, layouts = false;
  int64_t ep = 8;
  double target_util = 0.5;
};

int64_t config_int(const json& cfg, const char* key, const std::string& source) {
  FP4MOE_CHECK(cfg.contains(key)) << source << ": no '" << key << "'";
  FP4MOE_CHECK(cfg[key].is_number_integer())
      << source << ": '" << key << "' is " << cfg[key].dump() << ", expected an integer";
  FP4MOE_CHECK(format::json_int_in(cfg[key], 1, INT32_MAX))
      << source << ": '" << key << "' = " << cfg[key].dump() << " must be in [1, 2^31)";
  return cfg[key].get<int64_t>();
}

// The MoE shape of a Hugging Face checkpoint: config.json's n_routed_experts,
// num_experts_per_tok, hidden_size, moe_intermediate_size. --model is a checkpoint folder (any MoE architecture
// with these fields), or a preset (model/presets.h, as serve and analyze take them) when no such folder exists.
plan::Problem problem_from_model(const std::string& dir) {
  const std::optional<json> preset = fs::exists(dir) ? std::nullopt : model::preset_config(dir);
  FP4MOE_CHECK(preset || fs::exists(dir)) << "--model " << dir << ": no such directory, and not a preset ("
                                          << fmt::format("{}", fmt::join(model::preset_names(), ", ")) << ")";
  const std::string file = preset ? "preset " + dir : (fs::path(dir) / "config.json").string();
  json cfg = preset ? *preset : format::read_json_file(file);
  if (cfg.contains("text_config") && !cfg.contains("n_routed_experts")) cfg = cfg["text_config"];
  plan::Problem p;
  p.kind = plan::Problem::Kind::kMoe;
  p.n_experts = config_int(cfg, "n_routed_experts", file);
  p.top_k = config_int(cfg, "num_experts_per_tok", file);
  p.hidden = config_int(cfg, "hidden_size", file);
  p.intermediate = config_int(cfg, "moe_intermediate_size", file);
  FP4MOE_CHECK(p.top_k <= p.n_experts) << file << ": num_experts_per_tok " << p.top_k << " > n_routed_experts "
                                       << p.n_experts;
  plan::check_problem(p, file + " (" + p.to_string() + ")");
  return p;
}

plan::CutlassRules cutlass_rules(const std::string& name) {
  if (name == "b46b16d" || name == "4.4.2") return plan::kCutlassB46b16d;
  if (name == "pre-carveout") return plan::without_capacity_carveout(plan::kCutlassB46b16d);
  if (name == "4.2.0" || name == "4.2") return plan::kCutlass420;
  FP4MOE_FAIL() << "unknown --cutlass '" << name << "'; known: b46b16d (>= 4.4.2, default), pre-carveout, 4.2.0";
  return plan::kCutlassB46b16d;
}

plan::ResolvedGpu resolve_gpu(const PlanArgs& a) {
  std::string why = "--no-runtime asks for no GPU query";
  std::optional<plan::RuntimeGpu> rt;
  if (!a.no_runtime) rt = plan::query_runtime_gpu(0, &why);
  if (a.gpu.empty()) {
    FP4MOE_CHECK(rt.has_value()) << why << "; pass --gpu (" << plan::gpu_names() << ")";
    return plan::resolve_runtime_gpu(*rt);
  }
  const plan::GpuSpec table = plan::require_gpu(a.gpu);
  if (rt) {
    plan::ResolvedGpu resolved = plan::resolve_runtime_gpu(*rt);
    if (resolved.spec.sm == table.sm && plan::find_gpu(resolved.spec.name).has_value() &&
        plan::find_gpu(resolved.spec.name)->name == table.name) {
      return plan::merge_runtime(table, *rt);
    }
  }
  plan::ResolvedGpu out;
  out.spec = table;
  return out;
}

std::vector<double> read_routing(const std::string& path) {
  const json j = format::read_json_file(path);
  FP4MOE_CHECK(j.is_array()) << path << ": expected a JSON array of per-expert token counts";
  std::vector<double> out;
  for (const json& v : j) {
    FP4MOE_CHECK(v.is_number()) << path << ": entry " << out.size() << " is " << v.dump() << ", not a number";
    out.push_back(v.get<double>());
  }
  return out;
}

void run_decode(const PlanArgs& a, const plan::Problem& problem, const plan::ResolvedGpu& gpu) {
  FP4MOE_CHECK(problem.kind == plan::Problem::Kind::kMoe) << "--decode needs a MoE problem (--problem moe:... or --model)";
  plan::DecodeModel m;
  m.n_experts = problem.n_experts;
  m.top_k = problem.top_k;
  m.hidden = problem.hidden;
  m.intermediate = problem.intermediate;
  m.ep = a.ep;
  if (!a.routing.empty()) m.routing = read_routing(a.routing);
  const std::vector<int64_t> conc = plan::parse_token_list(a.concurrency, "--concurrency");
  for (int64_t c : conc) {
    FP4MOE_CHECK(c <= plan::kMaxDecodeConcurrency)
        << "--concurrency " << c << " is past " << plan::kMaxDecodeConcurrency
        << " running requests, the most --decode models";
  }
  const std::vector<plan::DecodeRow> rows = plan::decode_table(m, gpu.spec, conc);
  const int64_t needed = plan::concurrency_for_utilization(m, gpu.spec, a.target_util);
  const bool fp4 = gpu.spec.fp4_dense_tflops > 0;
  const double peak = fp4 ? gpu.spec.fp4_dense_tflops : gpu.spec.bf16_dense_tflops;
  if (a.json_out) {
    json j;
    j["schema"] = "fp4moe.decode.v1";
    j["gpu"] = gpu.spec.name;
    j["problem"] = problem.to_string();
    j["ep"] = m.ep;
    j["peak_tflops"] = peak;
    j["peak_kind"] = fp4 ? "fp4" : "bf16";
    j["hbm_gbps"] = gpu.spec.hbm_gbps;
    j["routing"] = m.routing.empty() ? "uniform" : a.routing;
    json arr = json::array();
    for (const plan::DecodeRow& r : rows) {
      arr.push_back({{"concurrency", r.concurrency}, {"tokens_per_expert_mean", r.tokens_per_expert_mean},
                     {"tokens_per_expert_p50", r.tokens_per_expert_p50}, {"tokens_per_expert_p99", r.tokens_per_expert_p99},
                     {"active_experts_per_rank", r.active_experts_per_rank}, {"tokens_per_rank", r.tokens_per_rank},
                     {"gemm1_bytes", r.gemm1_bytes}, {"gemm1_flops", r.gemm1_flops}, {"gemm2_bytes", r.gemm2_bytes},
                     {"gemm2_flops", r.gemm2_flops}, {"time_us", r.time_us}, {"arithmetic_intensity", r.arithmetic_intensity},
                     {"utilization", r.utilization}, {"bound", r.bound}});
    }
    j["rows"] = arr;
    j["target_utilization"] = a.target_util;
    j["concurrency_for_target"] = needed < 0 ? json(nullptr) : json(needed);
    std::printf("%s\n", j.dump(2).c_str());
    return;
  }
  std::printf("%s", plan::format_gpu(gpu).c_str());
  std::printf("Decode economics per MoE layer per step on one of %lld EP ranks: %s, %s peak %.0f TFLOPS, HBM %.0f GB/s, %s routing\n",
              static_cast<long long>(m.ep), problem.to_string().c_str(), fp4 ? "FP4" : "BF16", peak, gpu.spec.hbm_gbps,
              m.routing.empty() ? "uniform" : "histogram");
  std::printf("  %11s %9s %5s %5s %9s %9s %11s %12s %9s %8s %7s %s\n", "concurrency", "tok/exp", "p50", "p99", "act.exp",
              "tok/rank", "MB moved", "GFLOP", "time_us", "AI", "util", "bound");
  for (const plan::DecodeRow& r : rows) {
    std::printf("  %11lld %9.3f %5.0f %5.0f %9.3f %9.1f %11.2f %12.3f %9.2f %8.2f %6.2f%% %s\n",
                static_cast<long long>(r.concurrency), r.tokens_per_expert_mean, r.tokens_per_expert_p50,
                r.tokens_per_expert_p99, r.active_experts_per_rank, r.tokens_per_rank, r.bytes / 1e6, r.flops / 1e9, r.time_us,
                r.arithmetic_intensity, 100.0 * r.utilization, r.bound.c_str());
  }
  if (needed < 0) {
    std::printf("  %.0f%% of peak is not reached below concurrency %d\n", 100.0 * a.target_util, 1 << 20);
  } else {
    std::printf("  %.0f%% of %s peak needs %lld running requests\n", 100.0 * a.target_util, fp4 ? "FP4" : "BF16",
                static_cast<long long>(needed));
  }
}

void run_plan(const PlanArgs& a) {
  FP4MOE_CHECK(a.problem.empty() != a.model.empty()) << "give exactly one of --problem and --model";
  const plan::Problem problem = a.model.empty() ? plan::parse_problem(a.problem) : problem_from_model(a.model);
  const plan::ResolvedGpu gpu = resolve_gpu(a);
  if (a.decode) {
    FP4MOE_CHECK(a.tokens.empty()) << "--tokens " << a.tokens
                                   << " is for the tile plans; --decode models running requests: use --concurrency";
    run_decode(a, problem, gpu);
    return;
  }
  plan::PlanOptions options;
  if (!a.kernel.empty()) options.family = plan::parse_family(a.kernel);
  options.rules = cutlass_rules(a.cutlass);
  const std::vector<int64_t> tokens = a.tokens.empty() ? std::vector<int64_t>{} : plan::parse_token_list(a.tokens);
  const plan::PlanReport report = plan::make_report(problem, tokens, gpu, options);
  if (a.blocklist) {
    const plan::Blocklist b = plan::flashinfer_blocklist(report);
    if (!a.json_out) {
      std::printf("%s", plan::format_blocklist(b).c_str());
      return;
    }
    // --json: the same tactics and reasons as a document (it printed the text form, ignoring --json).
    nlohmann::json j;
    j["schema"] = "fp4moe.blocklist.v1";
    j["gpu"] = report.gpu.spec.name;
    j["kernel"] = plan::family_name(report.family);
    j["problem"] = report.problem.to_string();
    j["tactics"] = nlohmann::json::array();
    for (size_t i = 0; i < b.tactics.size(); ++i)
      j["tactics"].push_back({{"tactic", b.tactics[i]}, {"reason", b.reasons[i]}});
    std::printf("%s\n", j.dump(2).c_str());
    return;
  }
  // Every candidate's region table (--layouts): the text's, or under "layouts" in the JSON (it was left out of it).
  const auto layouts_json = [&] {
    nlohmann::json out = nlohmann::json::array();
    for (const plan::PlanReport::Feasibility& f : report.feasibility) {
      for (const plan::TileCandidate& c : f.order) {
        const plan::SmemLayout l = plan::candidate_layout(c, gpu.spec, options.rules);
        nlohmann::json regions = nlohmann::json::array();
        for (int i = 0; i < l.n_regions; ++i) {
          const plan::SmemRegion& r = l.regions[i];
          regions.push_back({{"name", r.name}, {"offset", r.offset}, {"bytes", r.bytes}, {"align", r.align}});
        }
        out.push_back(
            {{"gemm", f.gemm}, {"candidate", c.to_string()}, {"total_bytes", l.total_bytes}, {"regions", regions}});
      }
    }
    return out;
  };
  if (a.json_out) {
    nlohmann::json j = plan::report_json(report);
    if (a.layouts) j["layouts"] = layouts_json();
    std::printf("%s\n", j.dump(2).c_str());
    return;
  }
  std::printf("%s", plan::format_report(report).c_str());
  if (a.layouts) {
    for (const plan::PlanReport::Feasibility& f : report.feasibility) {
      for (const plan::TileCandidate& c : f.order) {
        std::printf("\n%s %s:\n%s", f.gemm.c_str(), c.to_string().c_str(),
                    plan::describe(plan::candidate_layout(c, gpu.spec, options.rules)).c_str());
      }
    }
  }
  if (tokens.empty() && problem.kind == plan::Problem::Kind::kMoe) {
    std::printf("\n(add --tokens 1,16,64,512,4096 to rank the tiles for those batch sizes)\n");
  }
}

}  // namespace

void register_plan_command(CLI::App& app) {
  auto args = std::make_shared<PlanArgs>();
  CLI::App* cmd = app.add_subcommand("plan", "Pick feasible GEMM tiles for a GPU and explain every rejection in bytes");
  cmd->add_option("--gpu", args->gpu,
                  "GPU product or arch (h200, rtx-pro-6000, b200, dgx-spark, sm_120, ...); default: device 0")
      ->check(parsed_by([](const std::string& v) { plan::require_gpu(v); }));
  cmd->add_option("--kernel", args->kernel, "ours | cutlass-sm120-moe | cutlass-sm100-moe (default: ours on Hopper)")
      ->check(parsed_by([](const std::string& v) { plan::parse_family(v); }));
  cmd->add_option("--problem", args->problem, "moe:E=256,topk=8,H=6144,I=2048 or gemm:M=..,N=..,K=..");
  cmd->add_option("--model", args->model, "checkpoint folder whose config.json gives the MoE shape, or a preset");
  cmd->add_option("--tokens", args->tokens, "token counts (batch sizes) to plan for, e.g. 1,16,64,512,4096");
  cmd->add_option("--cutlass", args->cutlass, "CUTLASS rules: b46b16d (>= 4.4.2, default), pre-carveout, 4.2.0");
  cmd->add_flag("--json", args->json_out, "print JSON (schema fp4moe.plan.v1, or fp4moe.decode.v1 with --decode)");
  CLI::Option* blocklist =
      cmd->add_flag("--emit-blocklist", args->blocklist, "print FlashInfer tactic indices that fail on the GPU");
  CLI::Option* decode = cmd->add_flag("--decode", args->decode, "decode economics instead of tiles");
  decode->excludes(blocklist);
  // The decode options without --decode were ignored: a usage error (exit 2) naming the flag it needs.
  cmd->add_option("--ep", args->ep, "expert-parallel degree for --decode (default 8)")->needs(decode);
  cmd->add_option("--concurrency", args->concurrency, "running requests for --decode (default 1,16,64,256,1024)")
      ->needs(decode);
  cmd->add_option("--target-util", args->target_util, "utilization target for --decode (default 0.5)")->needs(decode);
  cmd->add_option("--routing", args->routing,
                  "FILE: a JSON array of per-expert token counts for --decode (default uniform routing)")
      ->needs(decode);
  cmd->add_flag("--no-runtime", args->no_runtime, "ignore the local GPU, use the table only");
  cmd->add_flag("--layouts", args->layouts, "also print every candidate's SMEM region table (offset, bytes, alignment)")
      ->excludes(blocklist);  // the blocklist prints tactics only (--layouts was dropped without a word)
  cmd->callback([args] { run_plan(*args); });
}

}  // namespace fp4moe::tools
