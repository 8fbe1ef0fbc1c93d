// Single-thread encoding speed of the tokenizer on a corpus file (gen_corpus.mjs framing),
// the counterpart of tiktoken's encode_ordinary timing in docs/performance.md.
//
//   tokenizer_bench RANKS CORPUS kimi|cl100k|o200k [--plain] [--repeat N]
//
// Encodes every well-formed document as ordinary text (no special tokens), N times, and
// prints the best run's throughput. --plain turns off Kimi's 400k/25k input splitting.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "chat/tokenizer.h"
#include "chat/tokenizer_utf8.h"

using namespace moonrun::chat;

int main(int argc, char** argv) {
  if (argc < 4) {
    std::fprintf(stderr, "usage: tokenizer_bench RANKS CORPUS kimi|cl100k|o200k [--plain] [--repeat N]\n");
    return 2;
  }
  TokenizerOptions options;
  const std::string pattern = argv[3];
  options.pattern = pattern == "cl100k" ? kCl100kPattern : pattern == "o200k" ? kO200kPattern : kKimiPattern;
  int repeat = 5;
  for (int i = 4; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--plain") options.max_run_chars = options.chunk_chars = 0;
    if (a == "--repeat" && i + 1 < argc) repeat = std::atoi(argv[++i]);
  }
  auto ranks = RankTable::load(argv[1]);
  if (!ranks.is_ok()) {
    std::fprintf(stderr, "%s\n", ranks.status().to_string().c_str());
    return 1;
  }
  auto tok = Tokenizer::create(std::move(ranks).value(), {}, options);
  if (!tok.is_ok()) {
    std::fprintf(stderr, "%s\n", tok.status().to_string().c_str());
    return 1;
  }
  std::ifstream in(argv[2], std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  const std::string data = s.str();
  std::vector<std::string> docs;
  size_t bytes = 0;
  for (size_t pos = 0; pos < data.size();) {
    const size_t eol = data.find('\n', pos);
    std::istringstream header(data.substr(pos, eol - pos));
    std::string tag, kind;
    size_t index, length;
    int allow;
    header >> tag >> index >> kind >> allow >> length;
    std::string doc = data.substr(eol + 1, length);
    pos = eol + 1 + length + 1;
    if (utf8_replace_invalid(doc) != doc) continue;  // the same documents tiktoken can take
    bytes += doc.size();
    docs.push_back(std::move(doc));
  }
  double best_s = 1e30;
  size_t tokens = 0;
  for (int r = 0; r < repeat; ++r) {
    tokens = 0;
    const auto t0 = std::chrono::steady_clock::now();
    for (const auto& d : docs) tokens += tok->encode(d, false).size();
    const double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    best_s = std::min(best_s, sec);
  }
  std::printf("moonrun %s%s: %zu docs, %zu bytes, %zu tokens, best of %d: %.3f s, %.2f MB/s\n", pattern.c_str(),
              options.max_run_chars ? "" : " (plain)", docs.size(), bytes, tokens, repeat, best_s,
              bytes / best_s / 1e6);
  return 0;
}
