#pragma once
// MOONRUN_DEBUG_STEP_PHASES=1: where the time of a repeated piece of work goes, phase by phase,
// logged as microseconds a call every 200 calls (and, with done(true), when the work falls
// idle after at least 8: one request's steps, run alone). For finding a step's cost on the
// device machine, where no timeline profiler is installed: a caller on the device side
// passes its synchronisation to mark, so a phase's time is its host work plus its device
// work; the engine's own phases are host time. Off (the default), every call is a branch on
// a bool and nothing is synchronised.
//
//   static DebugPhases phases("draft pass", {"batch", "graph", "download"});
//   phases.start();  ...  phases.mark(0, sync);  ...  phases.mark(1, sync);  ...  phases.done();
#include <chrono>
#include <cstdlib>
#include <initializer_list>
#include <sstream>
#include <string>
#include <vector>

#include "common/log.h"

namespace moonrun {

class DebugPhases {
 public:
  DebugPhases(std::string what, std::initializer_list<const char*> names)
      : what_(std::move(what)), names_(names), seconds_(names.size(), 0.0) {}

  bool on() const { return on_; }
  void start() {
    if (on_) last_ = now();
  }
  // Phase `i` ends here; `sync` (the device's synchronisation) runs first.
  template <typename Sync>
  void mark(size_t i, const Sync& sync) {
    if (!on_) return;
    sync();
    mark(i);
  }
  void mark(size_t i) {
    if (!on_) return;
    const double t = now();
    seconds_[i] += t - last_;
    last_ = t;
  }
  // A call ends; `idle`: nothing follows it for now (reports after 8 calls, not 200).
  void done(bool idle = false) {
    if (!on_) return;
    if (++calls_ < 200 && !(idle && calls_ >= 8)) return;
    std::ostringstream line;
    line << what_ << " phases over " << calls_ << " calls" << (idle ? " (then idle)" : "") << ", us a call:";
    for (size_t i = 0; i < names_.size(); ++i) line << " " << names_[i] << " " << seconds_[i] * 1e6 / calls_;
    MR_LOG(INFO) << line.str();
    calls_ = 0;
    seconds_.assign(names_.size(), 0.0);
  }

 private:
  static double now() {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
  }
  bool on_ = std::getenv("MOONRUN_DEBUG_STEP_PHASES") != nullptr;
  std::string what_;
  std::vector<const char*> names_;
  std::vector<double> seconds_;
  double last_ = 0;
  int64_t calls_ = 0;
};

}  // namespace moonrun
