// FakeCommunicator (dist/fake_communicator.h): every collective on 2, 3 and 4 ranks against a
// serial computation on fresh random data (testing::test_seed()): all-reduce (F32 exactly in rank
// order, BF16 summed in f32 and rounded once, in place), reduce-scatter, all-gather, all-to-all-v
// with uneven and zero counts; bit-identical results across repeated runs; and failure
// propagation: a rank that throws, returns early, calls a different collective, or arrives after
// the timeout makes every other rank's call throw an Error naming it, and nothing hangs (each such
// test runs with a short timeout). Also the id bootstrap of dist/bootstrap.h (hex, shared file).
// Run: build/tests/dist/test_dist --gtest_filter='FakeComm*:Bootstrap*'.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <future>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "core/error.h"
#include "dist/bootstrap.h"
#include "dist/fake_communicator.h"
#include "testing/testing.h"

namespace fp4moe::dist {
namespace {

using namespace std::chrono_literals;

std::vector<std::vector<float>> random_per_rank(int world, size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> u(-4.0f, 4.0f);
  std::vector<std::vector<float>> v(static_cast<size_t>(world), std::vector<float>(n));
  for (auto& r : v) {
    for (auto& x : r) x = u(rng);
  }
  return v;
}

class FakeComm : public ::testing::TestWithParam<int> {};

TEST_P(FakeComm, AllReduceF32MatchesRankOrderSum) {
  const int W = GetParam();
  const size_t n = 1001;
  const auto in = random_per_rank(W, n, testing::test_seed() + static_cast<uint64_t>(W));
  std::vector<float> want(n);
  for (size_t i = 0; i < n; ++i) {
    float s = in[0][i];
    for (int r = 1; r < W; ++r) s += in[static_cast<size_t>(r)][i];
    want[i] = s;
  }
  std::vector<std::vector<float>> out(in);
  for (int repeat = 0; repeat < 3; ++repeat) {
    out = in;
    run_ranks(W, [&](Communicator& c) {
      EXPECT_EQ(c.world_size(), W);
      c.all_reduce_sum(out[static_cast<size_t>(c.rank())].data(), static_cast<int64_t>(n));
    });
    for (int r = 0; r < W; ++r) {
      for (size_t i = 0; i < n; ++i) ASSERT_EQ(out[static_cast<size_t>(r)][i], want[i]) << "rank " << r << " i " << i;
    }
  }
}

TEST_P(FakeComm, AllReduceBf16SumsInF32RoundsOnce) {
  const int W = GetParam();
  const size_t n = 513;
  const auto in = random_per_rank(W, n, testing::test_seed() + 100);
  std::vector<std::vector<uint16_t>> buf(static_cast<size_t>(W), std::vector<uint16_t>(n));
  for (int r = 0; r < W; ++r) {
    for (size_t i = 0; i < n; ++i) buf[static_cast<size_t>(r)][i] = f32_to_bf16(in[static_cast<size_t>(r)][i]);
  }
  std::vector<uint16_t> want(n);
  for (size_t i = 0; i < n; ++i) {
    float s = bf16_to_f32(buf[0][i]);
    for (int r = 1; r < W; ++r) s += bf16_to_f32(buf[static_cast<size_t>(r)][i]);
    want[i] = f32_to_bf16(s);
  }
  run_ranks(W, [&](Communicator& c) {
    c.all_reduce_sum_bf16(buf[static_cast<size_t>(c.rank())].data(), static_cast<int64_t>(n));
  });
  for (int r = 0; r < W; ++r) EXPECT_EQ(buf[static_cast<size_t>(r)], want) << "rank " << r;
}

TEST_P(FakeComm, ReduceScatterAndAllGather) {
  const int W = GetParam();
  const int64_t block = 37;
  const auto in = random_per_rank(W, static_cast<size_t>(W * block), testing::test_seed() + 200);
  std::vector<std::vector<float>> rs(static_cast<size_t>(W), std::vector<float>(static_cast<size_t>(block)));
  std::vector<std::vector<float>> ag(static_cast<size_t>(W), std::vector<float>(static_cast<size_t>(W * block)));
  run_ranks(W, [&](Communicator& c) {
    const size_t r = static_cast<size_t>(c.rank());
    c.reduce_scatter_sum(in[r].data(), rs[r].data(), block);
    // all-gather each rank's first `block` inputs
    c.all_gather(in[r].data(), ag[r].data(), block * 4);
  });
  for (int r = 0; r < W; ++r) {
    for (int64_t i = 0; i < block; ++i) {
      float s = in[0][static_cast<size_t>(r * block + i)];
      for (int q = 1; q < W; ++q) s += in[static_cast<size_t>(q)][static_cast<size_t>(r * block + i)];
      ASSERT_EQ(rs[static_cast<size_t>(r)][static_cast<size_t>(i)], s) << "reduce-scatter rank " << r << " i " << i;
    }
    for (int q = 0; q < W; ++q) {
      for (int64_t i = 0; i < block; ++i) {
        ASSERT_EQ(ag[static_cast<size_t>(r)][static_cast<size_t>(q * block + i)],
                  in[static_cast<size_t>(q)][static_cast<size_t>(i)])
            << "all-gather rank " << r << " from " << q;
      }
    }
  }
}

TEST_P(FakeComm, AllToAllVUnevenCounts) {
  const int W = GetParam();
  std::mt19937_64 rng(testing::test_seed() + 300);
  // counts[p][q]: floats rank p sends to rank q, including zeros.
  std::vector<std::vector<int64_t>> counts(static_cast<size_t>(W), std::vector<int64_t>(static_cast<size_t>(W)));
  for (auto& row : counts) {
    for (auto& c : row) c = static_cast<int64_t>(rng() % 5) == 0 ? 0 : static_cast<int64_t>(rng() % 20);
  }
  // send[p] = for q: counts[p][q] values 1000*p + 100*q + i
  std::vector<std::vector<float>> send(static_cast<size_t>(W)), recv(static_cast<size_t>(W));
  for (int p = 0; p < W; ++p) {
    for (int q = 0; q < W; ++q) {
      for (int64_t i = 0; i < counts[p][q]; ++i) send[p].push_back(static_cast<float>(1000 * p + 100 * q + i));
    }
  }
  run_ranks(W, [&](Communicator& c) {
    const int r = c.rank();
    std::vector<int64_t> sb(static_cast<size_t>(W)), rb(static_cast<size_t>(W));
    int64_t total = 0;
    for (int q = 0; q < W; ++q) {
      sb[q] = counts[r][q] * 4;
      rb[q] = counts[q][r] * 4;
      total += counts[q][r];
    }
    recv[r].assign(static_cast<size_t>(total), -1.0f);
    c.all_to_all_v(send[r].data(), sb.data(), recv[r].data(), rb.data());
  });
  for (int r = 0; r < W; ++r) {
    std::vector<float> want;
    for (int p = 0; p < W; ++p) {
      for (int64_t i = 0; i < counts[p][r]; ++i) want.push_back(static_cast<float>(1000 * p + 100 * r + i));
    }
    EXPECT_EQ(recv[r], want) << "rank " << r;
  }
}

TEST_P(FakeComm, RankThatThrowsFailsEveryPeer) {
  const int W = GetParam();
  for (int bad = 0; bad < W; ++bad) {
    std::vector<std::string> seen(static_cast<size_t>(W));
    const auto t0 = std::chrono::steady_clock::now();
    try {
      run_ranks(
          W,
          [&](Communicator& c) {
            float x = 1.0f;
            c.all_reduce_sum(&x, 1);  // one good collective first
            if (c.rank() == bad) throw Error("injected failure on rank " + std::to_string(bad));
            try {
              c.barrier();
            } catch (const Error& e) {
              seen[static_cast<size_t>(c.rank())] = e.what();
              throw;
            }
          },
          30s);
      FAIL() << "run_ranks returned normally with rank " << bad << " throwing";
    } catch (const Error& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find("rank " + std::to_string(bad) + " failed: threw: injected failure"), std::string::npos)
          << what;
    }
    EXPECT_LT(std::chrono::steady_clock::now() - t0, 10s) << "failure propagation must not wait for the timeout";
    for (int r = 0; r < W; ++r) {
      if (r == bad) continue;
      EXPECT_NE(seen[static_cast<size_t>(r)].find("rank " + std::to_string(bad) + " failed"), std::string::npos)
          << "rank " << r << " saw: " << seen[static_cast<size_t>(r)];
    }
  }
}

TEST_P(FakeComm, RankThatReturnsEarlyFailsPeers) {
  const int W = GetParam();
  const auto t0 = std::chrono::steady_clock::now();
  try {
    run_ranks(
        W,
        [&](Communicator& c) {
          if (c.rank() == W - 1) return;  // skips the collective
          std::vector<float> v(8, 1.0f);
          c.all_reduce_sum(v.data(), 8);
        },
        30s);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("rank " + std::to_string(W - 1) + " exited"), std::string::npos) << e.what();
  }
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 10s);
}

