// `moonrun render`: the exact prompt an OpenAI chat-completions request becomes.
//   moonrun render --model DIR --request req.json          prompt text, byte for byte
//   moonrun render --format kimi_k3 --request req.json      without a checkpoint
//   --segments   the segments as JSON [[text, allow_special], ...] (what the tokenizer gets)
//   --ids        token ids (needs the checkpoint's tokenizer)
#include <cstdio>
#include <fstream>
#include <iostream>
#include <sstream>

#include "chat/chat_request.h"
#include "chat/render_chat.h"
#include "cli/commands.h"

namespace moonrun::cli {
namespace {

struct RenderArgs {
  std::string model;
  std::string format;
  std::string request_file;
  bool ids = false;
  bool segments = false;
  bool no_generation_prompt = false;
};

[[noreturn]] void fail(const Status& st) {
  std::fprintf(stderr, "moonrun render: %s\n", st.message().c_str());
  throw CLI::RuntimeError(st.code() == StatusCode::kInvalidArgument || st.code() == StatusCode::kNotFound ? 2 : 1);
}

Result<std::string> read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return not_found(path + ": cannot open");
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void run(const RenderArgs& a) {
  if (a.model.empty() == a.format.empty()) fail(invalid_argument("give exactly one of --model DIR or --format kimi_k3|kimi_k2"));
  auto format = a.format.empty() ? chat::chat_format_for_checkpoint(a.model) : chat::chat_format_from_name(a.format);
  if (!format) fail(format.status());
  auto body = read_file(a.request_file);
  if (!body) fail(body.status());
  auto request = chat::parse_chat_request_text(*body);
  if (!request) fail(invalid_argument(a.request_file + ": " + request.status().message()));
  for (const auto& w : request->warnings) std::fprintf(stderr, "warning: %s\n", w.c_str());
  chat::RenderOptions options;
  options.add_generation_prompt = !a.no_generation_prompt;
  auto segments = chat::render_chat(*format, *request, options);
  if (!segments) fail(invalid_argument(a.request_file + ": " + segments.status().message()));
  if (a.ids) {
    fail(unimplemented("--ids: token ids need the tokenizer (src/chat/tokenizer.h), which is not in this build yet"));
  }
  if (a.segments) {
    chat::Json out = chat::Json::array();
    for (const auto& s : *segments) out.push_back(chat::Json::array({s.text, s.allow_special}));
    std::cout << out.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
    return;
  }
  const std::string text = chat::join_segments(*segments);
  std::fwrite(text.data(), 1, text.size(), stdout);
}

}  // namespace

void add_render_command(CLI::App& app) {
  auto args = std::make_shared<RenderArgs>();
  auto* cmd = app.add_subcommand("render", "Print the exact prompt a chat-completions request renders to");
  cmd->add_option("--model", args->model, "checkpoint directory (its config.json picks the chat format)");
  cmd->add_option("--format", args->format, "chat format without a checkpoint: kimi_k3 or kimi_k2");
  cmd->add_option("--request", args->request_file, "OpenAI chat-completions request JSON file")->required();
  cmd->add_flag("--ids", args->ids, "print token ids instead of text");
  cmd->add_flag("--segments", args->segments, "print the segments as JSON [[text, allow_special], ...]");
  cmd->add_flag("--no-generation-prompt", args->no_generation_prompt, "leave out the assistant generation prompt");
  cmd->callback([args] { run(*args); });
}

}  // namespace moonrun::cli
