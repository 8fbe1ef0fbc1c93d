// `moonrun verify`: the checks of verify.h, in the order a person would do them by hand.
#include "tools/verify.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <set>
#include <sstream>
#include <thread>

#include <nlohmann/json.hpp>

#include "model/checkpoint.h"
#include "model/config.h"
#include "model/weight_spec.h"

namespace moonrun {

namespace fs = std::filesystem;

namespace {

constexpr const char* kIndexName = "model.safetensors.index.json";
constexpr size_t kMaxProblemsShown = 40;

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

bool is_lower_hex(const std::string& s, size_t len) {
  if (s.size() != len) return false;
  for (char c : s)
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  return true;
}

std::string fixed2(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.2f", v);
  return buf;
}

// A snapshot directory inside an HF cache: HUB/models--ORG--NAME/snapshots/COMMIT.
// Returns the models--ORG--NAME folder, or "" for a plain directory.
std::string hf_repo_dir_of(const std::string& snapshot_dir, std::string* repo_id) {
  std::error_code ec;
  fs::path p = fs::weakly_canonical(fs::absolute(snapshot_dir, ec), ec);
  if (ec || p.parent_path().filename() != "snapshots") return "";
  fs::path repo = p.parent_path().parent_path();
  std::string name = repo.filename().string();
  if (name.rfind("models--", 0) != 0) return "";
  std::string rest = name.substr(8);
  size_t sep = rest.find("--");
  if (repo_id != nullptr && sep != std::string::npos)
    *repo_id = rest.substr(0, sep) + "/" + rest.substr(sep + 2);
  return repo.string();
}

struct Shard {
  std::string name;  // relative to the snapshot
  std::string path;
  bool present = false;
  bool header_ok = false;
  uint64_t size_bytes = 0;
};

struct TensorSeen {
  DType dtype;
  std::vector<int64_t> shape;
  const Shard* shard;
};

// Hashing progress on stderr: bytes, GB/s, ETA. A live line on a terminal, a line every
// ten seconds otherwise (logs of a detached run stay readable).
class Progress {
 public:
  Progress(std::FILE* out, uint64_t total_bytes) : out_(out), total_(total_bytes) {
    if (out_ == nullptr || total_ < (1ull << 30)) return;  // small jobs finish before a line matters
    tty_ = ::isatty(::fileno(out_)) != 0;
    start_ = std::chrono::steady_clock::now();
    thread_ = std::thread([this] { loop(); });
  }
  ~Progress() {
    if (!thread_.joinable()) return;
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
    print();
    if (tty_) std::fputc('\n', out_);
  }
  void add(uint64_t bytes) { done_ += bytes; }
  static void add_cb(uint64_t bytes, void* self) { static_cast<Progress*>(self)->add(bytes); }

 private:
  void loop() {
    const auto period = std::chrono::seconds(tty_ ? 1 : 10);
    std::unique_lock<std::mutex> lock(mu_);
    while (!cv_.wait_for(lock, period, [this] { return stop_; })) print();
  }
  void print() {
    const double secs =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
    const uint64_t done = done_.load();
    const double gbps = secs > 0 ? done / 1e9 / secs : 0.0;
    std::string eta = "--";
    if (gbps > 0 && done < total_) {
      uint64_t s = static_cast<uint64_t>((total_ - done) / 1e9 / gbps);
      char buf[32];
      if (s >= 3600) std::snprintf(buf, sizeof buf, "%lluh%02llum", (unsigned long long)(s / 3600), (unsigned long long)(s / 60 % 60));
      else if (s >= 60) std::snprintf(buf, sizeof buf, "%llum%02llus", (unsigned long long)(s / 60), (unsigned long long)(s % 60));
      else std::snprintf(buf, sizeof buf, "%llus", (unsigned long long)s);
      eta = buf;
    } else if (done >= total_) {
      eta = "0s";
    }
    std::fprintf(out_, "%shashing: %s / %s GB (%.1f%%)  %.2f GB/s  ETA %s%s", tty_ ? "\r" : "",
                 fixed2(done / 1e9).c_str(), fixed2(total_ / 1e9).c_str(),
                 total_ ? 100.0 * done / total_ : 100.0, gbps, eta.c_str(), tty_ ? "   " : "\n");
    std::fflush(out_);
  }

