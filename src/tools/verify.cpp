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
#include "model/families.h"
#include "model/weight_spec.h"

namespace moonrun {

namespace fs = std::filesystem;

namespace {

constexpr const char* kManifestName = "moonrun-manifest.json";

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
    std::fprintf(out_, "%shashing: %s / %s (%.1f%%)  %.2f GB/s  ETA %s%s", tty_ ? "\r" : "",
                 human_bytes(done).c_str(), human_bytes(total_).c_str(),
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
  // The family table decides what this checkpoint is; a name it does not know is not a model
  // moonrun runs: the download can still be complete, so say what was not checked.
  auto family = find_model_family(j, path);
  if (!family) {
    r.config_check = "skipped (" + family.status().message() + ")";
    return;
  }
  auto cfg = parse_model_config(j, path);
  if (!cfg) {
    r.problems.push_back(cfg.status().message());
    r.config_check = "failed (config.json does not validate)";
    return;
  }
  const std::string model_type = cfg->model_type.empty() ? (*family)->name : cfg->model_type;
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

// --hash: each file is hashed and compared with a reference, from the first source that
// has one:
//   1. the HF cache: a snapshot file links to blobs/<content address> (64 hex digits: an
//      LFS file named by SHA-256; 40: a git blob id);
//   2. `hf download --local-dir` metadata: <dir>/.cache/huggingface/download/<file>.metadata,
//      whose second line is the file's etag (its SHA-256 for LFS files, else its git blob id);
//   3. moonrun-manifest.json, written by `moonrun verify --write-manifest` on a trusted copy.
// With none of them a local directory cannot be checked, which is a problem, not a pass.
struct HashJob {
  std::string rel;   // name in the snapshot, for messages
  std::string path;  // what to read
  std::string address;
  bool sha256;
  uint64_t size;
  std::string source;  // "blobs/", "HF metadata", "manifest"
};

std::string read_metadata_etag(const fs::path& meta) {
  std::ifstream in(meta);
  std::string commit, etag;
  if (!std::getline(in, commit) || !std::getline(in, etag)) return "";
  while (!etag.empty() && (etag.back() == '\r' || etag.back() == ' ')) etag.pop_back();
  if (etag.size() >= 2 && etag.front() == '"') etag = etag.substr(1, etag.size() - 2);
  return etag;
}

void run_hash_jobs(VerifyReport& r, const VerifyOptions& opt, std::vector<HashJob>& jobs) {
  uint64_t total = 0;
  for (const auto& j : jobs) total += j.size;
  // Biggest first: the long files start early and the pool drains evenly.
  std::sort(jobs.begin(), jobs.end(), [](const HashJob& a, const HashJob& b) { return a.size > b.size; });
  std::vector<std::string> results(jobs.size());  // "" = match, else the problem
  std::atomic<size_t> next{0};
  {
    Progress progress(opt.progress, total);
    auto worker = [&] {
      for (size_t i = next++; i < jobs.size(); i = next++) {
        const HashJob& j = jobs[i];
        auto h = hash_file(j.path, j.sha256, !j.sha256, &Progress::add_cb, &progress);
        if (!h) {
          results[i] = j.rel + ": " + h.status().message();
          continue;
        }
        const std::string& got = j.sha256 ? h->sha256_hex : h->git_sha1_hex;
        if (got != j.address)
          results[i] = j.rel + ": " + (j.sha256 ? "sha256 " : "git blob sha1 ") + got + " differs from " +
                       (j.source == "blobs/" ? "its content address blobs/" : "the " + j.source + " hash ") + j.address +
                       " (corrupt)";
      }
    };
    const int n_threads = std::max(1, std::min<int>(opt.hash_threads, static_cast<int>(jobs.size())));
    std::vector<std::thread> pool;
    for (int t = 1; t < n_threads; ++t) pool.emplace_back(worker);
    worker();
    for (auto& t : pool) t.join();
  }
  r.hash_checked += static_cast<int>(jobs.size());
  for (const auto& res : results) {
    if (res.empty()) ++r.hash_matched;
    else r.problems.push_back(res);
  }
}

// Regular files of a local directory, relative paths, without moonrun's manifest and the
// HF download metadata.
std::vector<std::string> local_files(const std::string& dir) {
  std::vector<std::string> files;
  std::error_code ec;
  for (auto it = fs::recursive_directory_iterator(dir, ec); it != fs::recursive_directory_iterator(); it.increment(ec)) {
    if (ec) break;
    const std::string rel = it->path().lexically_relative(dir).string();
    if (rel == ".cache" && it->is_directory(ec)) {
      it.disable_recursion_pending();
      continue;
    }
    if (!it->is_regular_file(ec) || rel == kManifestName) continue;
    files.push_back(rel);
  }
  std::sort(files.begin(), files.end());
  return files;
}

void check_hashes(VerifyReport& r, const VerifyOptions& opt) {
  r.hashed = true;
  std::vector<HashJob> jobs;
  std::error_code ec;
  if (!r.repo_dir.empty()) {
    r.hash_source = "HF cache content addresses (blobs/)";
    std::set<std::string> blobs_seen;
    const fs::path blobs_dir = fs::weakly_canonical(r.repo_dir + "/blobs", ec);
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
      jobs.push_back({rel, target.string(), address, sha256, fs::file_size(target, ec), "blobs/"});
    }
    if (not_addressed) r.hash_note = std::to_string(not_addressed) + " file(s) not stored as blobs, not hashed";
    return run_hash_jobs(r, opt, jobs);
  }
  // A plain directory: HF --local-dir metadata first, else the manifest.
  const fs::path meta_dir = fs::path(r.snapshot_dir) / ".cache" / "huggingface" / "download";
  const std::string manifest_path = r.snapshot_dir + "/" + kManifestName;
  if (fs::is_directory(meta_dir, ec)) {
    r.hash_source = "hf download --local-dir metadata (.cache/huggingface/download)";
    int without = 0;
    for (const auto& rel : local_files(r.snapshot_dir)) {
      const std::string etag = read_metadata_etag(meta_dir / (rel + ".metadata"));
      const bool sha256 = is_lower_hex(etag, 64);
      if (!sha256 && !is_lower_hex(etag, 40)) {
        ++without;
        continue;
      }
      jobs.push_back({rel, r.snapshot_dir + "/" + rel, etag, sha256, fs::file_size(r.snapshot_dir + "/" + rel, ec),
                      "HF metadata"});
    }
    if (without) r.hash_note = std::to_string(without) + " file(s) without download metadata, not hashed";
    return run_hash_jobs(r, opt, jobs);
  }
  if (fs::exists(manifest_path, ec)) {
    r.hash_source = std::string(kManifestName) + " (written by moonrun verify --write-manifest)";
    std::ifstream in(manifest_path);
    auto m = nlohmann::json::parse(in, nullptr, false);
    if (m.is_discarded() || !m.contains("files") || !m["files"].is_object()) {
      r.problems.push_back(manifest_path + ": not a moonrun manifest (unreadable JSON or no \"files\")");
      return;
    }
    std::set<std::string> listed;
    for (const auto& [rel, f] : m["files"].items()) {
      listed.insert(rel);
      const std::string sha = f.is_object() && f.contains("sha256") && f["sha256"].is_string() ? f["sha256"].get<std::string>() : "";
      const std::string path = r.snapshot_dir + "/" + rel;
      if (!fs::exists(path, ec)) {
        r.problems.push_back(rel + ": listed in " + kManifestName + " but missing");
        continue;
      }
      const uint64_t size = fs::file_size(path, ec);
      if (f.contains("size") && f["size"].is_number_unsigned() && f["size"].get<uint64_t>() != size) {
        r.problems.push_back(rel + ": " + std::to_string(size) + " bytes, the manifest says " +
                             std::to_string(f["size"].get<uint64_t>()) + " (truncated or replaced)");
        continue;
      }
      jobs.push_back({rel, path, sha, true, size, "manifest"});
    }
    int unlisted = 0;
    for (const auto& rel : local_files(r.snapshot_dir)) unlisted += listed.count(rel) ? 0 : 1;
    if (unlisted) r.hash_note = std::to_string(unlisted) + " file(s) not in the manifest, not hashed";
    return run_hash_jobs(r, opt, jobs);
  }
  r.problems.push_back("--hash: " + r.snapshot_dir + " has no reference hashes to compare with (not an HF cache snapshot, "
                       "no .cache/huggingface/download metadata from `hf download --local-dir`, no " + kManifestName +
                       "); run `moonrun verify --write-manifest " + r.snapshot_dir + "` once on a copy you trust");
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
  o << "total bytes      : " << with_thousands_separators(r.total_bytes) << " (" << human_bytes(r.total_bytes) << ")\n";
  o << "config.json      : " << (r.config_present ? "OK" : "MISSING") << "\n";
  o << ".incomplete files: " << r.incomplete_files << "\n";
  o << "headers          : " << r.headers_ok << "/" << r.shards_present << " parse, "
    << with_thousands_separators(r.tensors_in_headers) << " tensors inside their files\n";
  o << "config check     : " << r.config_check << "\n";
  if (r.hashed) {
    o << "content hashes   : ";
    if (r.hash_note.rfind("skipped", 0) == 0) o << r.hash_note << "\n";
    else {
      o << r.hash_matched << "/" << r.hash_checked << (r.repo_dir.empty() ? " files match" : " blobs match");
      if (!r.hash_source.empty()) o << " (" << r.hash_source << ")";
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

namespace moonrun {

std::string human_bytes(uint64_t n) {
  char buf[32];
  if (n >= 1000ull * 1000 * 1000) std::snprintf(buf, sizeof buf, "%.2f GB", n / 1e9);
  else if (n >= 1000ull * 1000) std::snprintf(buf, sizeof buf, "%.2f MB", n / 1e6);
  else if (n >= 1000ull) std::snprintf(buf, sizeof buf, "%.2f kB", n / 1e3);
  else std::snprintf(buf, sizeof buf, "%llu bytes", static_cast<unsigned long long>(n));
  return buf;
}

nlohmann::json verify_report_to_json(const VerifyReport& r) {
  nlohmann::json j = {{"repo", r.repo},
                      {"snapshot_dir", r.snapshot_dir},
                      {"shards_expected", r.shards_expected},
                      {"shards_present", r.shards_present},
                      {"total_bytes", r.total_bytes},
                      {"config_present", r.config_present},
                      {"incomplete_files", r.incomplete_files},
                      {"headers_ok", r.headers_ok},
                      {"tensors_in_headers", r.tensors_in_headers},
                      {"config_check", r.config_check},
                      {"problems", r.problems},
                      {"result", r.complete() ? "COMPLETE" : "INCOMPLETE"}};
  if (r.hashed)
    j["hashes"] = {{"checked", r.hash_checked}, {"matched", r.hash_matched}, {"source", r.hash_source}, {"note", r.hash_note}};
  if (!r.manifest_written.empty()) j["manifest_written"] = r.manifest_written;
  return j;
}

Status write_manifest(VerifyReport& r, const VerifyOptions& opt) {
  if (!r.repo_dir.empty())
    return invalid_argument("--write-manifest: " + r.snapshot_dir + " is an HF cache snapshot; its blobs are already "
                            "named by their hashes (use --hash)");
  nlohmann::json files = nlohmann::json::object();
  std::vector<std::string> rels = local_files(r.snapshot_dir);
  std::vector<std::string> sums(rels.size());
  std::vector<uint64_t> sizes(rels.size());
  std::atomic<size_t> next{0};
  std::mutex mu;
  std::string error;
  auto worker = [&] {
    for (size_t i = next++; i < rels.size(); i = next++) {
      auto h = hash_file(r.snapshot_dir + "/" + rels[i], true, false);
      std::error_code ec;
      sizes[i] = fs::file_size(r.snapshot_dir + "/" + rels[i], ec);
      if (!h) {
        std::lock_guard<std::mutex> lock(mu);
        error = rels[i] + ": " + h.status().message();
        continue;
      }
      sums[i] = h->sha256_hex;
    }
  };
  const int n_threads = std::max(1, std::min<int>(opt.hash_threads, static_cast<int>(rels.size())));
  std::vector<std::thread> pool;
  for (int t = 1; t < n_threads; ++t) pool.emplace_back(worker);
  worker();
  for (auto& t : pool) t.join();
  if (!error.empty()) return internal_error(error);
  for (size_t i = 0; i < rels.size(); ++i) files[rels[i]] = {{"sha256", sums[i]}, {"size", sizes[i]}};
  const std::string path = r.snapshot_dir + "/" + kManifestName;
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp);
    out << nlohmann::json{{"version", 1}, {"written_by", "moonrun verify --write-manifest"}, {"files", files}}.dump(2) << "\n";
    if (!out) return internal_error("cannot write " + tmp);
  }
  std::error_code ec;
  fs::rename(tmp, path, ec);
  if (ec) return internal_error("cannot write " + path + ": " + ec.message());
  r.manifest_written = path;
  return Status::ok();
}

}  // namespace moonrun
