// The communicator groups each process makes its members of (runtime/parallel_groups.h):
// GPU stages across nodes create one NCCL communicator a group from node 0's ids, every
// process for its own ranks. What must hold for that to work on any cluster shape: every
// rank of every group is made by exactly one process, as one contiguous range a process
// (make_nccl_comms takes ranks [first, first + n)), each on the right local GPU, links from
// each stage's rank t to the next stage's (the last back to stage 0), and every process
// walking the groups in the same order (a creation waits for the other processes' members).
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <vector>

#include "runtime/parallel_groups.h"

namespace moonrun {
namespace {

void check_world(int tp, int pp, int nodes) {
  SCOPED_TRACE("tp " + std::to_string(tp) + " pp " + std::to_string(pp) + " nodes " + std::to_string(nodes));
  const int world = tp * pp, local = world / nodes;
  std::map<int, std::vector<int>> ranks_of;  // group -> every process's group ranks
  std::map<int, int> size_of;
  for (int node = 0; node < nodes; ++node) {
    const int first = node * local;
    const std::vector<ProcessGroup> groups = process_groups(tp, pp, first, local);
    int last = -1;
    for (const ProcessGroup& g : groups) {
      EXPECT_GT(g.group, last) << "groups out of order on node " << node;
      last = g.group;
      ASSERT_FALSE(g.members.empty());
      EXPECT_LT(g.group, num_parallel_groups(tp, pp));
      size_of[g.group] = g.size;
      for (size_t i = 0; i < g.members.size(); ++i) {
        const GroupMember& m = g.members[i];
        EXPECT_EQ(m.group_rank, g.members[0].group_rank + static_cast<int>(i)) << "ranks not contiguous";
        ASSERT_GE(m.local, 0);
        ASSERT_LT(m.local, local);
        const int global = first + m.local;
        if (!g.link) {
          EXPECT_EQ(g.group, global / tp) << "a stage group holds its stage's ranks";
          EXPECT_EQ(m.group_rank, global % tp);
        } else {
          const int s = (g.group - pp) / tp, t = (g.group - pp) % tp;
          const int from = s * tp + t, to = (s + 1) % pp * tp + t;
          EXPECT_EQ(global, m.group_rank == 0 ? from : to) << "link " << g.group;
        }
        ranks_of[g.group].push_back(m.group_rank);
      }
    }
  }
  // Every group whole: each rank made once, by one process.
  EXPECT_EQ(static_cast<int>(ranks_of.size()), (tp > 1 ? pp : 0) + (pp > 1 ? pp * tp : 0));
  for (auto& [group, ranks] : ranks_of) {
    std::sort(ranks.begin(), ranks.end());
    std::vector<int> want(static_cast<size_t>(size_of[group]));
    for (int r = 0; r < size_of[group]; ++r) want[static_cast<size_t>(r)] = r;
    EXPECT_EQ(ranks, want) << "group " << group;
  }
}

TEST(ParallelGroups, EveryGroupIsMadeWholeOnceInOneOrder) {
  check_world(8, 2, 2);   // the plan of issue 41: a stage a node
  check_world(8, 4, 4);   // 32 x H100 over four nodes
  check_world(16, 2, 4);  // a stage over two nodes
  check_world(4, 2, 1);   // one process holds it all
  check_world(1, 3, 3);   // no tensor parallelism: links only
  check_world(2, 4, 2);   // two stages a node: links inside and across
}

// The shape the runtime relies on: two nodes of TP 8 x PP 2, node 1's view.
TEST(ParallelGroups, NodeOneOfTwoStages) {
  const std::vector<ProcessGroup> g = process_groups(8, 2, 8, 8);
  ASSERT_EQ(g.size(), 1u + 8u + 8u);
  EXPECT_EQ(g[0].group, 1);  // its stage
  EXPECT_FALSE(g[0].link);
  EXPECT_EQ(g[0].members.size(), 8u);
  for (int t = 0; t < 8; ++t) {
    const ProcessGroup& in = g[1 + t];  // stage 0 -> 1: node 1 receives
    EXPECT_EQ(in.group, 2 + t);
    ASSERT_EQ(in.members.size(), 1u);
    EXPECT_EQ(in.members[0].group_rank, 1);
    EXPECT_EQ(in.members[0].local, t);
    const ProcessGroup& back = g[9 + t];  // stage 1 -> 0 (the ring): node 1 sends
    EXPECT_EQ(back.group, 10 + t);
    EXPECT_EQ(back.members[0].group_rank, 0);
    EXPECT_EQ(back.members[0].local, t);
  }
  EXPECT_EQ(num_parallel_groups(8, 2), 18);
  EXPECT_EQ(num_parallel_groups(8, 1), 1);
}

}  // namespace
}  // namespace moonrun
