#pragma once
// Invariant checks: MR_CHECK(cond) << "context"; aborts with file:line when cond is false.
// For programmer errors and broken invariants only. Bad input from users or files is a
// request error: return a Status (common/status.h) instead.
#include <cstdlib>
#include <sstream>
#include <string>

namespace moonrun {

class CheckFailure {
 public:
  CheckFailure(const char* file, int line, const char* expr) {
    stream_ << file << ":" << line << ": check failed: " << expr << " ";
  }
  [[noreturn]] ~CheckFailure();
  template <typename T>
  CheckFailure& operator<<(const T& v) {
    stream_ << v;
    return *this;
  }

 private:
  std::ostringstream stream_;
};

}  // namespace moonrun

#define MR_CHECK(cond) \
  if (__builtin_expect(!!(cond), 1)) {} else ::moonrun::CheckFailure(__FILE__, __LINE__, #cond)

#define MR_CHECK_EQ(a, b) MR_CHECK((a) == (b)) << "(" << (a) << " vs " << (b) << ") "
#define MR_CHECK_LT(a, b) MR_CHECK((a) < (b)) << "(" << (a) << " vs " << (b) << ") "
#define MR_CHECK_LE(a, b) MR_CHECK((a) <= (b)) << "(" << (a) << " vs " << (b) << ") "
