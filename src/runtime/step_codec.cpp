#include "runtime/step_codec.h"

#include <cstring>

namespace moonrun {

namespace {

constexpr uint32_t kMagic = 0x4d525354;  // "MRST"

void put_u32(std::string& out, uint32_t v) { out.append(reinterpret_cast<const char*>(&v), 4); }
void put_i32s(std::string& out, std::span<const int32_t> v) {
  put_u32(out, static_cast<uint32_t>(v.size()));
  out.append(reinterpret_cast<const char*>(v.data()), v.size() * 4);
}

struct Reader {
  const std::string& in;
  size_t at = 0;
  bool ok = true;
  uint32_t u32() {
    if (at + 4 > in.size()) return ok = false, 0;
    uint32_t v;
    std::memcpy(&v, in.data() + at, 4);
    at += 4;
    return v;
  }
  std::vector<int32_t> i32s() {
    const uint32_t n = u32();
    if (!ok || at + static_cast<size_t>(n) * 4 > in.size()) return ok = false, std::vector<int32_t>{};
    std::vector<int32_t> v(n);
    std::memcpy(v.data(), in.data() + at, static_cast<size_t>(n) * 4);
    at += static_cast<size_t>(n) * 4;
    return v;
  }
};

}  // namespace

std::string encode_step(const StepInput& input) {
  std::string out;
  put_u32(out, kMagic);
  put_u32(out, static_cast<uint32_t>(input.seqs.size()));
  for (const StepSeq& s : input.seqs) {
    put_i32s(out, s.new_token_ids);
    put_i32s(out, s.pages);
    put_u32(out, static_cast<uint32_t>(s.n_past));
    put_u32(out, static_cast<uint32_t>(s.state_slot));
    put_u32(out, s.all_logits ? 1u : 0u);
    put_u32(out, static_cast<uint32_t>(s.n_draft));
  }
  for (const auto* copies : {&input.before, &input.after}) {
    put_u32(out, static_cast<uint32_t>(copies->size()));
    for (const StateCopy& c : *copies) {
      put_u32(out, static_cast<uint32_t>(c.src));
      put_u32(out, static_cast<uint32_t>(c.dst));
    }
  }
  put_u32(out, static_cast<uint32_t>(input.replays.size()));
  for (const StateReplay& r : input.replays)
    for (int v : {r.slot, r.snapshot, r.first_row, r.n_tokens}) put_u32(out, static_cast<uint32_t>(v));
  return out;
}

Result<DecodedStep> decode_step(const std::string& bytes) {
  Reader r{bytes};
  if (r.u32() != kMagic || !r.ok) return data_loss("step message: bad header");
  DecodedStep d;
  const uint32_t n = r.u32();
  if (!r.ok || n > (1u << 24)) return data_loss("step message: bad sequence count");
  d.tokens.resize(n);
  d.pages.resize(n);
  d.input.seqs.resize(n);
  for (uint32_t i = 0; i < n; ++i) {
    d.tokens[i] = r.i32s();
    d.pages[i] = r.i32s();
    StepSeq& s = d.input.seqs[i];
    s.n_past = static_cast<int>(r.u32());
    s.state_slot = static_cast<int>(r.u32());
    s.all_logits = r.u32() != 0;
    s.n_draft = static_cast<int>(r.u32());
    s.sample = false;  // node 0 samples
    s.new_token_ids = d.tokens[i];
    s.pages = d.pages[i];
  }
  for (auto* copies : {&d.input.before, &d.input.after}) {
    const uint32_t m = r.u32();
    if (!r.ok || m > (1u << 24)) return data_loss("step message: bad copy count");
    for (uint32_t i = 0; i < m; ++i) {
      const int src = static_cast<int>(r.u32());
      const int dst = static_cast<int>(r.u32());
      copies->push_back({src, dst});
    }
  }
  const uint32_t n_replays = r.u32();
  if (!r.ok || n_replays > (1u << 24)) return data_loss("step message: bad replay count");
  for (uint32_t i = 0; i < n_replays; ++i) {
    StateReplay rp;
    rp.slot = static_cast<int>(r.u32());
    rp.snapshot = static_cast<int>(r.u32());
    rp.first_row = static_cast<int>(r.u32());
    rp.n_tokens = static_cast<int>(r.u32());
    d.input.replays.push_back(rp);
  }
  if (!r.ok || r.at != bytes.size()) return data_loss("step message: truncated or trailing bytes");
  return d;
}

}  // namespace moonrun