  std::FILE* out_;
  uint64_t total_;
  bool tty_ = false;
  std::atomic<uint64_t> done_{0};
  std::chrono::steady_clock::time_point start_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::thread thread_;
};

// The manifest: the index's shards (and its name -> shard map), or without an index the
// directory's *.safetensors files.
void read_manifest(VerifyReport& r, std::vector<Shard>& shards,
                   std::vector<std::pair<std::string, std::string>>& weight_map) {
  std::error_code ec;
  const std::string index_path = r.snapshot_dir + "/" + kIndexName;
  bool have_index = false;
  if (fs::exists(index_path, ec)) {
    std::ifstream in(index_path, std::ios::binary);
    std::stringstream ss;
    ss << in.rdbuf();
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(ss.str());
    } catch (const nlohmann::json::exception& e) {
      r.problems.push_back(std::string(kIndexName) + ": not valid JSON: " + e.what());
    }
    if (j.is_object() && j.contains("weight_map") && j["weight_map"].is_object()) {
      have_index = true;
      std::set<std::string> seen;
      for (auto it = j["weight_map"].begin(); it != j["weight_map"].end(); ++it) {
        if (!it.value().is_string()) {
          r.problems.push_back(std::string(kIndexName) + ": weight_map entry for \"" + it.key() +
                               "\" is not a file name");
          continue;
        }
        const std::string shard = it.value().get<std::string>();
        weight_map.emplace_back(it.key(), shard);
        if (seen.insert(shard).second) shards.push_back({shard, r.snapshot_dir + "/" + shard});
      }
    } else if (!j.is_null()) {
      r.problems.push_back(std::string(kIndexName) + ": no \"weight_map\" object");
    }
  }
  if (!have_index) {
    for (const auto& e : fs::directory_iterator(r.snapshot_dir, ec)) {
      const std::string name = e.path().filename().string();
      if (ends_with(name, ".safetensors")) shards.push_back({name, e.path().string()});
    }
    std::sort(shards.begin(), shards.end(), [](const Shard& a, const Shard& b) { return a.name < b.name; });
    if (shards.empty())
      r.problems.push_back(r.snapshot_dir + ": no " + kIndexName + " and no *.safetensors files");
  }
}

void check_config(VerifyReport& r, const std::map<std::string, TensorSeen>& seen, bool all_shards_read) {
  const std::string path = r.snapshot_dir + "/config.json";
  std::error_code ec;
  r.config_present = fs::exists(path, ec);
  if (!r.config_present) {
    r.problems.push_back("config.json: missing");
    r.config_check = "skipped (no config.json)";
    return;
  }
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(ss.str());
  } catch (const nlohmann::json::exception& e) {
    r.problems.push_back("config.json: not valid JSON: " + std::string(e.what()));
    r.config_check = "skipped (config.json is not valid JSON)";
    return;
  }
  const std::string model_type = j.is_object() && j.contains("model_type") && j["model_type"].is_string()
                                     ? j["model_type"].get<std::string>()
                                     : "";
  if (model_type != "kimi_k3" && model_type != "kimi_linear") {
    // Not a model moonrun runs: the download can still be complete; say what was not checked.
    r.config_check = "skipped (model_type \"" + model_type + "\" is not kimi_k3 or kimi_linear)";
    return;
  }
  auto cfg = parse_model_config(j, path);
  if (!cfg) {
    r.problems.push_back(cfg.status().message());
    r.config_check = "failed (config.json does not validate)";
    return;
  }
  const std::vector<TensorSpec> expected = weight_spec(*cfg);
  size_t matched = 0, unknown = 0;
  for (const auto& want : expected) {
    auto it = seen.find(want.name);
    if (it == seen.end()) {
      // A tensor of an unreadable or missing shard is already reported through its shard.
      if (all_shards_read)
        r.problems.push_back("tensor " + want.name + " (expected from config.json) is in no shard");
      else
        ++unknown;
      continue;
    }
    const TensorSeen& got = it->second;
    if (got.dtype != want.dtype || (got.shape != want.shape && !is_alternative_shape(want, got.shape))) {
      r.problems.push_back(got.shard->name + ": tensor " + want.name + " has dtype " +
                           dtype_name(got.dtype) + " and shape " + shape_to_string(got.shape) +
                           ", expected " + dtype_name(want.dtype) + " " + shape_to_string(want.shape) +
                           " (from config.json)");
      continue;
    }
    ++matched;
  }
  r.config_check = with_thousands_separators(matched) + "/" + with_thousands_separators(expected.size()) +
                   " tensors match config.json (" + model_type + ")";
  if (unknown) r.config_check += ", " + with_thousands_separators(unknown) + " not checked (shards unreadable)";
}

