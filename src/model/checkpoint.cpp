// A checkpoint directory: config.json plus safetensors shards. When
// model.safetensors.index.json is present its "weight_map" (tensor name -> shard file) is the
// authority: shard file names are never parsed or guessed. Without an index, the directory's
// *.safetensors files are the checkpoint (usually a single model.safetensors).
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include "model/checkpoint.h"

namespace moonrun {

namespace fs = std::filesystem;

namespace {

constexpr const char* kIndexName = "model.safetensors.index.json";

// Reads and parses a JSON file; errors name the file.
Result<nlohmann::json> read_json_file(const std::string& path) {
  std::error_code ec;
  if (!fs::exists(path, ec)) return not_found(path + ": missing");
  std::ifstream in(path, std::ios::binary);
  if (!in) return not_found(path + ": cannot open");
  std::stringstream ss;
  ss << in.rdbuf();
  try {
    return nlohmann::json::parse(ss.str());
  } catch (const nlohmann::json::exception& e) {
    return data_loss(path + ": not valid JSON: " + e.what());
  }
}

// The shard list from the index, in first-mention order, and the name -> shard map.
struct IndexFile {
  std::vector<std::string> shards;
  std::vector<std::pair<std::string, std::string>> weight_map;  // tensor, shard
};

Result<IndexFile> read_index(const std::string& dir, const std::string& path) {
  auto j = read_json_file(path);
  if (!j) return j.status();
  if (!j->is_object()) return data_loss(path + ": not a JSON object");
  auto wm = j->find("weight_map");
  if (wm == j->end() || !wm->is_object())
    return data_loss(path + ": missing \"weight_map\" object");
  IndexFile idx;
  std::set<std::string> seen;
  for (auto it = wm->begin(); it != wm->end(); ++it) {
    if (!it.value().is_string())
      return data_loss(path + ": weight_map entry for \"" + it.key() + "\" is not a file name");
    const std::string& shard = it.value().get_ref<const std::string&>();
    // A shard is a file inside the checkpoint directory, never a path out of it.
    if (shard.empty() || shard.find('/') != std::string::npos || shard == "." || shard == "..")
      return data_loss(path + ": weight_map entry for \"" + it.key() + "\" names \"" + shard +
                       "\", not a file in " + dir);
    if (seen.insert(shard).second) idx.shards.push_back(shard);
    idx.weight_map.emplace_back(it.key(), shard);
  }
  if (idx.weight_map.empty()) return data_loss(path + ": \"weight_map\" is empty");
  return idx;
}

}  // namespace

Result<std::unique_ptr<Checkpoint>> Checkpoint::open(const std::string& dir_or_repo) {
  auto dir = resolve_model_path(dir_or_repo);
  if (!dir) return dir.status();
  std::unique_ptr<Checkpoint> ck(new Checkpoint());
  ck->dir_ = *dir;

  auto config = read_json_file(ck->dir_ + "/config.json");
  if (!config) return config.status();
  if (!config->is_object()) return data_loss(ck->dir_ + "/config.json: not a JSON object");
  ck->config_ = std::move(*config);

  std::error_code ec;
  const std::string index_path = ck->dir_ + "/" + kIndexName;
  std::map<std::string, const TensorInfo*> by_name;
  if (fs::exists(index_path, ec)) {
    auto idx = read_index(ck->dir_, index_path);
    if (!idx) return idx.status();
    std::map<std::string, const SafetensorsFile*> shard_files;
    for (const auto& shard : idx->shards) {
      const std::string shard_path = ck->dir_ + "/" + shard;
      if (!fs::exists(shard_path, ec)) {
        // Name a tensor that lives there, so the message says what the shard was for.
        std::string example;
        for (const auto& [name, s] : idx->weight_map)
          if (s == shard) { example = name; break; }
        return not_found(index_path + ": shard " + shard + " (holding \"" + example +
                         "\" and others) is missing: " + shard_path + " does not exist");
      }
      auto f = SafetensorsFile::open(shard_path);
      if (!f) return f.status();
      shard_files[shard] = f->get();
      ck->files_.push_back(std::move(*f));
    }
    for (const auto& [name, shard] : idx->weight_map) {
      const TensorInfo* t = shard_files[shard]->find(name);
      if (t == nullptr)
        return data_loss(index_path + ": tensor \"" + name + "\" is listed in shard " + shard +
                         " but " + ck->dir_ + "/" + shard + " does not contain it");
      by_name[name] = t;
    }
  } else {
    std::vector<std::string> shards;
    for (const auto& entry : fs::directory_iterator(ck->dir_, ec)) {
      const std::string fname = entry.path().filename().string();
      if (fname.size() > 12 && fname.compare(fname.size() - 12, 12, ".safetensors") == 0)
        shards.push_back(fname);
    }
    if (ec) return not_found(ck->dir_ + ": cannot list: " + ec.message());
    if (shards.empty())
      return not_found(ck->dir_ + ": no " + kIndexName + " and no *.safetensors files");
    std::sort(shards.begin(), shards.end());
    for (const auto& shard : shards) {
      auto f = SafetensorsFile::open(ck->dir_ + "/" + shard);
      if (!f) return f.status();
      for (const auto& t : (*f)->tensors()) {
        auto [it, inserted] = by_name.emplace(t.name, &t);
        if (!inserted)
          return data_loss(ck->dir_ + ": tensor \"" + t.name + "\" appears in both " +
                           it->second->file + " and " + t.file + " (and there is no " +
                           kIndexName + " to say which one counts)");
      }
      ck->files_.push_back(std::move(*f));
    }
  }
  ck->index_.assign(by_name.begin(), by_name.end());  // std::map iterates sorted by name
  return ck;
}

const TensorInfo* Checkpoint::find(std::string_view name) const {
  auto it = std::lower_bound(index_.begin(), index_.end(), name,
                             [](const auto& entry, std::string_view n) { return entry.first < n; });
  if (it == index_.end() || it->first != name) return nullptr;
  return it->second;
}

Result<const TensorInfo*> Checkpoint::get(std::string_view name) const {
  const TensorInfo* t = find(name);
  if (t == nullptr)
    return not_found(dir_ + ": tensor \"" + std::string(name) + "\" not found (the checkpoint has " +
                     std::to_string(index_.size()) + " tensors)");
  return t;
}

Result<const TensorInfo*> Checkpoint::get(std::string_view name, DType dtype,
                                          const std::vector<int64_t>& shape) const {
  auto t = get(name);
  if (!t) return t.status();
  const TensorInfo* ti = *t;
  if (ti->dtype != dtype || ti->shape != shape)
    return failed_precondition(ti->file + ": tensor " + std::string(name) + " has dtype " +
                               dtype_name(ti->dtype) + " and shape " + shape_to_string(ti->shape) +
                               ", expected " + dtype_name(dtype) + " " + shape_to_string(shape) +
                               " (from config.json)");
  return ti;
}

std::vector<std::string> Checkpoint::tensor_names() const {
  std::vector<std::string> names;
  names.reserve(index_.size());
  for (const auto& [name, t] : index_) names.push_back(name);
  return names;
}

uint64_t Checkpoint::total_bytes() const {
  uint64_t total = 0;
  for (const auto& f : files_) total += f->file_size_bytes();
  return total;
}

}  // namespace moonrun
