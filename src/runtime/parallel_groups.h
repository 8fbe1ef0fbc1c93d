#pragma once
// The communicator groups of a TP x PP world as one process sees them: which groups it
// has members in, and which of its local ranks they are. The numbering is
// RuntimeOptions::make_comm's: group s < pp is stage s's tensor-parallel group (ranks
// [s * tp, (s + 1) * tp)); group pp + s * tp + t is the ring link from stage s's rank t to
// the next stage's rank t (the last stage's back to stage 0's, model/pipeline.h). A link's
// rank 0 is its sender here (NCCL links; CPU links number theirs by hub, runtime_builder.cpp).
// Used where each process makes its own members of groups that span processes (GPU stages
// across nodes: one NCCL id a group from node 0): every process walks the same list in the
// same order, so a creation that waits for the other processes' members cannot deadlock.
#include <vector>

namespace moonrun {

struct GroupMember {
  int group_rank = 0;  // its rank in the group
  int local = 0;       // this process's local rank index (its GPU: cuda_device + local)
};

struct ProcessGroup {
  int group = 0;
  int size = 0;
  bool link = false;                 // a ring link (else a stage's tensor-parallel group)
  std::vector<GroupMember> members;  // this process's, by group rank (contiguous ranks)
};

// The groups with a member among global ranks [first_rank, first_rank + local), in group
// order. Stage groups only at tp > 1 (one rank needs no collectives); links only at pp > 1.
std::vector<ProcessGroup> process_groups(int tp, int pp, int first_rank, int local);

// How many groups the numbering has (ids node 0 makes): pp + pp * tp at pp > 1, else 1.
int num_parallel_groups(int tp, int pp);

}  // namespace moonrun
