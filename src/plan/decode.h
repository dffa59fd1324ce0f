// Decode economics of a MoE layer under expert parallelism: for each concurrency (running
// requests, one token each per decode step), the tokens each expert sees, the bytes and FLOPs of
// the two expert GEMMs on one EP rank, the roofline time, the arithmetic intensity and the share
// of tensor peak it implies; and how many requests it takes to reach a target utilization.
//
// Formulas (per MoE layer, per decode step, per EP rank; docs/planner.md "Decode economics"):
//   T = concurrency tokens; each picks top_k of E experts; E/EP experts per rank.
//   per-expert selection probability p = top_k / E (uniform) or top_k x h_e / sum(h) (histogram)
//   tokens per expert ~ Binomial(T, p): mean T p, p50 / p99 its quantiles
//   active experts on a rank = sum over its experts of 1 - (1 - p_e)^T
//   tokens on a rank = T x sum over its experts of p_e          (= T top_k / EP uniform)
//   weight bytes = active x (2I x H + H x I) x w_bytes            (w_bytes = 0.5 + 1/16: NVFP4 + e4m3 scales)
//   activation bytes = tokens x (H x a_bytes + 2I x 2 + I x a_bytes + H x 2)   (inputs in a_bytes, bf16 outputs)
//   FLOPs = 2 x tokens x (2I x H + I x H)
//   time = max(bytes / HBM, FLOPs / peak);  AI = FLOPs / bytes;  utilization = FLOPs / time / peak
// FP4 GPUs use the FP4 peak with NVFP4 activations (a_bytes = 0.5625); others (Hopper, our W4A16
// kernel) the BF16 peak with BF16 activations (a_bytes = 2). No GPU needed.
// Tested by tests/plan/test_decode.cpp against hand-computed GLM-5 numbers.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "plan/gpu_table.h"

namespace fp4moe::plan {

struct DecodeModel {
  int64_t n_experts = 0, top_k = 0, hidden = 0, intermediate = 0;
  int64_t ep = 8;                       // expert-parallel degree (ranks)
  std::vector<double> routing;          // optional per-expert load histogram (E entries); empty: uniform
};

struct DecodeRow {
  int64_t concurrency = 0;
  double tokens_per_expert_mean = 0;
  double tokens_per_expert_p50 = 0, tokens_per_expert_p99 = 0;
  double active_experts_per_rank = 0;
  double tokens_per_rank = 0;           // token-expert assignments landing on the rank
  double gemm1_bytes = 0, gemm1_flops = 0, gemm2_bytes = 0, gemm2_flops = 0;
  double bytes = 0, flops = 0;
  double time_us = 0;
  double arithmetic_intensity = 0;      // FLOP per byte
  double utilization = 0;               // of the tensor peak used (0..1)
  std::string bound;                    // "hbm" or "compute"
};

// The most running requests a decode row models: far past any server (SGLang's --max-running-requests is in the
// thousands); --concurrency past it is refused naming it.
inline constexpr int64_t kMaxDecodeConcurrency = int64_t{1} << 24;

// Validates the model (throws fp4moe::Error with the field and its value).
void check_decode_model(const DecodeModel& m);
DecodeRow decode_row(const DecodeModel& m, const GpuSpec& gpu, int64_t concurrency);
std::vector<DecodeRow> decode_table(const DecodeModel& m, const GpuSpec& gpu, const std::vector<int64_t>& concurrencies);
// The smallest concurrency (<= max_concurrency) whose utilization reaches `target` (0..1), or -1.
int64_t concurrency_for_utilization(const DecodeModel& m, const GpuSpec& gpu, double target,
                                    int64_t max_concurrency = 1 << 20);

// The q-quantile (0..1) of Binomial(n, p): the smallest x with P(X <= x) >= q. O(standard deviation + 144) steps.
int64_t binomial_quantile(int64_t n, double p, double q);

}  // namespace fp4moe::plan
