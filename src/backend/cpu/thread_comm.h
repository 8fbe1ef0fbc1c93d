#pragma once
// Ranks as threads of one process: the in-process communicator the CPU backend uses for
// tensor and expert parallelism (and what the tests use to check TP/EP against one rank
// without GPUs). Collectives meet at a generation-counted barrier; each rank publishes a
// pointer to its buffer and reads the others' directly (shared memory, no copies in).
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "backend/comm.h"

namespace moonrun::cpu {

// The shared state of one group; make_thread_group hands out its size() communicators.
class ThreadGroup;

std::vector<std::unique_ptr<Communicator>> make_thread_group(int size);

}  // namespace moonrun::cpu
