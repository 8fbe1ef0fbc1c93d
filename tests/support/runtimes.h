#pragma once
// A runtime (runtime/runtime_builder.h) for the tests: backend + model + pools for a
// checkpoint, without the startup log.
#include <gtest/gtest.h>

#include <string>

#include "runtime/runtime_builder.h"

namespace moonrun::testing {

inline RuntimeOptions test_runtime_options(const std::string& device, int64_t max_total_tokens, int max_running = 1) {
  RuntimeOptions ro;
  ro.device = device;
  ro.max_running_requests = max_running;
  ro.max_total_tokens = max_total_tokens;
  ro.prefix_cache = false;
  ro.log = false;
  return ro;
}

// The runtime, or a failed assertion and an empty runner.
inline Runtime make_runtime(const std::string& dir, const RuntimeOptions& ro) {
  auto rt = build_runtime(dir, ro);
  EXPECT_TRUE(rt.is_ok()) << dir << ": " << rt.status().to_string();
  return rt.is_ok() ? std::move(rt).value() : Runtime{};
}

}  // namespace moonrun::testing
