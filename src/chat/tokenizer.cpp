#include "chat/tokenizer.h"

#include <algorithm>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "chat/tokenizer_utf8.h"

namespace moonrun::chat {

std::vector<SpecialToken> kimi_k3_default_special_tokens(uint32_t num_base_tokens) {
  // K3_SPEC §4: offsets from the first special id (163584 in the real vocabulary).
  static const std::pair<uint32_t, const char*> kNamed[] = {
      {0, "[BOS]"},          {1, "[EOS]"},        {2, "<|end_of_msg|>"},    {3, "<|open|>"},
      {4, "<|close|>"},      {5, "<|sep|>"},      {18, "<|media_begin|>"},  {19, "<|media_content|>"},
      {20, "<|media_end|>"}, {21, "<|media_pad|>"}, {254, "[UNK]"},         {255, "[PAD]"},
  };
  std::vector<SpecialToken> out;
  for (uint32_t i = 0; i < kNumReservedSpecialTokens; ++i) {
    const uint32_t id = num_base_tokens + i;
    out.push_back({"<|reserved_token_" + std::to_string(id) + "|>", id});
  }
  for (const auto& [offset, name] : kNamed) out[offset].name = name;
  return out;
}

Result<std::vector<SpecialToken>> Tokenizer::special_tokens_from_config(std::string_view config_json,
                                                                       uint32_t num_base_tokens,
                                                                       const std::string& source) {
  const nlohmann::json config = nlohmann::json::parse(config_json, nullptr, /*allow_exceptions=*/false);
  if (config.is_discarded()) return data_loss(source + ": not valid JSON");
  if (!config.is_object()) return data_loss(source + ": expected a JSON object");
  std::vector<SpecialToken> specials;
  for (uint32_t i = 0; i < kNumReservedSpecialTokens; ++i) {
    const uint32_t id = num_base_tokens + i;
    specials.push_back({"<|reserved_token_" + std::to_string(id) + "|>", id});
  }
  auto decoder = config.find("added_tokens_decoder");
  if (decoder == config.end() || decoder->is_null()) {
    return kimi_k3_default_special_tokens(num_base_tokens);
  }
  if (!decoder->is_object()) return data_loss(source + ": added_tokens_decoder must be an object");
  for (const auto& [key, value] : decoder->items()) {
    const std::string field = source + ": added_tokens_decoder[\"" + key + "\"]";
    uint64_t id = 0;
    if (key.empty() || key.size() > 10) return data_loss(field + ": key is not a token id");
    for (char c : key) {
      if (c < '0' || c > '9') return data_loss(field + ": key is not a token id");
      id = id * 10 + uint64_t(c - '0');
    }
    if (!value.is_object() || !value.contains("content") || !value["content"].is_string()) {
      return data_loss(field + ": expected an object with a string \"content\"");
    }
    if (id < num_base_tokens || id >= uint64_t(num_base_tokens) + kNumReservedSpecialTokens) continue;
    specials[id - num_base_tokens].name = value["content"].get<std::string>();
  }
  return specials;
}

Result<Tokenizer> Tokenizer::create(RankTable ranks, std::vector<SpecialToken> specials, TokenizerOptions options) {
  Tokenizer t;
  t.pre_ = MR_TRY(Pretokenizer::compile(options.pattern));
  t.options_ = std::move(options);
  t.special_begin_ = ranks.rank_end();
  uint32_t special_end = ranks.rank_end();
  if (!specials.empty()) {
    t.special_begin_ = UINT32_MAX;
    for (const SpecialToken& s : specials) {
      t.special_begin_ = std::min(t.special_begin_, s.id);
      special_end = std::max(special_end, s.id + 1);
    }
  }
  t.special_names_.assign(special_end - t.special_begin_, std::string());
  t.specials_by_first_byte_.assign(256, {});
  for (SpecialToken& s : specials) {
    if (!ranks.bytes(s.id).empty()) {
      return invalid_argument("special token " + s.name + " has id " + std::to_string(s.id) +
                              ", which is an ordinary token's rank");
    }
    if (s.name.empty()) return invalid_argument("special token " + std::to_string(s.id) + " has an empty name");
    // The same name twice: tokenization_kimi.py's dict keeps the later (larger) id.
    t.special_ids_[s.name] = std::max(t.special_ids_[s.name], s.id);
    t.special_names_[s.id - t.special_begin_] = std::move(s.name);
  }
  for (const auto& [name, id] : t.special_ids_) t.specials_by_first_byte_[uint8_t(name[0])].push_back(id);
  for (auto& ids : t.specials_by_first_byte_) {
    std::sort(ids.begin(), ids.end(), [&](uint32_t a, uint32_t b) {
      const auto& na = t.special_names_[a - t.special_begin_];
      const auto& nb = t.special_names_[b - t.special_begin_];
      return na.size() != nb.size() ? na.size() > nb.size() : a < b;
    });
  }
  t.ranks_ = std::move(ranks);
  return t;
}

Result<Tokenizer> Tokenizer::load_files(const std::filesystem::path& tiktoken_model,
                                        const std::filesystem::path& tokenizer_config, TokenizerOptions options) {
  auto ranks = MR_TRY(RankTable::load(tiktoken_model));
  const uint32_t num_base = uint32_t(ranks.size());
  std::vector<SpecialToken> specials;
  if (tokenizer_config.empty()) {
    specials = kimi_k3_default_special_tokens(num_base);
  } else {
    std::ifstream in(tokenizer_config, std::ios::binary);
    if (!in) return not_found(tokenizer_config.string() + ": cannot open");
    std::ostringstream text;
    text << in.rdbuf();
    specials = MR_TRY(special_tokens_from_config(text.str(), num_base, tokenizer_config.string()));
  }
  if (ranks.rank_end() != num_base) {
    return data_loss(tiktoken_model.string() + ": ranks are not 0.." + std::to_string(num_base - 1) +
                     " (special tokens would collide with them)");
  }
  return create(std::move(ranks), std::move(specials), std::move(options));
}

Result<Tokenizer> Tokenizer::load(const std::filesystem::path& checkpoint_dir, TokenizerOptions options) {
  const auto config = checkpoint_dir / "tokenizer_config.json";
  return load_files(checkpoint_dir / "tiktoken.model", std::filesystem::exists(config) ? config : std::filesystem::path(),
                    std::move(options));
}

std::optional<uint32_t> Tokenizer::special_id(std::string_view name) const {
  auto it = special_ids_.find(std::string(name));
  if (it == special_ids_.end()) return std::nullopt;
  return it->second;
}

std::string_view Tokenizer::token_bytes(uint32_t id) const {
  if (id >= special_begin_ && id - special_begin_ < special_names_.size()) return special_names_[id - special_begin_];
  return ranks_.bytes(id);
}

std::string Tokenizer::decode(std::span<const uint32_t> ids) const {
  std::string out;
  for (uint32_t id : ids) out.append(token_bytes(id));
  return out;
}

std::string Tokenizer::decode_text(std::span<const uint32_t> ids) const { return utf8_replace_invalid(decode(ids)); }

Tokenizer::SpecialMatch Tokenizer::find_special(std::string_view text, size_t from) const {
  for (size_t i = from; i < text.size(); ++i) {
    const auto& candidates = specials_by_first_byte_[uint8_t(text[i])];
    if (candidates.empty()) continue;
    for (uint32_t id : candidates) {
      const std::string& name = special_names_[id - special_begin_];
      if (text.compare(i, name.size(), name) == 0) return {i, name.size(), id};
    }
  }
  return {};
}

void Tokenizer::encode_ordinary(std::string_view text, Pretokenizer::Scratch& scratch,
                                std::vector<uint32_t>& out) const {
  pre_.split(text, scratch, [&](std::string_view piece) { ranks_.encode_piece(piece, out); });
}

// One piece after splitting: ill-formed byte runs are pieces of their own; well-formed
// text is tiktoken's encode (with or without special tokens).
void Tokenizer::encode_run(std::string_view text, bool allow_special, Pretokenizer::Scratch& scratch,
                           std::vector<uint32_t>& out) const {
  for_each_utf8_run(text, [&](std::string_view run, bool well_formed) {
    if (!well_formed) {
      ranks_.encode_piece(run, out);
      return;
    }
    if (!allow_special) {
      encode_ordinary(run, scratch, out);
      return;
    }
    size_t pos = 0;
    while (pos < run.size()) {
      const SpecialMatch m = find_special(run, pos);
      if (m.pos == std::string_view::npos) {
        encode_ordinary(run.substr(pos), scratch, out);
        break;
      }
      encode_ordinary(run.substr(pos, m.pos - pos), scratch, out);
      out.push_back(m.id);
      pos = m.pos + m.length;
    }
  });
}

void Tokenizer::encode_append(std::string_view text, bool allow_special, std::vector<uint32_t>& out) const {
  Pretokenizer::Scratch& scratch = Pretokenizer::thread_scratch();
  const size_t max_run = options_.max_run_chars, chunk = options_.chunk_chars;
  // No character count can exceed the byte count: short texts are never split.
  const bool may_split = (max_run && text.size() > max_run) || (chunk && text.size() > chunk);
  if (!may_split) {
    encode_run(text, allow_special, scratch, out);
    return;
  }
  const auto* p = reinterpret_cast<const unsigned char*>(text.data());
  const size_t n = text.size();
  // A unit is one code point, or one ill-formed byte (counted as non-space).
  auto unit_at = [&](size_t pos, bool* is_space) {
    const size_t len = utf8_sequence_length(p + pos, n - pos);
    *is_space = len != 0 && python_isspace(utf8_decode(p + pos, len));
    return len ? len : 1;
  };
  size_t pos = 0;
  while (pos < n) {
    // One chunk of at most `chunk` units, split into runs as tokenization_kimi.py does.
    size_t units = 0, run_len = 0, piece_start = pos;
    bool run_space = false;
    unit_at(pos, &run_space);
    while (pos < n && (chunk == 0 || units < chunk)) {
      bool space = false;
      const size_t len = unit_at(pos, &space);
      if (space != run_space) {
        run_space = space;
        run_len = 1;
      } else if (++run_len > max_run && max_run != 0) {
        encode_run(text.substr(piece_start, pos - piece_start), allow_special, scratch, out);
        piece_start = pos;
        run_len = 1;
      }
      pos += len;
      ++units;
    }
    encode_run(text.substr(piece_start, pos - piece_start), allow_special, scratch, out);
  }
}

std::vector<uint32_t> Tokenizer::encode(std::string_view text, bool allow_special) const {
  std::vector<uint32_t> out;
  out.reserve(text.size() / 3 + 4);
  encode_append(text, allow_special, out);
  return out;
}

std::vector<uint32_t> Tokenizer::encode(std::span<const Segment> segments) const {
  std::vector<uint32_t> out;
  for (const Segment& s : segments) encode_append(s.text, s.allow_special, out);
  return out;
}

}  // namespace moonrun::chat
