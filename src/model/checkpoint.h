#pragma once
// Checkpoint access: safetensors files (mmap'd, header validated), sharded checkpoints
// through model.safetensors.index.json, and model paths that are a directory or a Hugging
// Face repo id resolved in the local HF cache. Every error names the file and the problem
// in one line.
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/dtype.h"
#include "common/status.h"

namespace moonrun {

// DType, dtype_size_bytes and dtype_name live in common/dtype.h (the backends use them too).
Result<DType> dtype_from_name(std::string_view name);

struct TensorInfo {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
  const uint8_t* data = nullptr;  // mmap'd bytes, valid while the owning file/checkpoint lives
  uint64_t nbytes = 0;
  uint64_t offset_bytes = 0;      // from the start of the file (after the 8-byte length + header)
  std::string file;               // path of the shard, for messages
  int64_t numel() const;
};

// One parsed header entry, before any mmap (what the fuzzer and `verify` exercise).
struct SafetensorsHeader {
  uint64_t header_len_bytes = 0;  // the JSON header's length, as stored in the first 8 bytes
  std::vector<TensorInfo> tensors;  // data == nullptr; offset_bytes absolute in the file
  nlohmann::json metadata;        // "__metadata__" or null
};

// Validates a safetensors header held in `bytes` (at least the first 8 + header_len bytes of
// the file): length within the file, JSON well-formed, known dtypes, shapes non-negative,
// offsets inside the file and consistent with dtype x shape, no overlaps.
Result<SafetensorsHeader> parse_safetensors_header(const uint8_t* bytes, size_t n_bytes,
                                                   uint64_t file_size_bytes,
                                                   const std::string& file_for_errors);

// Reads only the first 8 + header_len bytes of `path` (pread, no mmap) and validates them
// against the file's size: what `verify` uses on multi-GB shards.
Result<SafetensorsHeader> read_safetensors_header(const std::string& path);

// "[64, 16]": shapes as error messages print them.
std::string shape_to_string(const std::vector<int64_t>& shape);

class SafetensorsFile {
 public:
  static Result<std::unique_ptr<SafetensorsFile>> open(const std::string& path);
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::string& path() const { return path_; }
  uint64_t file_size_bytes() const { return size_; }
  const std::vector<TensorInfo>& tensors() const { return header_.tensors; }
  const nlohmann::json& metadata() const { return header_.metadata; }
  const TensorInfo* find(std::string_view name) const;

 private:
  SafetensorsFile() = default;
  std::string path_;
  uint64_t size_ = 0;
  void* map_ = nullptr;
  SafetensorsHeader header_;
};

// Resolves --model: an existing directory is used as is; "org/name" (optionally
// "org/name@revision") is looked up as $HF_HOME/hub/models--org--name/snapshots/REV,
// REV from refs/main (or the revision given). HF_HOME defaults to ~/.cache/huggingface;
// HF_HUB_CACHE overrides the hub folder.
Result<std::string> resolve_model_path(const std::string& dir_or_repo);

// The pieces of a repo id resolved in the HF cache, for tools that look past the snapshot
// (verify reads blobs/ and the .incomplete downloads there).
struct HfCacheLocation {
  std::string repo_id;       // "org/name"
  std::string revision;      // as asked ("main" by default)
  std::string repo_dir;      // HUB/models--org--name
  std::string commit;        // the snapshot folder's name
  std::string snapshot_dir;  // repo_dir/snapshots/commit
};
// True when `s` has the shape of a repo id ("org/name" or "org/name@rev"), not a path.
bool looks_like_repo_id(const std::string& s);
// The hub folder: $HF_HUB_CACHE, else $HF_HOME/hub, else $XDG_CACHE_HOME/huggingface/hub,
// else ~/.cache/huggingface/hub.
std::string hf_hub_cache_dir();
Result<HfCacheLocation> resolve_hf_cache(const std::string& repo_id_at_rev);

class Checkpoint {
 public:
  // Opens config.json and every safetensors file (through the index when present).
  static Result<std::unique_ptr<Checkpoint>> open(const std::string& dir_or_repo);

  const std::string& dir() const { return dir_; }
  const nlohmann::json& config() const { return config_; }
  const TensorInfo* find(std::string_view name) const;
  // The tensor, or a not_found error naming the checkpoint and the tensor.
  Result<const TensorInfo*> get(std::string_view name) const;
  // The tensor, checked: "DIR/model-00002.safetensors: tensor NAME has dtype F32 and shape
  // [64, 8], expected BF16 [64, 16] (from config.json)".
  Result<const TensorInfo*> get(std::string_view name, DType dtype,
                                const std::vector<int64_t>& shape) const;
  std::vector<std::string> tensor_names() const;
  uint64_t total_bytes() const;  // sum of the safetensors files' sizes
  const std::vector<std::unique_ptr<SafetensorsFile>>& files() const { return files_; }

 private:
  Checkpoint() = default;
  std::string dir_;
  nlohmann::json config_;
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::vector<std::pair<std::string, const TensorInfo*>> index_;  // sorted by name
};

// Writes a safetensors file (tests, the demo model, fixtures). Tensors are written in the
// order given, 8-byte aligned header as the reference writer does.
struct TensorToWrite {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
  std::vector<uint8_t> bytes;
};
Status write_safetensors(const std::string& path, const std::vector<TensorToWrite>& tensors,
                         const nlohmann::json& metadata = nullptr);

}  // namespace moonrun
