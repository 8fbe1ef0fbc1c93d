// The in-process communicator: sums and gathers as a group of threads would compute them
// by hand, the same bits on every rank, and an abort that wakes a rank waiting for a peer
// that will never come.
#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "backend/cpu/cpu_ops.h"
#include "backend/cpu/thread_comm.h"
#include "backend/ops.h"

namespace moonrun::cpu {
namespace {

std::vector<float> rank_values(int rank, size_t n) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = 0.1f * static_cast<float>(rank + 1) + 1e-3f * static_cast<float>(i) - 0.37f;
  return v;
}

TEST(ThreadComm, AllReduceIsTheRankOrderSumOnEveryRank) {
  for (int W : {1, 2, 3, 4}) {
    auto comms = make_thread_group(W);
    const size_t n = 1000;
    std::vector<std::vector<float>> data(W);
    std::vector<std::thread> threads;
    for (int r = 0; r < W; ++r) {
      data[r] = rank_values(r, n);
      threads.emplace_back([&, r] {
        for (int rep = 0; rep < 3; ++rep) {  // collectives back to back reuse the group
          std::vector<float> v = rank_values(r, n);
          comms[r]->all_reduce_sum(v.data(), n);
          if (rep == 2) data[r] = v;
        }
      });
    }
    for (auto& t : threads) t.join();
    for (size_t i = 0; i < n; ++i) {
      float want = rank_values(0, n)[i];
      for (int r = 1; r < W; ++r) want += rank_values(r, n)[i];
      for (int r = 0; r < W; ++r) ASSERT_EQ(data[r][i], want) << "W=" << W << " rank " << r << " element " << i;
    }
  }
}

TEST(ThreadComm, AllGatherColsInterleavesRanksByColumnBlock) {
  const int W = 3, rows = 4, cols = 5;
  auto comms = make_thread_group(W);
  std::vector<std::unique_ptr<CpuOps>> ops;
  for (int r = 0; r < W; ++r) ops.push_back(std::make_unique<CpuOps>(std::move(comms[r])));
  std::vector<std::vector<float>> got(W);
  std::vector<std::thread> threads;
  for (int r = 0; r < W; ++r) {
    threads.emplace_back([&, r] {
      CpuOps& o = *ops[r];
      Tensor x = o.alloc(rows, cols, DType::F32, "x"), y = o.alloc(rows, W * cols, DType::F32, "y");
      for (int i = 0; i < rows * cols; ++i) x.as<float>()[i] = static_cast<float>(100 * r + i);
      o.all_gather_cols(x, y);
      got[r].assign(y.as<float>(), y.as<float>() + rows * W * cols);
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < W; ++r)
    for (int i = 0; i < rows; ++i)
      for (int s = 0; s < W; ++s)
        for (int c = 0; c < cols; ++c)
          ASSERT_EQ(got[r][i * W * cols + s * cols + c], static_cast<float>(100 * s + i * cols + c));
}

// Two blocks side by side in one buffer, gathered in one collective: each output as
// all_gather_cols gives it for its block alone (the split router's logits and the split
// LatentMoE rows, model/layers/moe.cpp).
TEST(ThreadComm, PackedGatherEqualsOneGatherAPart) {
  const int W = 3, rows = 2, c0 = 4, c1 = 3;
  auto comms = make_thread_group(W);
  std::vector<std::unique_ptr<CpuOps>> ops;
  for (int r = 0; r < W; ++r) ops.push_back(std::make_unique<CpuOps>(std::move(comms[r])));
  std::vector<std::vector<float>> packed(W), apart(W);
  std::vector<std::thread> threads;
  for (int r = 0; r < W; ++r) {
    threads.emplace_back([&, r] {
      CpuOps& o = *ops[r];
      Tensor buf = o.alloc(1, rows * (c0 + c1), DType::F32, "parts");
      for (int i = 0; i < rows * (c0 + c1); ++i) buf.as<float>()[i] = static_cast<float>(1000 * r + i);
      const Tensor parts[] = {Tensor{buf.data, DType::F32, rows, c0},
                              Tensor{buf.as<float>() + rows * c0, DType::F32, rows, c1}};
      Tensor outs[] = {o.alloc(rows, W * c0, DType::F32, "y0"), o.alloc(rows, W * c1, DType::F32, "y1")};
      o.all_gather_cols_packed(parts, outs);
      for (const Tensor& y : outs) packed[r].insert(packed[r].end(), y.as<float>(), y.as<float>() + y.numel());
      Tensor sep[] = {o.alloc(rows, W * c0, DType::F32, "z0"), o.alloc(rows, W * c1, DType::F32, "z1")};
      for (int i = 0; i < 2; ++i) o.all_gather_cols(parts[i], sep[i]);
      for (const Tensor& y : sep) apart[r].insert(apart[r].end(), y.as<float>(), y.as<float>() + y.numel());
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < W; ++r) {
    ASSERT_EQ(packed[r].size(), size_t(rows * W * (c0 + c1)));
    EXPECT_EQ(packed[r], apart[r]) << "rank " << r;
    // Rank s's second block, row 1, column 0 sits in y1 at row 1, column s * c1.
    for (int s = 0; s < W; ++s)
      EXPECT_EQ(packed[r][rows * W * c0 + 1 * W * c1 + s * c1], static_cast<float>(1000 * s + rows * c0 + c1));
  }
}

TEST(ThreadComm, AbortWakesARankWaitingForAPeer) {
  auto comms = make_thread_group(2);
  std::atomic<bool> threw{false};
  std::thread waiter([&] {
    std::vector<float> v(8, 1.0f);
    try {
      comms[0]->all_reduce_sum(v.data(), v.size());  // rank 1 never comes
    } catch (const BackendError& e) {
      threw = std::string(e.what()).find("rank 1 failed") != std::string::npos;
    }
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  comms[1]->abort("rank 1 failed");
  waiter.join();
  EXPECT_TRUE(threw);
  // Later collectives fail at once rather than wait.
  std::vector<float> v(8, 1.0f);
  EXPECT_THROW(comms[0]->all_reduce_sum(v.data(), v.size()), BackendError);
}

}  // namespace
}  // namespace moonrun::cpu