TEST_P(FakeComm, LateRankTimesOutEveryone) {
  const int W = GetParam();
  const auto t0 = std::chrono::steady_clock::now();
  try {
    run_ranks(
        W,
        [&](Communicator& c) {
          if (c.rank() == 1) std::this_thread::sleep_for(1500ms);  // far longer than the 400 ms timeout
          c.barrier();
        },
        400ms);
    FAIL() << "expected a timeout";
  } catch (const Error& e) {
    const std::string what = e.what();
    // First line: "rank <missing ranks> did not join barrier within 400 ms (timed out; ...)"; the
    // missing ranks include 1 (others too if the loaded machine started their threads late).
    const size_t end = what.find(" did not join barrier within 400 ms");
    ASSERT_NE(end, std::string::npos) << what;
    ASSERT_EQ(what.rfind("rank ", 0), 0u) << what;
    const std::string missing = ", " + what.substr(5, end - 5) + ",";
    EXPECT_NE(missing.find(", 1,"), std::string::npos) << what;
    EXPECT_NE(what.find("rank 1: rank 1: barrier cannot run"), std::string::npos) << what;  // the late rank too
  }
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 5s);
}

TEST_P(FakeComm, MismatchedCollectivesFailEveryRank) {
  const int W = GetParam();
  try {
    run_ranks(
        W,
        [&](Communicator& c) {
          std::vector<float> v(16, 1.0f);
          c.all_reduce_sum(v.data(), c.rank() == 0 ? 16 : 8);
        },
        30s);
    FAIL() << "expected a mismatch error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("collective mismatch"), std::string::npos) << e.what();
  }
  try {
    run_ranks(W, [&](Communicator& c) {
      // rank 0 sends 4 bytes to everyone, the others expect 8 from it
      std::vector<int64_t> sb(static_cast<size_t>(W), c.rank() == 0 ? 4 : 0), rb(static_cast<size_t>(W), 0);
      rb[0] = c.rank() == 0 ? 4 : 8;
      std::vector<uint8_t> s(64), r(64);
      c.all_to_all_v(s.data(), sb.data(), r.data(), rb.data());
    }, 30s);
    FAIL() << "expected an all_to_all_v size error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("all_to_all_v: rank 0 sends 4 bytes to rank 1, which expects 8"),
              std::string::npos)
        << e.what();
  }
}

