// safetensors reading: the header parser and the mmap'd file.
//
// The format (github.com/huggingface/safetensors, README "Format"):
//   bytes [0, 8)        N, the JSON header's length, little-endian u64
//   bytes [8, 8+N)      UTF-8 JSON: {"__metadata__": {str: str}?,
//                                    NAME: {"dtype": D, "shape": [..], "data_offsets": [b, e]}}
//   bytes [8+N, end)    the byte buffer; [b, e) are relative to its start
// The reference implementation also demands that the tensors tile the byte buffer exactly
// (no holes, no overlaps, nothing trailing) so a file cannot hide a second payload; we check
// the same so that a file we accept is one the reference accepts.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <limits>
#include <sstream>

#include "model/checkpoint.h"

namespace moonrun {

namespace {

// The reference implementation refuses headers above 100 MB; so do we (and it bounds how
// much a hostile length field can make us read).
constexpr uint64_t kMaxHeaderBytes = 100'000'000;
constexpr uint64_t kLengthFieldBytes = 8;

uint64_t read_u64_le(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

// Error text never embeds raw bytes from the file verbatim beyond a short, printable excerpt:
// the message must stay one line whatever the file holds.
std::string printable(std::string_view s, size_t max_chars = 256) {
  std::string out;
  for (char c : s.substr(0, max_chars)) {
    unsigned char u = static_cast<unsigned char>(c);
    out += (u >= 0x20 && u < 0x7f) ? c : '?';
  }
  if (s.size() > max_chars) out += "...";
  return out;
}

std::string errno_text() { return std::strerror(errno); }

}  // namespace

Result<DType> dtype_from_name(std::string_view name) {
  for (DType d : kAllDTypes)
    if (name == dtype_name(d)) return d;
  return invalid_argument("unknown dtype \"" + printable(name) +
                          "\" (supported: BF16, F16, F32, F8_E4M3, U8, I8, I32, I64)");
}

int64_t TensorInfo::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::string shape_to_string(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(shape[i]);
  }
  return s + "]";
}

namespace {

// One header entry -> TensorInfo, with offsets still relative to the byte buffer.
Result<TensorInfo> parse_entry(const std::string& file, const std::string& name,
                               const nlohmann::json& entry) {
  const std::string where = file + ": tensor \"" + printable(name) + "\"";
  if (!entry.is_object()) return data_loss(where + ": header entry is not a JSON object");

  auto dtype_it = entry.find("dtype");
  if (dtype_it == entry.end() || !dtype_it->is_string())
    return data_loss(where + ": missing or non-string \"dtype\"");
  auto dtype = dtype_from_name(dtype_it->get_ref<const std::string&>());
  if (!dtype) return data_loss(where + ": " + dtype.status().message());

  auto shape_it = entry.find("shape");
  if (shape_it == entry.end() || !shape_it->is_array())
    return data_loss(where + ": missing or non-array \"shape\"");
  TensorInfo t;
  t.name = name;
  t.dtype = *dtype;
  t.file = file;
  // numel x size must fit in u64; each step is checked so a shape like [2^40, 2^40] is an
  // error rather than a wrapped small number that happens to match the offsets.
  uint64_t nbytes = dtype_size_bytes(*dtype);
  for (const auto& d : *shape_it) {
    if (!d.is_number_unsigned())  // nlohmann parses every non-negative integer as unsigned
      return data_loss(where + ": shape " + printable(shape_it->dump()) +
                       " must hold non-negative integers");
    uint64_t dim = d.get<uint64_t>();
    if (dim > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
      return data_loss(where + ": shape dimension " + std::to_string(dim) + " is too large");
    if (dim != 0 && nbytes > std::numeric_limits<uint64_t>::max() / dim)
      return data_loss(where + ": shape " + printable(shape_it->dump()) +
                       " overflows 64-bit byte counts");
    nbytes *= dim;
    t.shape.push_back(static_cast<int64_t>(dim));
  }
  t.nbytes = nbytes;

  auto off_it = entry.find("data_offsets");
  if (off_it == entry.end() || !off_it->is_array() || off_it->size() != 2 ||
      !(*off_it)[0].is_number_unsigned() || !(*off_it)[1].is_number_unsigned())
    return data_loss(where + ": \"data_offsets\" must be [begin, end], two non-negative integers");
  uint64_t begin = (*off_it)[0].get<uint64_t>();
  uint64_t end = (*off_it)[1].get<uint64_t>();
  if (end < begin)
    return data_loss(where + ": data_offsets [" + std::to_string(begin) + ", " +
                     std::to_string(end) + "] end before they begin");
  if (end - begin != nbytes)
    return data_loss(where + ": data_offsets [" + std::to_string(begin) + ", " +
                     std::to_string(end) + "] span " + std::to_string(end - begin) +
                     " bytes but " + dtype_name(t.dtype) + " " + shape_to_string(t.shape) +
                     " needs " + std::to_string(nbytes));
  t.offset_bytes = begin;  // relative for now; made absolute by the caller
  return t;
}

}  // namespace

Result<SafetensorsHeader> parse_safetensors_header(const uint8_t* bytes, size_t n_bytes,
                                                   uint64_t file_size_bytes,
                                                   const std::string& file) {
  if (file_size_bytes < kLengthFieldBytes || n_bytes < kLengthFieldBytes)
    return data_loss(file + ": truncated: " + std::to_string(std::min<uint64_t>(n_bytes, file_size_bytes)) +
                     " bytes, a safetensors file starts with an 8-byte header length");
  SafetensorsHeader h;
  h.header_len_bytes = read_u64_le(bytes);
  const uint64_t after_length = file_size_bytes - kLengthFieldBytes;
  if (h.header_len_bytes > after_length)
    return data_loss(file + ": header length " + std::to_string(h.header_len_bytes) +
                     " runs past the end of the file (" + std::to_string(file_size_bytes) +
                     " bytes); truncated or not a safetensors file");
  if (h.header_len_bytes > kMaxHeaderBytes)
    return data_loss(file + ": header length " + std::to_string(h.header_len_bytes) +
                     " exceeds the 100 MB limit of the format");
  if (h.header_len_bytes < 2)
    return data_loss(file + ": header length " + std::to_string(h.header_len_bytes) +
                     " is too short for a JSON object");
  if (n_bytes - kLengthFieldBytes < h.header_len_bytes)
    return data_loss(file + ": header needs " + std::to_string(kLengthFieldBytes + h.header_len_bytes) +
                     " bytes but only " + std::to_string(n_bytes) + " were read");

  const char* json_begin = reinterpret_cast<const char*>(bytes + kLengthFieldBytes);
  const char* json_end = json_begin + h.header_len_bytes;
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(json_begin, json_end);
  } catch (const nlohmann::json::exception& e) {
    // e.what() is one line: "[json.exception.parse_error.101] parse error at line 1, ..."
    return data_loss(file + ": header is not valid JSON: " + printable(e.what(), 200));
  }
  if (!j.is_object()) return data_loss(file + ": header JSON is not an object");

