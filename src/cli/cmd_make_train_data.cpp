// `moonrun make-train-data`: chat conversations (JSONL of chat-completions requests that
// include the assistant turns to learn) -> token ids and a loss mask, rendered by the
// server's own chat pipeline (server::chat_prompt: the K3 chat format, the tokenizer, image
// placeholders expanded to their rows). Training on what the server renders means the
// model never sees a prompt shape at training time that the server would not build.
//
//   moonrun make-train-data --model DIR --in conv.jsonl --corpus-out corpus.txt
//       the conversations' ordinary text (between the special markers), for train-tokenizer
//   moonrun make-train-data --model DIR --in conv.jsonl --out DATA
//       DATA/ids.u32, DATA/mask.u8 (1: the token is a target), DATA/docs.json
//
// The targets of an assistant message are the tokens between the prompt the server would
// send for it (the messages before it plus the generation prompt) and the end of the
// message (its <|end_of_msg|>); the command checks that the first is a prefix of the
// second and of the whole conversation, so masks cannot drift off the text.
// `moonrun train-tokenizer --corpus FILE --merges N --out DIR`: the byte-level BPE
// (chat/bpe_train.h) on that corpus with Kimi's pre-tokenisation, as tiktoken.model plus
// tokenizer_config.json with the 256 K3 special tokens.
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "chat/bpe_train.h"
#include "chat/chat_request.h"
#include "chat/pretokenize.h"
#include "chat/render_chat.h"
#include "chat/tokenizer.h"
#include "cli/commands.h"
#include "model/config.h"
#include "model/demo_model.h"
#include "model/vision/placeholders.h"
#include "server/chat_pipeline.h"
#include "server/image_input.h"
#include "server/serving_context.h"

