// libFuzzer target: the safetensors header parser on arbitrary bytes. Beyond "no crash, no
// sanitizer report", an accepted header must satisfy what the loader relies on: every
// tensor's bytes inside the file, sizes equal to dtype x shape, tensors not overlapping.
#include <cstddef>
#include <cstdint>

#include "model/checkpoint.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace moonrun;
  // The whole input is the file; parse it as the mmap'd reader does.
  auto h = parse_safetensors_header(data, size, size, "fuzz.safetensors");
  if (!h.is_ok()) {
    if (h.status().message().find('\n') != std::string::npos) __builtin_trap();  // one line
    return 0;
  }
  uint64_t prev_end = 8 + h->header_len_bytes;
  for (const auto& t : h->tensors) {
    uint64_t numel = 1;
    for (int64_t d : t.shape) {
      if (d < 0) __builtin_trap();
      numel *= static_cast<uint64_t>(d);
    }
    if (numel * dtype_size_bytes(t.dtype) != t.nbytes) __builtin_trap();
    if (t.offset_bytes < prev_end) __builtin_trap();   // sorted, no overlap, not in the header
    if (t.offset_bytes + t.nbytes > size) __builtin_trap();
    prev_end = t.offset_bytes + t.nbytes;
  }
  // The same bytes seen as a prefix of a longer file must not read past the prefix.
  if (size >= 8) (void)parse_safetensors_header(data, size, size + 4096, "fuzz.safetensors");
  return 0;
}
