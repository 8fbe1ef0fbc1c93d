#pragma once
// The vision variants (tests/fixtures/k3-vision-variants, its README): towers of other
// dimensions than k3-vision-tiny's, on k3-vision-tiny's text model. A variant's folder holds
// config.json, preprocessor_config.json, vision.safetensors (its vision_tower.* and
// mm_projector.* tensors) and vision_expected.json (the reference's image rows, greedy ids
// and logits; images named relative to k3-vision-variants/). Its checkpoint is put together
// in a scratch folder: that tower plus k3-vision-tiny's language_model.* tensors, as two
// shards under a model.safetensors.index.json. Shared by the CPU fixture test and the CUDA
// one.
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/status.h"
#include "fixture_files.h"
#include "model/checkpoint.h"

namespace moonrun::testing {

inline std::string vision_tiny_dir() { return fixtures::fixtures_dir() + "/k3-vision-tiny"; }
inline std::string vision_variants_dir() { return fixtures::fixtures_dir() + "/k3-vision-variants"; }

// Every variant folder with a vision_expected.json, sorted.
inline std::vector<std::string> vision_variant_names() {
  namespace fs = std::filesystem;
  std::vector<std::string> names;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(vision_variants_dir(), ec))
    if (e.is_directory() && fs::exists(e.path() / "vision_expected.json")) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

inline bool is_vision_tensor(const std::string& name) {
  return name.rfind("vision_tower.", 0) == 0 || name.rfind("mm_projector.", 0) == 0;
}

// A scratch folder (made anew) holding variant `name`'s checkpoint: its config.json and
// preprocessor_config.json, text.safetensors = k3-vision-tiny/model.safetensors and
// vision.safetensors = the variant's (links, or copies where links fail), and the index
// that maps k3-vision-tiny's text tensors to the first and the variant's tower to the second.
inline Result<std::string> assemble_vision_variant(const std::string& name) {
  namespace fs = std::filesystem;
  const fs::path src = fs::path(vision_variants_dir()) / name;
  const fs::path dir = fs::temp_directory_path() / ("moonrun_vision_variant_" + std::to_string(getpid()) + "_" + name);
  std::error_code ec;
  fs::remove_all(dir, ec);
  fs::create_directories(dir, ec);
  if (ec) return internal_error(dir.string() + ": " + ec.message());
  for (const char* f : {"config.json", "preprocessor_config.json"}) {
    fs::copy_file(src / f, dir / f, ec);
    if (ec) return internal_error((src / f).string() + ": " + ec.message());
  }
  auto place = [&](const fs::path& from, const fs::path& to) -> Status {
    std::error_code e;
    fs::create_symlink(fs::absolute(from), to, e);
    if (e) fs::copy_file(from, to, e);
    if (e) return internal_error(from.string() + ": " + e.message());
    return Status::ok();
  };
  const fs::path text_file = fs::path(vision_tiny_dir()) / "model.safetensors";
  const fs::path vision_file = src / "vision.safetensors";
  MR_RETURN_IF_ERROR(place(text_file, dir / "text.safetensors"));
  MR_RETURN_IF_ERROR(place(vision_file, dir / "vision.safetensors"));
  nlohmann::json weight_map = nlohmann::json::object();
  auto text = MR_TRY(SafetensorsFile::open(text_file.string()));
  for (const TensorInfo& t : text->tensors())
    if (!is_vision_tensor(t.name)) weight_map[t.name] = "text.safetensors";
  auto vision = MR_TRY(SafetensorsFile::open(vision_file.string()));
  for (const TensorInfo& t : vision->tensors()) {
    if (!is_vision_tensor(t.name)) return data_loss(vision_file.string() + ": " + t.name + " is not a tower tensor");
    weight_map[t.name] = "vision.safetensors";
  }
  std::ofstream out(dir / "model.safetensors.index.json");
  out << nlohmann::json{{"metadata", nlohmann::json::object()}, {"weight_map", weight_map}}.dump(1) << "\n";
  if (!out) return internal_error((dir / "model.safetensors.index.json").string() + ": cannot write");
  return dir.string();
}

}  // namespace moonrun::testing
