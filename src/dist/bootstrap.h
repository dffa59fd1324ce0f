// Bootstrap of a one-process-per-GPU world: how every rank gets the same communicator id (NCCL's
// 128-byte ncclUniqueId) before the communicator exists. Two documented ways:
//  1. FP4MOE_NCCL_ID=<256 hex chars>: a launcher made the id (NcclCommunicator::new_unique_id_hex)
//     and passes it to every rank it starts. Takes precedence when set.
//  2. A shared file path that the launcher gives every rank: rank 0 makes the id and writes it as hex
//     to the path atomically (a temporary file in the same folder, then rename); the other ranks poll
//     the path until it appears or the timeout passes. The path must be fresh for each launch
//     (e.g. in a folder the launcher made with mkdtemp): a stale file would hand out an old id.
// Here the id is opaque bytes, so this file knows nothing of NCCL and is tested on the CPU by
// tests/dist/test_communicator.cpp (Bootstrap.*).
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace fp4moe::dist {

inline constexpr const char* kNcclIdEnv = "FP4MOE_NCCL_ID";

// Lower-case hex of bytes, and back; from_hex throws naming the length / the bad character.
std::string bytes_to_hex(const std::vector<uint8_t>& bytes);
std::vector<uint8_t> hex_to_bytes(const std::string& hex, size_t expected_bytes);

// Rank 0: make_id(), write its hex to `path` atomically, return it. Other ranks: poll `path` every
// few ms until it holds 2*n_bytes hex chars, or throw after `timeout` naming the path and rank.
std::vector<uint8_t> exchange_id_via_file(int rank, const std::string& path, size_t n_bytes,
                                          std::chrono::milliseconds timeout,
                                          const std::function<std::vector<uint8_t>()>& make_id);

// The id from FP4MOE_NCCL_ID when set (n_bytes of hex), else exchange_id_via_file (path must then
// be non-empty; the error says how to provide one).
std::vector<uint8_t> bootstrap_id(int rank, const std::string& path, size_t n_bytes, std::chrono::milliseconds timeout,
                                  const std::function<std::vector<uint8_t>()>& make_id);

}  // namespace fp4moe::dist