void find_incomplete(VerifyReport& r) {
  std::error_code ec;
  std::vector<std::string> leftovers;
  for (const auto& e : fs::directory_iterator(r.snapshot_dir, ec))
    if (ends_with(e.path().filename().string(), ".incomplete")) leftovers.push_back(e.path().string());
  if (!r.repo_dir.empty())
    for (const auto& e : fs::directory_iterator(r.repo_dir + "/blobs", ec))
      if (ends_with(e.path().filename().string(), ".incomplete")) leftovers.push_back(e.path().string());
  std::sort(leftovers.begin(), leftovers.end());
  r.incomplete_files = static_cast<int>(leftovers.size());
  for (const auto& p : leftovers) r.problems.push_back(p + ": unfinished download (.incomplete)");
}

// --hash: every snapshot file that is a link into blobs/ is hashed and compared with the
// blob's name. 64 hex digits: an LFS file, named by SHA-256; 40: a git blob id (SHA-1).
void check_hashes(VerifyReport& r, const VerifyOptions& opt) {
  r.hashed = true;
  if (r.repo_dir.empty()) {
    r.hash_note = "skipped (" + r.snapshot_dir + " is not an HF cache snapshot: no content addresses to compare)";
    return;
  }
  struct Job {
    std::string rel;   // name in the snapshot, for messages
    std::string blob;  // canonical blob path
    std::string address;
    bool sha256;
    uint64_t size;
  };
  std::vector<Job> jobs;
  std::set<std::string> blobs_seen;
  std::error_code ec;
  const fs::path blobs_dir = fs::weakly_canonical(r.repo_dir + "/blobs", ec);
  uint64_t total = 0;
  int not_addressed = 0;
  for (auto it = fs::recursive_directory_iterator(r.snapshot_dir, ec); it != fs::recursive_directory_iterator();
       it.increment(ec)) {
    if (ec) break;
    if (!it->is_regular_file(ec)) continue;  // follows the link; dangling links are reported elsewhere
    const std::string rel = it->path().lexically_relative(r.snapshot_dir).string();
    fs::path target = fs::canonical(it->path(), ec);
    if (ec || target.parent_path() != blobs_dir) {
      ++not_addressed;
      continue;
    }
    const std::string address = target.filename().string();
    const bool sha256 = is_lower_hex(address, 64);
    if (!sha256 && !is_lower_hex(address, 40)) {
      ++not_addressed;
      continue;
    }
    if (!blobs_seen.insert(target.string()).second) continue;
    uint64_t size = fs::file_size(target, ec);
    total += size;
    jobs.push_back({rel, target.string(), address, sha256, size});
  }
  // Biggest first: the long files start early and the pool drains evenly.
  std::sort(jobs.begin(), jobs.end(), [](const Job& a, const Job& b) { return a.size > b.size; });

  std::vector<std::string> results(jobs.size());  // "" = match, else the problem
  std::atomic<size_t> next{0};
  {
    Progress progress(opt.progress, total);
    auto worker = [&] {
      for (size_t i = next++; i < jobs.size(); i = next++) {
        const Job& j = jobs[i];
        auto h = hash_file(j.blob, j.sha256, !j.sha256, &Progress::add_cb, &progress);
        if (!h) {
          results[i] = j.rel + ": " + h.status().message();
          continue;
        }
        const std::string& got = j.sha256 ? h->sha256_hex : h->git_sha1_hex;
        if (got != j.address)
          results[i] = j.rel + ": " + (j.sha256 ? "sha256 " : "git blob sha1 ") + got +
                       " differs from its content address blobs/" + j.address + " (corrupt)";
      }
    };
    const int n_threads = std::max(1, std::min<int>(opt.hash_threads, static_cast<int>(jobs.size())));
    std::vector<std::thread> pool;
    for (int t = 1; t < n_threads; ++t) pool.emplace_back(worker);
    worker();
    for (auto& t : pool) t.join();
  }
  r.hash_checked = static_cast<int>(jobs.size());
  for (const auto& res : results) {
    if (res.empty()) ++r.hash_matched;
    else r.problems.push_back(res);
  }
  if (not_addressed) r.hash_note = std::to_string(not_addressed) + " file(s) not stored as blobs, not hashed";
}

}  // namespace

std::string with_thousands_separators(uint64_t n) {
  std::string digits = std::to_string(n);
  std::string out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return out;
}

