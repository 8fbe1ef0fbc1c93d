#pragma once
// `moonrun verify`: is this checkpoint complete and intact, before 32 GPUs spend eleven
// minutes finding out? The seed's verify_k3_download.py, offline and deeper:
//   - the snapshot resolved as `--model` is (a directory, or org/name[@rev] in the HF cache);
//   - every shard the index names is present (the index is the manifest, not the Hub API);
//   - every shard's header parses and every tensor's bytes lie inside its file;
//   - every tensor the index lists is in the shard it names;
//   - config.json is present and, for kimi_k3 / kimi_linear, every tensor the config implies
//     is there with the expected dtype and shape;
//   - no `.incomplete` download leftovers in the snapshot or in blobs/;
//   - with --hash: each file's bytes hash to its reference: the content address the HF
//     cache stores it under (blobs/<sha256> for LFS files, blobs/<git blob sha1> for small
//     ones), the etag in `hf download --local-dir` metadata, or moonrun-manifest.json
//     (written by --write-manifest on a trusted copy). A local directory with none of them
//     is a problem under --hash, never a silent pass.
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/status.h"

namespace moonrun {

struct VerifyOptions {
  std::string model;    // a directory or org/name[@rev]
  bool hash = false;    // recompute content hashes
  int hash_threads = 4; // files hashed at once (disk-bound beyond a few)
  std::FILE* progress = stderr;  // hashing progress (bytes, GB/s, ETA); nullptr: silent
};

struct VerifyReport {
  std::string repo;          // org/name, or the directory as given
  std::string snapshot_dir;
  std::string repo_dir;      // models--org--name when inside an HF cache, else empty
  int shards_expected = 0;
  int shards_present = 0;
  uint64_t total_bytes = 0;  // sizes of the present shards
  bool config_present = false;
  int incomplete_files = 0;
  int headers_ok = 0;            // shards whose header parsed and whose tensors fit
  uint64_t tensors_in_headers = 0;
  std::string config_check;      // one-line summary of the dtype/shape check
  bool hashed = false;
  int hash_checked = 0;          // files whose content address was recomputed
  int hash_matched = 0;
  std::string hash_note;         // why nothing was hashed, when that is the case
  std::string hash_source;       // where the reference hashes came from
  std::string manifest_written;  // --write-manifest: the file written
  std::vector<std::string> problems;  // one line each; empty means COMPLETE

  bool complete() const { return problems.empty(); }
};

// Runs every check. A non-ok Result is a usage error (nothing to verify at all: the model
// does not resolve); everything found wrong with a checkpoint goes into report.problems.
Result<VerifyReport> verify_checkpoint(const VerifyOptions& options);

// The seed's block form, "RESULT: COMPLETE" or "RESULT: INCOMPLETE" last, problems listed
// before it.
std::string format_verify_report(const VerifyReport& report);

nlohmann::json verify_report_to_json(const VerifyReport& report);

// --write-manifest: SHA-256 and size of every file of a local directory into
// <dir>/moonrun-manifest.json, for later `verify --hash` runs.
Status write_manifest(VerifyReport& report, const VerifyOptions& options);

// "1.56 GB", "37.21 MB", "512 bytes": never "0.00 GB" for a small checkpoint.
std::string human_bytes(uint64_t n);

// "1,560,936,091,448": the byte counts people compare by eye.
std::string with_thousands_separators(uint64_t n);

// Content addresses, lower-case hex. sha256 of the file's bytes (Git LFS / HF blobs) and the
// git blob id: sha1("blob <size>\0" + bytes). `on_bytes` is called with each chunk's size.
struct FileHashes {
  std::string sha256_hex;
  std::string git_sha1_hex;
};
Result<FileHashes> hash_file(const std::string& path, bool want_sha256, bool want_git_sha1,
                             void (*on_bytes)(uint64_t, void*) = nullptr, void* ctx = nullptr);

}  // namespace moonrun