namespace moonrun::cli {
namespace {

using json = nlohmann::json;

[[noreturn]] void fail(const char* command, const std::string& message) {
  std::fprintf(stderr, "moonrun %s: %s\n", command, message.c_str());
  throw CLI::RuntimeError(2);
}

struct TrainDataArgs {
  std::string model, in, out, corpus_out;
  int max_len = 1024;
};

// The serving context the chat pipeline needs: format, tokenizer, images. No engine.
server::ServingContext pipeline_context(const std::string& dir, bool with_tokenizer) {
  server::ServingContext ctx;
  auto format = chat::chat_format_for_checkpoint(dir);
  if (!format.is_ok()) fail("make-train-data", format.status().message());
  ctx.chat_format = *format;
  if (with_tokenizer) {
    auto tok = chat::Tokenizer::load(dir);
    if (!tok.is_ok()) fail("make-train-data", tok.status().message());
    ctx.tokenizer = std::make_shared<const chat::Tokenizer>(std::move(tok).value());
  }
  auto cfg = load_model_config(dir + "/config.json");
  if (!cfg.is_ok()) fail("make-train-data", cfg.status().message());
  if (cfg->vision.enabled) {
    auto images = server::image_input_config(dir, *cfg);
    if (!images.is_ok()) fail("make-train-data", images.status().message());
    ctx.images = std::make_shared<const server::ImageInputConfig>(std::move(images).value());
  }
  return ctx;
}

chat::ChatRequest first_messages(const chat::ChatRequest& r, size_t n) {
  chat::ChatRequest out = r;
  out.messages.resize(n);
  return out;
}

bool is_prefix(const std::vector<int32_t>& p, const std::vector<int32_t>& of) {
  return p.size() <= of.size() && std::equal(p.begin(), p.end(), of.begin());
}

// The images of a request in prompt order, as the training script needs them: the bytes
// (base64, as sent), the grid, the rows, where the rows sit, and a checksum of the
// processor's output so a Python preprocessing can prove it matches this one.
json image_entries(const chat::ChatRequest& request, const server::ChatPrompt& prompt) {
  json out = json::array();
  if (!prompt.images) return out;
  const auto positions = vision::placeholder_positions(prompt.prompt_ids, prompt.images->placeholder_id);
  size_t next_row = 0, k = 0;
  for (const auto& m : request.messages) {
    for (const auto& part : m.content.parts) {
      if (part.kind != chat::ContentPart::Kind::kImage) continue;
      const vision::ImagePatches& im = prompt.images->images.at(k++);
      double sum = 0, sum_sq = 0;
      for (float v : im.values) sum += v, sum_sq += double(v) * v;
      const std::string& url = part.image_url;
      json e = {{"data_url", url},
                {"width", im.width},
                {"height", im.height},
                {"grid_hw", {im.grid_h, im.grid_w}},
                {"n_rows", im.num_tokens},
                {"first_row_position", positions.at(next_row)},
                {"pixel_sum", sum},
                {"pixel_sum_sq", sum_sq}};
      next_row += static_cast<size_t>(im.num_tokens);
      out.push_back(std::move(e));
    }
  }
  return out;
}

void write_file(const std::string& path, const void* data, size_t bytes) {
  std::ofstream f(path, std::ios::binary);
  f.write(static_cast<const char*>(data), static_cast<std::streamsize>(bytes));
  if (!f) fail("make-train-data", path + ": cannot write");
}

void run_make_train_data(const TrainDataArgs& a) {
  const bool corpus = !a.corpus_out.empty();
  if (corpus == !a.out.empty()) fail("make-train-data", "give exactly one of --out DIR or --corpus-out FILE");
  server::ServingContext ctx = pipeline_context(a.model, !corpus);
  std::ifstream in(a.in);
  if (!in) fail("make-train-data", a.in + ": cannot open");
  std::ofstream corpus_file;
  std::vector<std::string> markers;  // the named K3 special tokens (<|open|>, <|sep|>, ...)
  if (corpus) {
    corpus_file.open(a.corpus_out, std::ios::binary);
    for (const auto& t : chat::kimi_k3_default_special_tokens(0))
      if (t.name.rfind("<|reserved_token_", 0) != 0) markers.push_back(t.name);
  }

  std::vector<uint32_t> ids;
  std::vector<uint8_t> mask;
  json docs = json::array();
  int64_t n_lines = 0, n_too_long = 0, n_targets = 0;
  std::string line;
  while (std::getline(in, line)) {
    ++n_lines;
    if (line.empty()) continue;
    const std::string where = a.in + ":" + std::to_string(n_lines);
    auto request = chat::parse_chat_request_text(line);
    if (!request.is_ok()) fail("make-train-data", where + ": " + request.status().message());
    chat::RenderOptions whole;
    whole.add_generation_prompt = false;
    if (corpus) {
      // Image prompts need the images' sizes: decoded here as the server would.
      for (const auto& m : request->messages)
        for (const auto& part : m.content.parts) {
          if (part.kind != chat::ContentPart::Kind::kImage) continue;
          auto im = server::load_image(part.image_url, *ctx.images, where);
          if (!im.is_ok()) fail("make-train-data", im.status().message());
          whole.image_prompts.push_back(vision::image_prompt(im->width, im->height));
        }
      auto segments = chat::render_chat(ctx.chat_format, *request, whole);
      if (!segments.is_ok()) fail("make-train-data", where + ": " + segments.status().message());
      // Special markers are not BPE text: cut the special segments at them.
      for (const auto& s : *segments) {
        std::string text = s.text;
        if (s.allow_special)
          for (const std::string& marker : markers)
            for (size_t p; (p = text.find(marker)) != std::string::npos;) text.replace(p, marker.size(), "\n");
        corpus_file << text << '\n';
      }
      continue;
    }
    auto full = server::chat_prompt(ctx, *request, whole);
    if (!full.is_ok()) fail("make-train-data", where + ": " + full.status().message());
    std::vector<uint8_t> doc_mask(full->prompt_ids.size(), 0);
    for (size_t i = 0; i < request->messages.size(); ++i) {
      if (request->messages[i].role != chat::Role::kAssistant) continue;
      chat::RenderOptions gen;
      gen.add_generation_prompt = true;
      auto prompt = server::chat_prompt(ctx, first_messages(*request, i), gen);
      auto upto = server::chat_prompt(ctx, first_messages(*request, i + 1), whole);
      if (!prompt.is_ok() || !upto.is_ok())
        fail("make-train-data", where + ": " + (prompt.is_ok() ? upto.status() : prompt.status()).message());
      if (!is_prefix(prompt->prompt_ids, upto->prompt_ids) || !is_prefix(upto->prompt_ids, full->prompt_ids))
        fail("make-train-data", where + ": message " + std::to_string(i) +
                                    ": the generation prompt is not a prefix of the rendered assistant message");
      for (size_t t = prompt->prompt_ids.size(); t < upto->prompt_ids.size(); ++t) doc_mask[t] = 1;
    }
    if (static_cast<int>(full->prompt_ids.size()) > a.max_len) {
      ++n_too_long;
      continue;
    }
    docs.push_back({{"offset", ids.size()}, {"length", full->prompt_ids.size()},
                    {"images", image_entries(*request, *full)}});
    for (int32_t id : full->prompt_ids) ids.push_back(static_cast<uint32_t>(id));
    for (uint8_t m : doc_mask) n_targets += m;
    mask.insert(mask.end(), doc_mask.begin(), doc_mask.end());
  }
  if (corpus) {
    std::fprintf(stderr, "make-train-data: %lld conversations -> %s\n", static_cast<long long>(n_lines),
                 a.corpus_out.c_str());
    return;
  }
  std::filesystem::create_directories(a.out);
  write_file(a.out + "/ids.u32", ids.data(), ids.size() * sizeof(uint32_t));
  write_file(a.out + "/mask.u8", mask.data(), mask.size());
  const json meta = {{"vocab_size", ctx.tokenizer->vocab_size()},
                     {"placeholder_id", ctx.images ? ctx.images->placeholder_id : -1},
                     {"source", a.in},
                     {"max_len", a.max_len},
                     {"docs", docs}};
  std::ofstream(a.out + "/docs.json") << meta.dump();
  std::fprintf(stderr, "make-train-data: %zu conversations, %zu tokens (%lld targets), %lld over --max-len %d\n",
               docs.size(), ids.size(), static_cast<long long>(n_targets), static_cast<long long>(n_too_long),
               a.max_len);
}

}  // namespace

void add_make_train_data_command(CLI::App& app) {
  auto a = std::make_shared<TrainDataArgs>();
  auto* cmd = app.add_subcommand("make-train-data",
                                 "Render chat conversations (JSONL) into token ids and a loss mask for training");
  cmd->add_option("--model", a->model, "checkpoint directory: its chat format, tokenizer and image processor")
      ->required();
  cmd->add_option("--in", a->in, "conversations, one chat-completions request per line")->required();
  cmd->add_option("--out", a->out, "output directory: ids.u32, mask.u8, docs.json");
  cmd->add_option("--corpus-out", a->corpus_out, "write the conversations' plain text (for train-tokenizer)");
  cmd->add_option("--max-len", a->max_len, "drop conversations longer than this many tokens");
  cmd->callback([a] { run_make_train_data(*a); });

  auto corpus = std::make_shared<std::string>();
  auto out = std::make_shared<std::string>();
  auto merges = std::make_shared<size_t>(2048);
  auto* tok = app.add_subcommand("train-tokenizer", "Train a byte-level BPE (tiktoken.model) with the K3 specials");
  tok->add_option("--corpus", *corpus, "text file")->required();
  tok->add_option("--merges", *merges, "BPE merges to learn");
  tok->add_option("--out", *out, "output directory: tiktoken.model, tokenizer_config.json")->required();
  tok->callback([corpus, out, merges] {
    std::ifstream f(*corpus, std::ios::binary);
    if (!f) fail("train-tokenizer", *corpus + ": cannot open");
    std::stringstream ss;
    ss << f.rdbuf();
    auto ranks = chat::train_bpe_ranks(ss.str(), *merges, chat::kKimiPattern);
    if (!ranks.is_ok()) fail("train-tokenizer", ranks.status().message());
    std::filesystem::create_directories(*out);
    Status st = chat::write_tiktoken_model(*out + "/tiktoken.model", *ranks);
    if (!st.is_ok()) fail("train-tokenizer", st.message());
    std::ofstream(*out + "/tokenizer_config.json") << demo_tokenizer_config(static_cast<int>(ranks->size())).dump(1);
    std::fprintf(stderr, "train-tokenizer: %zu ranks (+256 special tokens) -> %s\n", ranks->size(), out->c_str());
  });
}

}  // namespace moonrun::cli
