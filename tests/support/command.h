#pragma once
// Runs a shell command line (a test driving the `moonrun` binary as a user would) and
// returns what it wrote to stdout and its exit status.
#include <sys/wait.h>

#include <cstdio>
#include <string>

namespace moonrun::testing {

struct CommandRun {
  int exit_code = -1;  // -1: it could not be started, or did not exit normally
  std::string out;
};

inline CommandRun run_command(const std::string& cmd) {
  CommandRun r;
  FILE* p = popen(cmd.c_str(), "r");
  if (p == nullptr) return r;
  char buf[4096];
  while (size_t n = fread(buf, 1, sizeof(buf), p)) r.out.append(buf, n);
  const int status = pclose(p);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

}  // namespace moonrun::testing
