#include "runtime/parallel_groups.h"

namespace moonrun {

int num_parallel_groups(int tp, int pp) { return pp > 1 ? pp + pp * tp : 1; }

std::vector<ProcessGroup> process_groups(int tp, int pp, int first_rank, int local) {
  std::vector<ProcessGroup> out;
  const auto is_local = [&](int g) { return g >= first_rank && g < first_rank + local; };
  if (tp > 1)
    for (int s = 0; s < pp; ++s) {
      ProcessGroup pg{s, tp, false, {}};
      for (int t = 0; t < tp; ++t)
        if (is_local(s * tp + t)) pg.members.push_back({t, s * tp + t - first_rank});
      if (!pg.members.empty()) out.push_back(pg);
    }
  if (pp > 1)
    for (int s = 0; s < pp; ++s)
      for (int t = 0; t < tp; ++t) {
        const int from = s * tp + t, to = (s + 1) % pp * tp + t;
        ProcessGroup pg{pp + s * tp + t, 2, true, {}};
        if (is_local(from)) pg.members.push_back({0, from - first_rank});
        if (is_local(to)) pg.members.push_back({1, to - first_rank});
        if (!pg.members.empty()) out.push_back(pg);
      }
  return out;
}

}  // namespace moonrun
