// `moonrun parse`: an assistant completion back to an OpenAI message.
//   moonrun parse --model DIR --text completion.txt [--stream] [--no-thinking]
//   moonrun parse --format kimi_k3 --text completion.txt [--request request.json]
// --request gives the chat request the completion answers, so the text is parsed as the
// server parses it: its tools (K2 calls without a function name are matched to them),
// tool_choice ("none", or no tools: no calls), parallel_tool_calls, and thinking
// (reasoning_effort "none" / chat_template_kwargs) unless --no-thinking is given.
// The completion is what the model generated after the generation prompt, through the end
// marker. Prints {"reasoning_content", "content", "tool_calls"}. --stream feeds the text in
// small chunks (--chunk-bytes, default 4) and prints the message assembled from the
// deltas, which must equal the one-shot result. Tool-call ids come from --id-seed
// (default 0) so runs are reproducible.
#include <cstdio>
#include <fstream>
#include <iostream>
#include <sstream>

#include "chat/chat_request.h"
#include "chat/parse_message.h"
#include "chat/render_chat.h"
#include "cli/commands.h"

namespace moonrun::cli {
namespace {

struct ParseArgs {
  std::string model;
  std::string format;
  std::string text_file;
  std::string request_file;
  bool stream = false;
  bool no_thinking = false;
  size_t chunk_bytes = 4;
  uint64_t id_seed = 0;
};

[[noreturn]] void fail(const Status& st) {
  std::fprintf(stderr, "moonrun parse: %s\n", st.message().c_str());
  throw CLI::RuntimeError(st.code() == StatusCode::kInvalidArgument || st.code() == StatusCode::kNotFound ? 2 : 1);
}

void run(const ParseArgs& a) {
  if (a.model.empty() == a.format.empty()) fail(invalid_argument("give exactly one of --model DIR or --format kimi_k3|kimi_k2"));
  if (a.chunk_bytes == 0) fail(invalid_argument("--chunk-bytes: must be at least 1"));
  auto format = a.format.empty() ? chat::chat_format_for_checkpoint(a.model) : chat::chat_format_from_name(a.format);
  if (!format) fail(format.status());
  auto read = [](const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    if (!in) fail(not_found(path + ": cannot open"));
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
  };
  const std::string text = read(a.text_file);

  chat::ParseOptions options;
  if (!a.request_file.empty()) {
    auto request = chat::parse_chat_request_text(read(a.request_file));
    if (!request) fail(invalid_argument(a.request_file + ": " + request.status().message()));
    options = chat::parse_options_for(*request);
  }
  if (a.no_thinking) options.thinking = false;
  options.id_seed = a.id_seed;
  chat::ParsedMessage message;
  if (a.stream) {
    auto parser = chat::make_completion_parser(*format, options);
    for (size_t at = 0; at < text.size(); at += a.chunk_bytes)
      message.append(parser->feed(std::string_view(text).substr(at, a.chunk_bytes)));
    message.append(parser->finish());
  } else {
    message = chat::parse_completion(*format, text, options);
  }
  std::cout << message.to_json().dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
}

}  // namespace

void add_parse_command(CLI::App& app) {
  auto args = std::make_shared<ParseArgs>();
  auto* cmd = app.add_subcommand("parse", "Parse an assistant completion into reasoning, content and tool calls");
  cmd->add_option("--model", args->model, "checkpoint directory (its config.json picks the chat format)");
  cmd->add_option("--format", args->format, "chat format without a checkpoint: kimi_k3 or kimi_k2");
  cmd->add_option("--text", args->text_file, "file holding the completion text")->required();
  cmd->add_option("--request", args->request_file,
                  "the chat request the completion answers (its tools, tool_choice, thinking)");
  cmd->add_flag("--stream", args->stream, "feed the text in small chunks, as a server streams tokens");
  cmd->add_flag("--no-thinking", args->no_thinking, "the generation prompt opened the response channel, not think");
  cmd->add_option("--chunk-bytes", args->chunk_bytes, "chunk size for --stream (default 4)");
  cmd->add_option("--id-seed", args->id_seed, "seed for tool-call ids (default 0)");
  cmd->callback([args] { run(*args); });
}

}  // namespace moonrun::cli
