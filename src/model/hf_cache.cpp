// --model resolution: a checkpoint directory, or a Hugging Face repo id found in the local
// HF cache. The cache layout (huggingface_hub, "Manage the cache"):
//   HUB/models--ORG--NAME/refs/main          the commit hash that "main" points at
//   HUB/models--ORG--NAME/snapshots/COMMIT/  the files, as symlinks into ../../blobs/
//   HUB/models--ORG--NAME/blobs/SHA          the content (LFS files named by their SHA-256)
// HUB is $HF_HUB_CACHE, or $HF_HOME/hub, with HF_HOME defaulting to
// $XDG_CACHE_HOME/huggingface and then ~/.cache/huggingface.
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "model/checkpoint.h"

namespace moonrun {

namespace fs = std::filesystem;

namespace {

std::string env_or_empty(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr ? std::string(v) : std::string();
}

bool is_name_char(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
         c == '-' || c == '_' || c == '.';
}

bool is_name(std::string_view s) {
  if (s.empty() || s == "." || s == "..") return false;
  for (char c : s)
    if (!is_name_char(c)) return false;
  return true;
}

// Revisions are branch names, tags, commit hashes, or "refs/pr/N"-style paths.
bool is_revision(std::string_view s) {
  if (s.empty() || s.front() == '/' || s.back() == '/') return false;
  size_t start = 0;
  while (start <= s.size()) {
    size_t slash = s.find('/', start);
    std::string_view part = s.substr(start, slash == std::string_view::npos ? s.npos : slash - start);
    if (!is_name(part)) return false;
    if (slash == std::string_view::npos) break;
    start = slash + 1;
  }
  return true;
}

std::string strip_trailing_slashes(std::string s) {
  while (s.size() > 1 && s.back() == '/') s.pop_back();
  return s;
}

}  // namespace

bool looks_like_repo_id(const std::string& s) {
  std::string_view v = s;
  size_t at = v.find('@');
  std::string_view id = v.substr(0, at);
  if (at != std::string_view::npos && !is_revision(v.substr(at + 1))) return false;
  size_t slash = id.find('/');
  if (slash == std::string_view::npos) return false;
  return is_name(id.substr(0, slash)) && is_name(id.substr(slash + 1));
}

std::string hf_hub_cache_dir() {
  std::string hub = env_or_empty("HF_HUB_CACHE");
  if (!hub.empty()) return strip_trailing_slashes(hub);
  std::string home = env_or_empty("HF_HOME");
  if (home.empty()) {
    std::string xdg = env_or_empty("XDG_CACHE_HOME");
    if (!xdg.empty()) {
      home = strip_trailing_slashes(xdg) + "/huggingface";
    } else {
      std::string user_home = env_or_empty("HOME");
      home = (user_home.empty() ? std::string("/root") : strip_trailing_slashes(user_home)) +
             "/.cache/huggingface";
    }
  }
  return strip_trailing_slashes(home) + "/hub";
}

Result<HfCacheLocation> resolve_hf_cache(const std::string& repo_id_at_rev) {
  if (!looks_like_repo_id(repo_id_at_rev))
    return invalid_argument(repo_id_at_rev + ": not a Hugging Face repo id (expected org/name or org/name@revision)");
  HfCacheLocation loc;
  size_t at = repo_id_at_rev.find('@');
  loc.repo_id = repo_id_at_rev.substr(0, at);
  loc.revision = at == std::string::npos ? "main" : repo_id_at_rev.substr(at + 1);
  size_t slash = loc.repo_id.find('/');
  const std::string hub = hf_hub_cache_dir();
  loc.repo_dir = hub + "/models--" + loc.repo_id.substr(0, slash) + "--" + loc.repo_id.substr(slash + 1);

  std::error_code ec;
  if (!fs::is_directory(loc.repo_dir, ec))
    return not_found(loc.repo_id + ": not a directory and not in the Hugging Face cache (" +
                     loc.repo_dir + " does not exist; set HF_HOME or HF_HUB_CACHE, or pass a checkpoint directory)");

  // A ref file names the commit; a revision that is itself a snapshot's name is used as is
  // (someone pinned a commit hash that no branch points at).
  const std::string ref_path = loc.repo_dir + "/refs/" + loc.revision;
  if (fs::is_regular_file(ref_path, ec)) {
    std::ifstream in(ref_path);
    std::string commit;
    std::getline(in, commit);
    while (!commit.empty() && (commit.back() == '\r' || commit.back() == ' ' || commit.back() == '\t'))
      commit.pop_back();
    if (!is_name(commit))
      return data_loss(ref_path + ": does not hold a commit hash (got \"" + commit.substr(0, 64) + "\")");
    loc.commit = commit;
  } else if (fs::is_directory(loc.repo_dir + "/snapshots/" + loc.revision, ec)) {
    loc.commit = loc.revision;
  } else {
    return not_found(repo_id_at_rev + ": " + ref_path + " is missing and no snapshot is named \"" +
                     loc.revision + "\" (download incomplete?)");
  }
  loc.snapshot_dir = loc.repo_dir + "/snapshots/" + loc.commit;
  if (!fs::is_directory(loc.snapshot_dir, ec))
    return not_found(repo_id_at_rev + ": refs/" + loc.revision + " names commit " + loc.commit +
                     " but " + loc.snapshot_dir + " does not exist");
  return loc;
}

Result<std::string> resolve_model_path(const std::string& dir_or_repo) {
  if (dir_or_repo.empty()) return invalid_argument("--model is empty (a checkpoint directory or org/name)");
  std::error_code ec;
  if (fs::is_directory(dir_or_repo, ec)) return strip_trailing_slashes(dir_or_repo);
  if (fs::exists(dir_or_repo, ec))
    return invalid_argument(dir_or_repo + ": not a directory (--model takes a checkpoint directory or a Hugging Face repo id)");
  if (looks_like_repo_id(dir_or_repo)) {
    auto loc = resolve_hf_cache(dir_or_repo);
    if (!loc) return loc.status();
    return loc->snapshot_dir;
  }
  return not_found(dir_or_repo + ": no such directory (and not an org/name repo id)");
}

}  // namespace moonrun
