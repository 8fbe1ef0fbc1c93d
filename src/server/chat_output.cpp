#include "server/chat_output.h"

namespace moonrun::server {
namespace {

// Wraps the chat layer's streaming parser and tracks which channel the generation is in,
// so the handler can count reasoning tokens: every token up to the first content or tool
// call of a thinking generation is reasoning (the closing markers included), and so is
// every token from the first reasoning on when a generation without thinking opened a
// think channel itself before replying (the parser gives that as reasoning too).
class Adapter final : public ChatOutputParser {
 public:
  Adapter(chat::ChatFormat format, const chat::ParseOptions& options)
      : parser_(chat::make_completion_parser(format, options)), in_reasoning_(options.thinking) {}

  ParsedDelta feed(std::string_view text) override { return convert(parser_->feed(text)); }
  ParsedDelta finish() override { return convert(parser_->finish()); }
  bool in_reasoning() const override { return in_reasoning_; }

 private:
  ParsedDelta convert(chat::ParseDelta d) {
    if (!d.reasoning.empty() && !replied_) in_reasoning_ = true;
    if (!d.content.empty() || !d.tool_calls.empty()) in_reasoning_ = false, replied_ = true;
    ParsedDelta out;
    out.reasoning = std::move(d.reasoning);
    out.content = std::move(d.content);
    for (auto& c : d.tool_calls) out.tool_calls.push_back({std::move(c.id), std::move(c.name), std::move(c.arguments)});
    return out;
  }
  std::unique_ptr<chat::CompletionParser> parser_;
  bool in_reasoning_;
  bool replied_ = false;  // content or a tool call came: no reasoning follows
};

}  // namespace

std::unique_ptr<ChatOutputParser> make_chat_output_parser(chat::ChatFormat format, const chat::ParseOptions& options) {
  return std::make_unique<Adapter>(format, options);
}

}  // namespace moonrun::server
