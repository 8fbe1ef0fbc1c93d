// Compares moonrun's tokenizer with token ids recorded by a reference tokenizer
// (js-tiktoken here in CI; Python tiktoken / tokenization_kimi.py for the Kimi fixtures).
//
//   tokenizer_js_check check --ranks F --specials F.json|k3-defaults --pattern cl100k|o200k|kimi
//                            [--plain] --corpus C --ids I
//   tokenizer_js_check train --corpus C --merges N --out F   (a test vocabulary)
//
// --ids lines: "<doc> <id> <id> ..." (exact ids), "<doc> skip" (the reference could not
// encode it), or "<doc> h <count> <fnv1a64 hex>" (a compact digest of the reference ids:
// FNV-1a over the ids as little-endian u32). Every document, skipped or not, must also
// decode back to its exact bytes. --plain turns off Kimi's 400k/25k input splitting
// (tiktoken's public encodings have none).
#include <cinttypes>
#include <cstdio>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "chat/bpe_train.h"
#include "chat/tokenizer.h"

using namespace moonrun;
using namespace moonrun::chat;

namespace {

struct Doc {
  size_t index;
  std::string kind;
  bool allow_special;
  std::string bytes;
};

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    std::fprintf(stderr, "%s: cannot open\n", path.c_str());
    std::exit(2);
  }
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

std::vector<Doc> read_corpus(const std::string& path) {
  const std::string data = read_file(path);
  std::vector<Doc> docs;
  size_t pos = 0;
  while (pos < data.size()) {
    const size_t eol = data.find('\n', pos);
    std::istringstream header(data.substr(pos, eol - pos));
    std::string tag;
    Doc d;
    int allow = 0;
    size_t length = 0;
    header >> tag >> d.index >> d.kind >> allow >> length;
    if (tag != "#doc" || eol == std::string::npos || eol + 1 + length > data.size()) {
      std::fprintf(stderr, "%s: bad document header at byte %zu\n", path.c_str(), pos);
      std::exit(2);
    }
    d.allow_special = allow == 1;
    d.bytes = data.substr(eol + 1, length);
    pos = eol + 1 + length + 1;
    docs.push_back(std::move(d));
  }
  return docs;
}

uint64_t fnv1a(const std::vector<uint32_t>& ids) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (uint32_t id : ids) {
    for (int b = 0; b < 4; ++b) {
      h ^= (id >> (8 * b)) & 0xFF;
      h *= 0x100000001b3ull;
    }
  }
  return h;
}

std::string arg(const std::map<std::string, std::string>& args, const std::string& key) {
  auto it = args.find(key);
  if (it == args.end()) {
    std::fprintf(stderr, "missing %s\n", key.c_str());
    std::exit(2);
  }
  return it->second;
}

int train(const std::map<std::string, std::string>& args) {
  std::string text;
  for (const Doc& d : read_corpus(arg(args, "--corpus"))) text += d.bytes;
  auto tokens = train_bpe_ranks(text, std::stoul(arg(args, "--merges")), kKimiPattern);
  if (!tokens.is_ok()) {
    std::fprintf(stderr, "%s\n", tokens.status().to_string().c_str());
    return 1;
  }
  const Status st = write_tiktoken_model(arg(args, "--out"), *tokens);
  if (!st.is_ok()) {
    std::fprintf(stderr, "%s\n", st.to_string().c_str());
    return 1;
  }
  std::fprintf(stderr, "train: %zu ranks\n", tokens->size());
  return 0;
}