INSTANTIATE_TEST_SUITE_P(Ranks, FakeComm, ::testing::Values(2, 3, 4));

TEST(FakeCommSingle, WorldOfOneIsIdentity) {
  run_ranks(1, [](Communicator& c) {
    std::vector<float> v{1.5f, -2.0f};
    c.all_reduce_sum(v.data(), 2);
    EXPECT_EQ(v, (std::vector<float>{1.5f, -2.0f}));
    EXPECT_EQ(c.describe(), "fake rank 0/1");
  });
}

TEST(Bootstrap, HexRoundTripAndErrors) {
  std::mt19937_64 rng(testing::test_seed());
  std::vector<uint8_t> id(128);
  for (auto& b : id) b = static_cast<uint8_t>(rng());
  const std::string hex = bytes_to_hex(id);
  EXPECT_EQ(hex.size(), 256u);
  EXPECT_EQ(hex_to_bytes(hex, 128), id);
  EXPECT_EQ(bytes_to_hex({0x00, 0xAB, 0x7f}), "00ab7f");
  EXPECT_THROW(hex_to_bytes("abc", 2), Error);
  try {
    hex_to_bytes("0g", 1);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("character 1 'g' is not a hex digit"), std::string::npos) << e.what();
  }
}

TEST(Bootstrap, FileExchangeGivesEveryRankRankZerosId) {
  const auto dir = std::filesystem::temp_directory_path() /
                   ("fp4moe_dist_boot_" + std::to_string(testing::test_seed()) + "_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const std::string path = (dir / "id").string();
  std::mt19937_64 rng(testing::test_seed() + 7);
  std::vector<uint8_t> made(128);
  for (auto& b : made) b = static_cast<uint8_t>(rng());
  std::vector<std::future<std::vector<uint8_t>>> got;
  for (int r = 3; r >= 0; --r) {  // the others start polling before rank 0 writes
    got.push_back(std::async(std::launch::async, [&, r] {
      if (r == 0) std::this_thread::sleep_for(50ms);
      return exchange_id_via_file(r, path, 128, 5000ms, [&] { return made; });
    }));
  }
  for (auto& f : got) EXPECT_EQ(f.get(), made);
  // No rank 0: the others give up after the timeout, naming the path.
  try {
    exchange_id_via_file(1, (dir / "never").string(), 128, 100ms, [] { return std::vector<uint8_t>(128); });
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("rank 1: no communicator id in " + (dir / "never").string() + " after 100 ms"),
              std::string::npos)
        << e.what();
  }
  std::filesystem::remove_all(dir);
}

TEST(Bootstrap, EnvironmentTakesPrecedence) {
  std::vector<uint8_t> id(128, 0x5a);
  ::setenv(kNcclIdEnv, bytes_to_hex(id).c_str(), 1);
  EXPECT_EQ(bootstrap_id(3, "", 128, 10ms, [] { return std::vector<uint8_t>(128, 0); }), id);
  ::unsetenv(kNcclIdEnv);
  EXPECT_THROW(bootstrap_id(3, "", 128, 10ms, [] { return std::vector<uint8_t>(128, 0); }), Error);
}

}  // namespace
}  // namespace fp4moe::dist
