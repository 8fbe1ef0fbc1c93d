// Kimi K2 completion parser: every marker is one special token, so the state machine
// works on markers directly.
#include "chat/parse_k2.h"

#include "chat/parse_markers.h"

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
};

bool has_non_space(std::string_view s) {
  for (char c : s)
    if (c != ' ' && c != '\t' && c != '\n' && c != '\r' && c != '\f' && c != '\v') return true;
  return false;
}

// "functions.get_weather:0" -> id as written, name "get_weather". The id is the longest
// prefix ending in ":DIGITS" (vLLM's `.+:\d+`); without one the header is the name.
void split_call_header(std::string_view header, size_t call_index, std::string& id, std::string& name) {
  header = py_strip(header);
  size_t id_end = 0;
  for (size_t p = header.size(); p-- > 1;) {
    if (header[p] != ':' || p + 1 >= header.size() || !std::isdigit(static_cast<unsigned char>(header[p + 1]))) continue;
    size_t e = p + 1;
    while (e < header.size() && std::isdigit(static_cast<unsigned char>(header[e]))) ++e;
    id_end = e;
    break;
  }
  std::string_view base = id_end ? header.substr(0, header.find(':')) : header;
  if (base.substr(0, 10) == "functions.") base.remove_prefix(10);
  name = std::string(base);
  id = id_end ? std::string(header.substr(0, id_end)) : "functions." + name + ":" + std::to_string(call_index);
}

class K2Parser final : public MarkerDrivenParser {
 public:
  explicit K2Parser(const ParseOptions& options)
      : MarkerDrivenParser({"<think>", "</think>", "<|tool_calls_section_begin|>", "<|tool_calls_section_end|>",
                "<|tool_call_begin|>", "<|tool_call_argument_begin|>", "<|tool_call_end|>", "<|im_end|>",
                "<|tool_call_section_begin|>", "<|tool_call_section_end|>"}),
        state_(options.thinking ? State::kReasoning : State::kContent) {}

  // An unterminated message: a half-read call is content after all.
  void on_finish() override {
    if (state_ == State::kCallHeader || state_ == State::kCallArgs) abandon_call();
    if (state_ == State::kContent) flush_trailing_space();
    held_space_.clear();
  }

 private:
  enum class State { kReasoning, kContent, kSection, kCallHeader, kCallArgs, kDone };

  void emit_reasoning(std::string_view s) {
    if (s.empty()) return;
    out_->reasoning += s;
    reasoning_seen_ = true;
  }
  void emit_content(std::string_view s) {
    if (!s.empty()) out_->content += s;
  }
  // Content is held while it is only white space: white space alone before the tool
  // section is layout (vLLM drops it), and between sections it is dropped the same way.
  // Trailing white space stays held until what follows decides, so the result does not
  // depend on where the chunks were cut.
  void content_text(std::string_view s) {
    held_space_ += s;
    size_t last = held_space_.size();
    while (last > 0 && !has_non_space(std::string_view(held_space_).substr(last - 1, 1))) --last;
    if (last == 0) return;
    emit_content(std::string_view(held_space_).substr(0, last));
    held_space_.erase(0, last);
    content_seen_ = true;
  }
  void stray(std::string_view s) { content_text(s); }
  // White space at the end of the content is content, unless it only follows tool calls.
  void flush_trailing_space() {
    if (content_seen_ || num_calls_ == 0) emit_content(held_space_);
    held_space_.clear();
  }

  void on_piece(const MarkerPiece& p) override {
    int m = p.marker;
    if (m == kSectionBeginSingular) m = kSectionBegin;
    if (m == kSectionEndSingular) m = kSectionEnd;
    switch (state_) {
      case State::kReasoning:
        if (m < 0) return emit_reasoning(p.text);
        if (m == kThinkOpen && !reasoning_seen_) return;  // the opening <think>
        if (m == kThinkClose) return set(State::kContent);
        if (m == kSectionBegin) return set(State::kSection);
        if (m == kImEnd) return set(State::kDone);
        return emit_reasoning(p.text);
      case State::kContent:
        if (m < 0) return content_text(p.text);
        if (m == kSectionBegin) {
          if (content_seen_) emit_content(held_space_);  // only all-white-space content is dropped
          return set(State::kSection);
        }
        if (m == kImEnd) {
          flush_trailing_space();
          return set(State::kDone);
        }
        return content_text(p.text);
      case State::kSection:
        if (m == kCallBegin) return start_call(p.text);
        if (m == kSectionEnd) return set(State::kContent);
        if (m == kImEnd) return set(State::kDone);
        return stray(p.text);
      case State::kCallHeader:
      case State::kCallArgs:
        if (m == kCallEnd) return close_call(State::kSection);
        if (m == kSectionEnd) return close_call(State::kContent);
        if (m == kCallBegin) {  // the previous call never closed: it ends here
          close_call(State::kSection);
          return start_call(p.text);
        }
        if (m == kImEnd) {
          abandon_call();
          return set(State::kDone);
        }
        call_raw_ += p.text;
        if (state_ == State::kCallHeader && m == kArgBegin) return set(State::kCallArgs);
        (state_ == State::kCallHeader ? header_ : args_) += p.text;
        return;
      case State::kDone:
        return stray(p.text);
    }
  }

  void set(State s) {
    held_space_.clear();
    state_ = s;
  }

  void start_call(const std::string& marker) {
    set(State::kCallHeader);
    call_raw_ = marker;
    header_.clear();
    args_.clear();
  }

  void close_call(State next) {
    ParsedToolCall call;
    split_call_header(header_, num_calls_, call.id, call.name);
    if (call.name.empty()) {
      abandon_call();
      return set(next);
    }
    const std::string_view args = py_strip(args_);
    call.arguments = args.empty() ? "{}" : std::string(args);
    out_->tool_calls.push_back(std::move(call));
    ++num_calls_;
    call_raw_.clear();
    set(next);
  }

  void abandon_call() {
    emit_content(call_raw_);
    call_raw_.clear();
    state_ = State::kSection;
  }

  State state_;
  bool reasoning_seen_ = false;
  bool content_seen_ = false;
  std::string held_space_;
  std::string call_raw_, header_, args_;
  size_t num_calls_ = 0;
};

}  // namespace

std::unique_ptr<CompletionParser> make_k2_parser(const ParseOptions& options) {
  return std::make_unique<K2Parser>(options);
}

}  // namespace moonrun::chat