  const uint64_t buffer_bytes = after_length - h.header_len_bytes;
  const uint64_t buffer_start = kLengthFieldBytes + h.header_len_bytes;
  for (auto it = j.begin(); it != j.end(); ++it) {
    if (it.key() == "__metadata__") {
      const auto& m = it.value();
      if (m.is_null()) continue;
      if (!m.is_object()) return data_loss(file + ": \"__metadata__\" is not a JSON object");
      for (auto mit = m.begin(); mit != m.end(); ++mit)
        if (!mit.value().is_string())
          return data_loss(file + ": \"__metadata__\" value for \"" + printable(mit.key()) +
                           "\" is not a string");
      h.metadata = m;
      continue;
    }
    auto t = parse_entry(file, it.key(), it.value());
    if (!t) return t.status();
    if (t->offset_bytes + t->nbytes > buffer_bytes)
      return data_loss(file + ": tensor \"" + printable(t->name) + "\" bytes [" +
                       std::to_string(t->offset_bytes) + ", " +
                       std::to_string(t->offset_bytes + t->nbytes) +
                       ") lie past the end of the data (" + std::to_string(buffer_bytes) +
                       " bytes after the header); file truncated?");
    h.tensors.push_back(std::move(*t));
  }

  // File order; then the tiling check: each tensor starts where the previous one ended.
  std::sort(h.tensors.begin(), h.tensors.end(), [](const TensorInfo& a, const TensorInfo& b) {
    return a.offset_bytes != b.offset_bytes ? a.offset_bytes < b.offset_bytes
                                            : a.nbytes < b.nbytes;
  });
  uint64_t expected_begin = 0;
  const TensorInfo* prev = nullptr;
  for (const auto& t : h.tensors) {
    if (t.offset_bytes < expected_begin)
      return data_loss(file + ": tensors \"" + printable(prev->name) + "\" and \"" +
                       printable(t.name) + "\" overlap at byte " + std::to_string(t.offset_bytes) +
                       " of the data");
    if (t.offset_bytes > expected_begin)
      return data_loss(file + ": data bytes [" + std::to_string(expected_begin) + ", " +
                       std::to_string(t.offset_bytes) + ") belong to no tensor (a hole before \"" +
                       printable(t.name) + "\")");
    expected_begin = t.offset_bytes + t.nbytes;
    prev = &t;
  }
  if (expected_begin != buffer_bytes)
    return data_loss(file + ": " + std::to_string(buffer_bytes - expected_begin) +
                     " trailing data bytes belong to no tensor (tensors end at " +
                     std::to_string(expected_begin) + " of " + std::to_string(buffer_bytes) + ")");
  for (auto& t : h.tensors) t.offset_bytes += buffer_start;
  return h;
}

Result<SafetensorsHeader> read_safetensors_header(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return not_found(path + ": cannot open: " + errno_text());
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    std::string err = errno_text();
    ::close(fd);
    return data_loss(path + ": cannot stat: " + err);
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    return invalid_argument(path + ": not a regular file");
  }
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  uint8_t len_bytes[kLengthFieldBytes];
  std::vector<uint8_t> buf;
  uint64_t to_read = std::min<uint64_t>(size, kLengthFieldBytes);
  if (size >= kLengthFieldBytes && ::pread(fd, len_bytes, kLengthFieldBytes, 0) == kLengthFieldBytes) {
    uint64_t header_len = read_u64_le(len_bytes);
    // Only read what is there and what the format allows; the parser reports the rest.
    if (header_len <= size - kLengthFieldBytes && header_len <= kMaxHeaderBytes)
      to_read = kLengthFieldBytes + header_len;
  }
  buf.resize(to_read);
  uint64_t done = 0;
  while (done < to_read) {
    ssize_t n = ::pread(fd, buf.data() + done, to_read - done, static_cast<off_t>(done));
    if (n <= 0) {
      std::string err = n < 0 ? errno_text() : "unexpected end of file";
      ::close(fd);
      return data_loss(path + ": read failed: " + err);
    }
    done += static_cast<uint64_t>(n);
  }
  ::close(fd);
  return parse_safetensors_header(buf.data(), buf.size(), size, path);
}