int check(const std::map<std::string, std::string>& args) {
  auto ranks = RankTable::load(arg(args, "--ranks"));
  if (!ranks.is_ok()) {
    std::fprintf(stderr, "%s\n", ranks.status().to_string().c_str());
    return 2;
  }
  // --specials FILE.json ({"name": id}) or "k3-defaults" (the K3 names after the base ranks).
  std::vector<SpecialToken> specials;
  if (arg(args, "--specials") == "k3-defaults") {
    specials = kimi_k3_default_special_tokens(uint32_t(ranks->size()));
  } else {
    const auto special_json = nlohmann::json::parse(read_file(arg(args, "--specials")));
    for (const auto& [name, id] : special_json.items()) specials.push_back({name, id.get<uint32_t>()});
  }

  TokenizerOptions options;
  const std::string pattern = arg(args, "--pattern");
  options.pattern = pattern == "cl100k" ? kCl100kPattern : pattern == "o200k" ? kO200kPattern : kKimiPattern;
  if (args.count("--plain")) options.max_run_chars = options.chunk_chars = 0;
  auto tok = Tokenizer::create(std::move(ranks).value(), specials, options);
  if (!tok.is_ok()) {
    std::fprintf(stderr, "%s\n", tok.status().to_string().c_str());
    return 2;
  }

  const auto docs = read_corpus(arg(args, "--corpus"));
  std::map<size_t, std::string> expected;  // doc index -> rest of its ids line
  {
    std::istringstream lines(read_file(arg(args, "--ids")));
    std::string line;
    while (std::getline(lines, line)) {
      const size_t space = line.find(' ');
      if (space == std::string::npos) continue;
      expected[std::stoul(line.substr(0, space))] = line.substr(space + 1);
    }
  }

  size_t compared = 0, compared_bytes = 0, failures = 0, tokens = 0;
  for (const Doc& d : docs) {
    const auto ids = tok->encode(d.bytes, d.allow_special);
    tokens += ids.size();
    if (tok->decode(ids) != d.bytes) {
      std::fprintf(stderr, "doc %zu (%s): decode(encode(text)) != text\n", d.index, d.kind.c_str());
      ++failures;
    }
    auto it = expected.find(d.index);
    if (it == expected.end()) {
      std::fprintf(stderr, "doc %zu (%s): no reference ids\n", d.index, d.kind.c_str());
      ++failures;
      continue;
    }
    std::istringstream ref(it->second);
    std::string first;
    ref >> first;
    if (first == "skip") continue;
    bool same;
    std::string detail;
    if (first == "h") {
      size_t count = 0;
      std::string hex;
      ref >> count >> hex;
      char ours[17];
      std::snprintf(ours, sizeof(ours), "%016" PRIx64, fnv1a(ids));
      same = count == ids.size() && hex == ours;
      detail = "reference " + std::to_string(count) + " ids, digest " + hex + "; ours " + std::to_string(ids.size()) +
               " ids, digest " + ours;
    } else {
      std::vector<uint32_t> want;
      if (!first.empty()) want.push_back(uint32_t(std::stoul(first)));
      uint32_t id;
      while (ref >> id) want.push_back(id);
      same = want == ids;
      if (!same) {
        size_t at = 0;
        while (at < want.size() && at < ids.size() && want[at] == ids[at]) ++at;
        detail = "first difference at id " + std::to_string(at) + " of " + std::to_string(want.size()) + ": want " +
                 (at < want.size() ? std::to_string(want[at]) : "end") + " (" +
                 (at < want.size() ? std::string(tok->token_bytes(want[at])) : "") + "), got " +
                 (at < ids.size() ? std::to_string(ids[at]) : "end") + " (" +
                 (at < ids.size() ? std::string(tok->token_bytes(ids[at])) : "") + ")";
      }
    }
    if (!same) {
      if (failures < 20) std::fprintf(stderr, "doc %zu (%s): ids differ: %s\n", d.index, d.kind.c_str(), detail.c_str());
      ++failures;
    }
    ++compared;
    compared_bytes += d.bytes.size();
  }
  std::fprintf(stderr, "tokenizer_js_check: %zu documents (%zu bytes, %zu tokens) compared, %zu failures\n", compared,
               compared_bytes, tokens, failures);
  return failures == 0 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: tokenizer_js_check check|train --flag value...\n");
    return 2;
  }
  std::map<std::string, std::string> args;
  for (int i = 2; i < argc; ++i) {
    std::string key = argv[i];
    if (key == "--plain") {
      args[key] = "1";
    } else if (i + 1 < argc) {
      args[key] = argv[++i];
    }
  }
  const std::string mode = argv[1];
  if (mode == "train") return train(args);
  if (mode == "check") return check(args);
  std::fprintf(stderr, "unknown mode %s\n", mode.c_str());
  return 2;
}
