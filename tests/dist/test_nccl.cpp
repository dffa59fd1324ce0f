// NcclCommunicator (dist/nccl_communicator.h) at world size 1 on one GPU: the whole NCCL path
// (unique id via the file bootstrap, non-blocking ncclCommInitRankConfig, each collective enqueued
// on the communicator's stream and polled to completion) with results checked on the host:
//  - all_reduce_sum of a device buffer (F32 and BF16) equals the input (one rank: sum of one);
//  - reduce_scatter_sum with one rank equals the input;
//  - all_gather copies the bytes;
//  - all_to_all_v (ncclGroupStart + ncclSend/ncclRecv to itself) copies the bytes, and a zero-byte
//    exchange completes;
//  - barrier returns; NCCL_NVLS_ENABLE is 0 after construction when it was unset;
//  - the communicator's describe() names rank, world and device; a bad unique-id size is refused.
// Every test skips with the reason (SKIP_WITHOUT_GPU) where no usable GPU is visible. Label: gpu.
// Run: build/tests/dist/test_nccl.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <random>
#include <vector>

#include "core/error.h"
#include "dist/bootstrap.h"
#include "dist/nccl_communicator.h"
#include "kernels/cuda_test_util.h"
#include "testing/testing.h"

namespace fp4moe::dist {
namespace {

using cuda::gpu_test::device_alloc;
using cuda::gpu_test::download;
using cuda::gpu_test::upload;

std::unique_ptr<NcclCommunicator> make_world_of_one() {
  const auto dir = std::filesystem::temp_directory_path() / ("fp4moe_nccl_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const auto id = bootstrap_id(0, (dir / "id").string(), sizeof(ncclUniqueId), std::chrono::seconds(10),
                               [] { return NcclCommunicator::new_unique_id(); });
  std::filesystem::remove_all(dir);
  return std::make_unique<NcclCommunicator>(1, 0, 0, id, /*timeout_s=*/60.0);
}

TEST(NcclWorldOne, CollectivesOnDeviceBuffers) {
  SKIP_WITHOUT_GPU();
  const bool nvls_was_set = std::getenv("NCCL_NVLS_ENABLE") != nullptr;
  auto comm = make_world_of_one();
  std::printf("NCCL %s, %s\n", NcclCommunicator::nccl_version().c_str(), comm->describe().c_str());
  if (!nvls_was_set) {
    EXPECT_STREQ(std::getenv("NCCL_NVLS_ENABLE"), "0");
  }
  EXPECT_EQ(comm->describe(), "nccl rank 0/1 (device 0)");
  EXPECT_TRUE(comm->buffers_on_device());

  std::mt19937_64 rng(testing::test_seed());
  std::uniform_real_distribution<float> u(-3.0f, 3.0f);
  std::vector<float> h(4099);
  for (auto& v : h) v = u(rng);

  auto d = upload(h);
  comm->all_reduce_sum(d.get(), static_cast<int64_t>(h.size()));
  EXPECT_EQ(download(d.get(), h.size()), h) << "all_reduce_sum F32 of one rank";

  std::vector<uint16_t> hb(h.size());
  for (size_t i = 0; i < h.size(); ++i) hb[i] = f32_to_bf16(h[i]);
  auto db = upload(hb);
  comm->all_reduce_sum_bf16(db.get(), static_cast<int64_t>(hb.size()));
  EXPECT_EQ(download(db.get(), hb.size()), hb) << "all_reduce_sum BF16 of one rank";

  auto rs = device_alloc<float>(h.size());
  comm->reduce_scatter_sum(d.get(), rs.get(), static_cast<int64_t>(h.size()));
  EXPECT_EQ(download(rs.get(), h.size()), h) << "reduce_scatter_sum of one rank";

  auto ag = device_alloc<float>(h.size());
  comm->all_gather(d.get(), ag.get(), static_cast<int64_t>(h.size() * 4));
  EXPECT_EQ(download(ag.get(), h.size()), h) << "all_gather of one rank";

  auto a2a = device_alloc<float>(h.size());
  const int64_t bytes = static_cast<int64_t>(h.size() * 4);
  comm->all_to_all_v(d.get(), &bytes, a2a.get(), &bytes);
  EXPECT_EQ(download(a2a.get(), h.size()), h) << "all_to_all_v to itself";
  const int64_t zero = 0;
  comm->all_to_all_v(d.get(), &zero, a2a.get(), &zero);  // nothing to move: must still complete

  comm->barrier();
  EXPECT_FALSE(comm->aborted());
}

TEST(NcclWorldOne, RefusesBadArguments) {
  SKIP_WITHOUT_GPU();
  EXPECT_THROW(NcclCommunicator(1, 0, 0, std::vector<uint8_t>(5)), Error);
  EXPECT_THROW(NcclCommunicator(2, 2, 0, NcclCommunicator::new_unique_id()), Error);
  auto comm = make_world_of_one();
  float* null_buf = nullptr;
  EXPECT_THROW(comm->all_reduce_sum(null_buf, -1), Error);
  EXPECT_THROW(comm->all_reduce_sum(null_buf, 4, DType::kI32), Error);
}

}  // namespace
}  // namespace fp4moe::dist
