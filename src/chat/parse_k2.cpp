// Kimi K2 completion parser: every marker is one special token, so the state machine
// works on markers directly. What it gives, whole or streamed, follows the peers (vLLM's
// kimi_k2 parser engine and tests, SGLang's KimiK2Detector):
//   reasoning   the text up to </think> (or the tool section); a <think> opener is skipped
//               even after leading white space; trailing white space is dropped;
//   content     the text after </think>, up to the tool section; white space alone before
//               tool calls is layout; text after the tool section is dropped;
//   tool_calls  <|tool_call_begin|>ID<|tool_call_argument_begin|>ARGS<|tool_call_end|>, with
//               or without the section markers around them. The name is ID's part before
//               ":N" (minus "functions."); an ID that names no function (a bare counter, a
//               client's own id) takes the one declared tool whose parameters hold all the
//               argument keys, and is dropped when that is ambiguous. Unfinished calls are
//               dropped.
// No marker ever reaches reasoning or content.
#include "chat/parse_k2.h"

#include <algorithm>
#include <cctype>

#include "chat/parse_markers.h"
#include "chat/py_json.h"

namespace moonrun::chat {
namespace {

enum Marker {
  kThinkOpen = 0,
  kThinkClose,
  kSectionBegin,
  kSectionEnd,
  kCallBegin,
  kArgBegin,
  kCallEnd,
  kImEnd,
  kSectionBeginSingular,  // "<|tool_call_section_begin|>": older K2 checkpoints emit it too
  kSectionEndSingular,
  kImUser,  // a new turn starting: the message is over
  kImAssistant,
  kImSystem,
  kImMiddle,  // layout of a turn header: dropped
};

bool is_blank(std::string_view s) {
  for (char c : s)
    if (c != ' ' && c != '\t' && c != '\n' && c != '\r' && c != '\f' && c != '\v') return false;
  return true;
}

size_t trailing_space(std::string_view s) {
  size_t n = 0;
  while (n < s.size() && is_blank(s.substr(s.size() - n - 1, 1))) ++n;
  return n;
}

// vLLM's `.+:\d+` id: the longest prefix ending in ":DIGITS"; the name is the part before
// the first ':' without "functions.". Empty name: the header names no function.
void split_call_header(std::string_view header, std::string& id, std::string& name) {
  size_t id_end = 0;
  for (size_t p = header.size(); p-- > 1;) {
    if (header[p] != ':' || p + 1 >= header.size() || !std::isdigit(static_cast<unsigned char>(header[p + 1]))) continue;
    size_t e = p + 1;
    while (e < header.size() && std::isdigit(static_cast<unsigned char>(header[e]))) ++e;
    id_end = e;
    break;
  }
  name.clear();
  id = std::string(header);
  if (id_end == 0) return;
  id = std::string(header.substr(0, id_end));
  std::string_view base = header.substr(0, header.find(':'));
  if (base.substr(0, 10) == "functions.") base.remove_prefix(10);
  name = std::string(base);
}

// The declared tool a call without a function name meant: the only one declared, or the
// only one whose parameters hold every argument key (vLLM's tests: ambiguous or
// unparsable arguments with several tools -> no call).
std::string infer_tool_name(std::string_view header, std::string_view args, const std::vector<DeclaredTool>& tools) {
  if (tools.empty()) return "";
  std::string_view bare = header;
  if (bare.substr(0, 10) == "functions.") bare.remove_prefix(10);
  for (const auto& t : tools)
    if (!bare.empty() && t.name == bare) return t.name;  // "functions.NAME" without ":N"
  if (tools.size() == 1) return tools[0].name;
  const auto parsed = py_json_loads(args.empty() ? std::string_view("{}") : args);
  if (!parsed || parsed->kind != PyJson::Kind::kObject) return "";
  const DeclaredTool* found = nullptr;
  for (const auto& t : tools) {
    bool holds_all = true;
    for (const auto& [key, _] : parsed->members)
      holds_all &= std::find(t.properties.begin(), t.properties.end(), key) != t.properties.end();
    if (!holds_all) continue;
    if (found) return "";  // ambiguous
    found = &t;
  }
  return found ? found->name : "";
}

class K2Parser final : public MarkerDrivenParser {
 public:
  explicit K2Parser(const ParseOptions& options)
      : MarkerDrivenParser({"<think>", "</think>", "<|tool_calls_section_begin|>", "<|tool_calls_section_end|>",
                            "<|tool_call_begin|>", "<|tool_call_argument_begin|>", "<|tool_call_end|>", "<|im_end|>",
                            "<|tool_call_section_begin|>", "<|tool_call_section_end|>", "<|im_user|>",
                            "<|im_assistant|>", "<|im_system|>", "<|im_middle|>"}),
        options_(options),
        state_(options.thinking ? State::kReasoning : State::kContent) {}

  // An unterminated message (max_tokens): a half-read call is dropped.
  void on_finish() override { end_message(); }

 private:
  enum class State { kReasoning, kContent, kSection, kCallHeader, kCallArgs, kAfterSection, kDone };

