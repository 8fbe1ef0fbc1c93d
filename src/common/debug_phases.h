#pragma once
// MOONRUN_DEBUG_STEP_PHASES=1: where the time of a repeated piece of work goes, phase by phase,
// logged as microseconds a call every 200 calls. For finding a step's cost on the device
// machine, where no timeline profiler is installed: the caller synchronises the device at
// each mark (sync below), so a phase's time is its host work plus its device work. Off (the
// default), every call is a branch on a bool and nothing is synchronised.
//
//   static DebugPhases phases("draft pass", {"batch", "graph", "download"});
//   phases.start();  ...  phases.mark(0, sync);  ...  phases.mark(1, sync);  ...  phases.done();
#include <chrono>
#include <cstdlib>
#include <functional>
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
  void mark(size_t i, const std::function<void()>& sync) {
    if (!on_) return;
    sync();
    const double t = now();
    seconds_[i] += t - last_;
    last_ = t;
  }
  void done() {
    if (!on_ || ++calls_ < 200) return;
    std::ostringstream line;
    line << what_ << " phases over " << calls_ << " calls, us a call:";
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
