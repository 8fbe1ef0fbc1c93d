// Writing safetensors files: the 8-byte little-endian header length, the JSON header padded
// with spaces to a multiple of 8 bytes (as the reference writer does, so the byte buffer
// starts 8-aligned), then the tensors' bytes back to back in the order given.
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <set>

#include "model/checkpoint.h"

namespace moonrun {

Status write_safetensors(const std::string& path, const std::vector<TensorToWrite>& tensors,
                         const nlohmann::json& metadata) {
  // ordered_json keeps "__metadata__" first and the tensors in the order given.
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.is_null()) {
    if (!metadata.is_object())
      return invalid_argument(path + ": safetensors metadata must be a JSON object of strings");
    nlohmann::ordered_json m = nlohmann::ordered_json::object();
    for (auto it = metadata.begin(); it != metadata.end(); ++it) {
      if (!it.value().is_string())
        return invalid_argument(path + ": safetensors metadata value for \"" + it.key() +
                                "\" must be a string");
      m[it.key()] = it.value().get<std::string>();
    }
    header["__metadata__"] = std::move(m);
  }
  std::set<std::string> names;
  uint64_t offset = 0;
  for (const auto& t : tensors) {
    if (t.name.empty() || t.name == "__metadata__")
      return invalid_argument(path + ": invalid tensor name \"" + t.name + "\"");
    if (!names.insert(t.name).second)
      return invalid_argument(path + ": tensor \"" + t.name + "\" given twice");
    uint64_t numel = 1;
    for (int64_t d : t.shape) {
      if (d < 0)
        return invalid_argument(path + ": tensor \"" + t.name + "\" has negative shape " +
                                shape_to_string(t.shape));
      numel *= static_cast<uint64_t>(d);
    }
    const uint64_t expected = numel * dtype_size_bytes(t.dtype);
    if (t.bytes.size() != expected)
      return invalid_argument(path + ": tensor \"" + t.name + "\" " + dtype_name(t.dtype) + " " +
                              shape_to_string(t.shape) + " needs " + std::to_string(expected) +
                              " bytes, got " + std::to_string(t.bytes.size()));
    nlohmann::ordered_json entry;
    entry["dtype"] = dtype_name(t.dtype);
    entry["shape"] = t.shape;
    entry["data_offsets"] = {offset, offset + expected};
    header[t.name] = std::move(entry);
    offset += expected;
  }
  std::string json = header.dump();
  json.append((8 - json.size() % 8) % 8, ' ');

  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) return not_found(path + ": cannot create: " + std::strerror(errno));
  uint8_t len_le[8];
  uint64_t len = json.size();
  for (int i = 0; i < 8; ++i) len_le[i] = static_cast<uint8_t>(len >> (8 * i));
  bool ok = std::fwrite(len_le, 1, 8, f) == 8 && std::fwrite(json.data(), 1, json.size(), f) == json.size();
  for (const auto& t : tensors) {
    if (!ok) break;
    ok = t.bytes.empty() || std::fwrite(t.bytes.data(), 1, t.bytes.size(), f) == t.bytes.size();
  }
  std::string err = ok ? "" : std::strerror(errno);
  if (std::fclose(f) != 0 && ok) {
    ok = false;
    err = std::strerror(errno);
  }
  if (!ok) return data_loss(path + ": write failed: " + err);
  return Status::ok();
}

}  // namespace moonrun