Result<VerifyReport> verify_checkpoint(const VerifyOptions& opt) {
  VerifyReport r;
  std::error_code ec;
  if (fs::is_directory(opt.model, ec)) {
    r.snapshot_dir = opt.model;
    while (r.snapshot_dir.size() > 1 && r.snapshot_dir.back() == '/') r.snapshot_dir.pop_back();
    r.repo = opt.model;
    r.repo_dir = hf_repo_dir_of(r.snapshot_dir, &r.repo);
  } else if (looks_like_repo_id(opt.model)) {
    auto loc = resolve_hf_cache(opt.model);
    if (!loc) return loc.status();
    r.repo = loc->repo_id;
    r.snapshot_dir = loc->snapshot_dir;
    r.repo_dir = loc->repo_dir;
  } else {
    auto p = resolve_model_path(opt.model);  // for its error message
    if (!p) return p.status();
    return invalid_argument(opt.model + ": not a directory");
  }

  std::vector<Shard> shards;
  std::vector<std::pair<std::string, std::string>> weight_map;
  read_manifest(r, shards, weight_map);
  r.shards_expected = static_cast<int>(shards.size());

  // Presence and headers.
  std::map<std::string, TensorSeen> seen;
  std::map<std::string, std::set<std::string>> names_by_shard;
  for (auto& s : shards) {
    if (!fs::exists(s.path, ec)) {
      std::string why = "missing";
      if (fs::is_symlink(fs::symlink_status(s.path, ec)))
        why += " (dangling link to " + fs::read_symlink(s.path, ec).string() + ")";
      r.problems.push_back(s.name + ": " + why);
      continue;
    }
    s.present = true;
    s.size_bytes = fs::file_size(s.path, ec);
    ++r.shards_present;
    r.total_bytes += s.size_bytes;
    auto h = read_safetensors_header(s.path);
    if (!h) {
      r.problems.push_back(h.status().message());
      continue;
    }
    s.header_ok = true;
    ++r.headers_ok;
    r.tensors_in_headers += h->tensors.size();
    auto& names = names_by_shard[s.name];
    for (auto& t : h->tensors) {
      names.insert(t.name);
      seen.emplace(t.name, TensorSeen{t.dtype, std::move(t.shape), &s});
    }
  }
  const bool all_shards_read = r.headers_ok == r.shards_expected && r.shards_expected > 0;

  // The index against the headers.
  for (const auto& [tensor, shard] : weight_map) {
    auto it = names_by_shard.find(shard);
    if (it == names_by_shard.end()) continue;  // shard missing or unreadable: reported above
    if (!it->second.count(tensor))
      r.problems.push_back(std::string(kIndexName) + ": tensor " + tensor + " is listed in " + shard +
                           " but " + shard + " does not contain it");
  }

  check_config(r, seen, all_shards_read);
  find_incomplete(r);
  if (opt.hash) check_hashes(r, opt);
  return r;
}

std::string format_verify_report(const VerifyReport& r) {
  std::ostringstream o;
  o << "repo             : " << r.repo << "\n";
  o << "snapshot dir     : " << r.snapshot_dir << "\n";
  o << "safetensors      : " << r.shards_present << "/" << r.shards_expected << " present\n";
  o << "total bytes      : " << with_thousands_separators(r.total_bytes) << " ("
    << fixed2(r.total_bytes / 1e9) << " GB)\n";
  o << "config.json      : " << (r.config_present ? "OK" : "MISSING") << "\n";
  o << ".incomplete files: " << r.incomplete_files << "\n";
  o << "headers          : " << r.headers_ok << "/" << r.shards_present << " parse, "
    << with_thousands_separators(r.tensors_in_headers) << " tensors inside their files\n";
  o << "config check     : " << r.config_check << "\n";
  if (r.hashed) {
    o << "content hashes   : ";
    if (r.hash_note.rfind("skipped", 0) == 0) o << r.hash_note << "\n";
    else {
      o << r.hash_matched << "/" << r.hash_checked << " blobs match";
      if (!r.hash_note.empty()) o << "; " << r.hash_note;
      o << "\n";
    }
  }
  if (!r.problems.empty()) {
    o << "problems         : " << r.problems.size() << "\n";
    for (size_t i = 0; i < r.problems.size() && i < kMaxProblemsShown; ++i) o << "  " << r.problems[i] << "\n";
    if (r.problems.size() > kMaxProblemsShown)
      o << "  ... and " << r.problems.size() - kMaxProblemsShown << " more\n";
  }
  o << "RESULT: " << (r.complete() ? "COMPLETE" : "INCOMPLETE") << "\n";
  return o.str();
}

}  // namespace moonrun