Result<std::unique_ptr<SafetensorsFile>> SafetensorsFile::open(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return not_found(path + ": cannot open: " + errno_text());
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    std::string err = errno_text();
    ::close(fd);
    return data_loss(path + ": cannot stat: " + err);
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    return invalid_argument(path + ": not a regular file");
  }
  std::unique_ptr<SafetensorsFile> f(new SafetensorsFile());
  f->path_ = path;
  f->size_ = static_cast<uint64_t>(st.st_size);
  if (f->size_ < kLengthFieldBytes) {
    ::close(fd);
    return data_loss(path + ": truncated: " + std::to_string(f->size_) +
                     " bytes, a safetensors file starts with an 8-byte header length");
  }
  // The whole file is mapped read-only: tensors are used in place, pages come in on demand.
  void* map = ::mmap(nullptr, f->size_, PROT_READ, MAP_PRIVATE, fd, 0);
  std::string err = map == MAP_FAILED ? errno_text() : "";
  ::close(fd);
  if (map == MAP_FAILED) return data_loss(path + ": mmap failed: " + err);
  f->map_ = map;
  auto header = parse_safetensors_header(static_cast<const uint8_t*>(map), f->size_, f->size_, path);
  if (!header) return header.status();  // ~SafetensorsFile unmaps
  f->header_ = std::move(*header);
  for (auto& t : f->header_.tensors) t.data = static_cast<const uint8_t*>(map) + t.offset_bytes;
  return f;
}

SafetensorsFile::~SafetensorsFile() {
  if (map_ != nullptr) ::munmap(map_, size_);
}

const TensorInfo* SafetensorsFile::find(std::string_view name) const {
  for (const auto& t : header_.tensors)
    if (t.name == name) return &t;
  return nullptr;
}

}  // namespace moonrun