  // ---- reasoning: leading white space waits for a possible <think>, trailing white
  // space for more reasoning (vLLM strips it at the end of the reasoning) ----
  void reasoning_text(std::string_view s) {
    reasoning_tail_ += s;
    const size_t tail = trailing_space(reasoning_tail_);
    if (tail == reasoning_tail_.size()) return;
    out_->reasoning += std::string_view(reasoning_tail_).substr(0, reasoning_tail_.size() - tail);
    reasoning_tail_.erase(0, reasoning_tail_.size() - tail);
    reasoning_seen_ = true;
  }
  void end_reasoning() { reasoning_tail_.clear(); }

  // ---- content: white space is held until what follows decides (dropped when it is all
  // there is before tool calls), so the result does not depend on the chunking ----
  void content_text(std::string_view s) {
    held_space_ += s;
    const size_t tail = trailing_space(held_space_);
    if (tail == held_space_.size()) return;
    out_->content += std::string_view(held_space_).substr(0, held_space_.size() - tail);
    held_space_.erase(0, held_space_.size() - tail);
    content_seen_ = true;
  }
  // Tool calls follow: white space alone was layout; after real content it is content.
  void flush_content_before_tools() {
    if (content_seen_) out_->content += held_space_;
    held_space_.clear();
  }
  // The content ends without tool calls: its white space is kept, as vLLM keeps it.
  void flush_content_at_end() {
    if (num_calls_ == 0 || content_seen_) out_->content += held_space_;
    held_space_.clear();
  }

  void end_message() {
    if (state_ == State::kReasoning) end_reasoning();
    if (state_ == State::kContent) flush_content_at_end();
    state_ = State::kDone;
  }

  void on_piece(const MarkerPiece& p) override {
    int m = p.marker;
    if (m == kSectionBeginSingular) m = kSectionBegin;
    if (m == kSectionEndSingular) m = kSectionEnd;
    if (m == kImUser || m == kImAssistant || m == kImSystem) m = kImEnd;  // a new turn
    switch (state_) {
      case State::kReasoning:
        if (m < 0) return reasoning_text(p.text);
        if (m == kThinkOpen) {
          if (!reasoning_seen_) reasoning_tail_.clear();  // the opener, after layout
          return;
        }
        if (m == kThinkClose) {
          end_reasoning();
          state_ = State::kContent;
          return;
        }
        if (m == kSectionBegin || m == kCallBegin || m == kImEnd) {
          end_reasoning();
          state_ = State::kContent;
          return on_piece(p);
        }
        return;  // any other marker: dropped
      case State::kContent:
        if (m < 0) return content_text(p.text);
        if (m == kThinkOpen && !content_seen_) {  // reasoning although the prompt did not open it
          held_space_.clear();
          state_ = State::kReasoning;
          return;
        }
        if (m == kSectionBegin) {
          flush_content_before_tools();
          state_ = State::kSection;
          return;
        }
        if (m == kCallBegin) {  // a call without its section markers
          flush_content_before_tools();
          return start_call();
        }
        if (m == kImEnd) return end_message();
        return;  // </think> again, stray call markers: dropped
      case State::kSection:
      case State::kAfterSection:
        if (m == kCallBegin) return start_call();
        if (m == kSectionBegin) {
          state_ = State::kSection;
          return;
        }
        if (m == kSectionEnd) {
          state_ = State::kAfterSection;
          return;
        }
        if (m == kImEnd) return end_message();
        return;  // text between calls or after the section: dropped
      case State::kCallHeader:
      case State::kCallArgs:
        if (m == kCallEnd) return close_call(State::kSection);
        if (m == kSectionEnd) return close_call(State::kAfterSection);
        if (m == kCallBegin) return start_call();  // the previous call never ended: dropped
        if (m == kImEnd) return end_message();     // unfinished: dropped
        if (state_ == State::kCallHeader && m == kArgBegin) {
          state_ = State::kCallArgs;
          return;
        }
        (state_ == State::kCallHeader ? header_ : args_) += p.text;
        return;
      case State::kDone:
        return;
    }
  }

  void start_call() {
    state_ = State::kCallHeader;
    header_.clear();
    args_.clear();
  }

  void close_call(State next) {
    state_ = next;
    const std::string_view header = py_strip(header_);
    const std::string_view args = py_strip(args_);
    ParsedToolCall call;
    split_call_header(header, call.id, call.name);
    if (call.name.empty()) call.name = infer_tool_name(header, args, options_.tools);
    if (call.name.empty()) return;  // names no function: dropped
    if (call.id.empty()) call.id = "functions." + call.name + ":" + std::to_string(num_calls_);
    call.arguments = args.empty() ? "{}" : std::string(args);
    if (!options_.tool_calls_allowed) return;
    if (!options_.parallel_tool_calls && num_calls_ >= 1) return;
    out_->tool_calls.push_back(std::move(call));
    ++num_calls_;
  }

  const ParseOptions options_;
  State state_;
  bool reasoning_seen_ = false;
  bool content_seen_ = false;
  std::string reasoning_tail_;
  std::string held_space_;
  std::string header_, args_;
  size_t num_calls_ = 0;
};

}  // namespace

std::unique_ptr<CompletionParser> make_k2_parser(const ParseOptions& options) {
  return std::make_unique<K2Parser>(options);
}

}  // namespace moonrun::chat
