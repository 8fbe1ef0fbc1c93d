// Kimi K3 completion parser: a state machine over markers and tag headers.
//
// A tag is <|open|>HEADER<|sep|> or <|close|>NAME<|sep|>; the header is held until its
// <|sep|> arrives (or proves it is not a tag: another marker first, or too long), then the
// current state decides whether the tag is structure or literal text of the channel.
#include "chat/parse_k3.h"

#include "chat/parse_markers.h"

namespace moonrun::chat {
namespace {

enum Marker { kOpen = 0, kClose = 1, kSep = 2, kEnd = 3 };

// A header longer than this is not a tag (tool names and keys are short); its text is
// released as literal text instead of being held back indefinitely.
constexpr size_t kMaxHeaderBytes = 4096;

bool is_ascii_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }

size_t last_non_space(std::string_view s) {
  for (size_t i = s.size(); i-- > 0;)
    if (!is_ascii_space(s[i])) return i;
  return std::string_view::npos;
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && is_ascii_space(s.front())) s.remove_prefix(1);
  while (!s.empty() && is_ascii_space(s.back())) s.remove_suffix(1);
  return s;
}

std::string unescape_attr(std::string_view v) {
  std::string out;
  for (size_t i = 0; i < v.size();) {
    if (v.compare(i, 5, "&amp;") == 0) { out.push_back('&'); i += 5; }
    else if (v.compare(i, 6, "&quot;") == 0) { out.push_back('"'); i += 6; }
    else out.push_back(v[i++]);
  }
  return out;
}

bool is_word(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_';
}

// key="value" pairs, in the manner of vLLM's (\w+)="([^"]*)" scan: anything that is not
// such a pair (unknown junk, a stray quote) is skipped; a repeated key keeps its last value.
std::vector<std::pair<std::string, std::string>> parse_attrs(std::string_view s) {
  std::vector<std::pair<std::string, std::string>> out;
  size_t i = 0;
  while (i < s.size()) {
    if (!is_word(s[i])) { ++i; continue; }
    size_t k = i;
    while (k < s.size() && is_word(s[k])) ++k;
    if (k + 1 < s.size() && s[k] == '=' && s[k + 1] == '"') {
      const size_t close = s.find('"', k + 2);
      if (close != std::string_view::npos) {
        out.emplace_back(std::string(s.substr(i, k - i)), unescape_attr(s.substr(k + 2, close - k - 2)));
        i = close + 1;
        continue;
      }
    }
    i = k;
  }
  return out;
}

std::string attr(const std::vector<std::pair<std::string, std::string>>& attrs, std::string_view key,
                 std::string fallback) {
  for (auto it = attrs.rbegin(); it != attrs.rend(); ++it)
    if (it->first == key) return it->second;
  return fallback;
}

class K3Parser final : public MarkerDrivenParser {
 public:
  explicit K3Parser(const ParseOptions& options)
      : MarkerDrivenParser({"<|open|>", "<|close|>", "<|sep|>", "<|end_of_msg|>"}),
        state_(options.thinking ? State::kReasoning : State::kResponse),
        ids_(options.id_seed) {}

  // An unterminated message: a held tag and a half-read call are released as they stand.
  void on_finish() override {
    if (tag_pending_) release_pending_tag();
    if (in_call()) abandon_call();
    held_space_.clear();  // white space between structural elements
  }

 private:
  enum class State { kReasoning, kTop, kResponse, kTools, kCall, kArgument, kJson, kAfterMessage, kDone };

  bool in_call() const { return state_ == State::kCall || state_ == State::kArgument || state_ == State::kJson; }

  // ---- pieces -> text / tags / end ----
  void on_piece(const MarkerPiece& p) override {
    switch (p.marker) {
      case -1:
        if (!tag_pending_) {
          on_text(p.text);
        } else {
          tag_header_ += p.text;
          if (tag_header_.size() > kMaxHeaderBytes) release_pending_tag();
        }
        break;
      case kOpen:
      case kClose:
        if (tag_pending_) release_pending_tag();
        tag_pending_ = true;
        tag_is_open_ = p.marker == kOpen;
        tag_header_.clear();
        break;
      case kSep:
        if (tag_pending_) {
          tag_pending_ = false;
          const std::string raw = (tag_is_open_ ? "<|open|>" : "<|close|>") + tag_header_ + "<|sep|>";
          on_tag(tag_is_open_, tag_header_, raw);
        } else {
          on_text(p.text);
        }
        break;
      case kEnd:
        if (tag_pending_) release_pending_tag();
        on_end();
        break;
    }
  }

  void release_pending_tag() {
    tag_pending_ = false;
    on_text((tag_is_open_ ? "<|open|>" : "<|close|>") + tag_header_);
  }

  // ---- output ----
  void emit_reasoning(std::string_view s) {
    if (s.empty()) return;
    out_->reasoning += s;
    reasoning_seen_ = true;
  }
  void emit_content(std::string_view s) {
    if (s.empty()) return;
    out_->content += s;
    response_has_text_ = true;
  }
  // Text outside any channel: white space there is layout and is dropped, anything else is
  // kept as content so that nothing the model wrote is lost.
  // Trailing white space stays held until what follows decides, so the result does not
  // depend on where the chunks were cut.
  void stray(std::string_view s) {
    held_space_ += s;
    const size_t last = last_non_space(held_space_);
    if (last == std::string::npos) return;
    emit_content(std::string_view(held_space_).substr(0, last + 1));
    held_space_.erase(0, last + 1);
  }

  void on_text(std::string_view s) {
    switch (state_) {
      case State::kReasoning: emit_reasoning(s); break;
      case State::kResponse: emit_content(s); break;
      case State::kCall:
        call_raw_ += s;
        call_stray_ += s;  // between arguments: layout if white space, else kept as content
        break;
      case State::kArgument:
        call_raw_ += s;
        arg_value_ += s;
        break;
      case State::kJson:
        call_raw_ += s;
        json_block_ += s;
        break;
      default: stray(s); break;
    }
  }

  void enter(State s) {
    held_space_.clear();
    if (s == State::kResponse) response_has_text_ = false;
    state_ = s;
  }

  void on_tag(bool is_open, std::string_view header, const std::string& raw) {
    const std::string_view h = trim(header);
    const size_t name_end = std::min(h.size(), h.find_first_of(" \t\n\r\f\v"));
    const std::string_view name = h.substr(0, name_end);
    const bool bare = name_end == h.size();  // no attributes
    auto is = [&](bool open, std::string_view n) { return is_open == open && name == n && (bare || open); };

    switch (state_) {
      case State::kReasoning:
        if (is(false, "think")) return enter(State::kTop);
        if (is(false, "message")) return enter(State::kAfterMessage);
        if (!reasoning_seen_ && is(true, "think") && bare) return;  // the prompt's own opener, repeated
        if (!reasoning_seen_ && is(true, "response") && bare) return enter(State::kResponse);  // think skipped
        if (!reasoning_seen_ && is(true, "tools") && bare) return enter(State::kTools);
        return emit_reasoning(raw);
      case State::kTop:
      case State::kAfterMessage:
      case State::kDone:
        if (state_ != State::kDone) {
          if (is(true, "response") && bare) return enter(State::kResponse);
          if (is(true, "tools") && bare) return enter(State::kTools);
          if (is(true, "think") && bare && state_ == State::kTop) return enter(State::kReasoning);
          if (is(false, "message") && state_ == State::kTop) return enter(State::kAfterMessage);
        }
        return stray(raw);
      case State::kResponse:
        if (is(false, "response")) return enter(State::kTop);
        if (is(true, "tools") && bare) return enter(State::kTools);  // response left open
        if (is(false, "message")) return enter(State::kAfterMessage);
        if (!response_has_text_ && is(true, "response") && bare) return;  // the prompt's opener, repeated
        return emit_content(raw);
      case State::kTools:
        if (is_open && name == "call") {
          enter(State::kCall);
          call_raw_ = raw;
          call_attrs_ = parse_attrs(h.substr(name_end));
          call_args_ = Json::object();
          call_stray_.clear();
          json_block_.clear();
          has_json_block_ = false;
          return;
        }
        if (is(false, "tools")) return enter(State::kTop);
        if (is(false, "message")) return enter(State::kAfterMessage);
        return stray(raw);
      case State::kCall:
        if (is(false, "tools") || is(false, "message")) {  // the call never closed
          abandon_call();
          state_ = State::kTools;
          return on_tag(is_open, header, raw);
        }
        call_raw_ += raw;
        if (is_open && name == "argument") {
          const auto attrs = parse_attrs(h.substr(name_end));
          arg_key_ = attr(attrs, "key", "");
          arg_type_ = attr(attrs, "type", "string");
          arg_value_.clear();
          state_ = State::kArgument;
          return;
        }
        if (is_open && name == "json") {
          has_json_block_ = true;
          state_ = State::kJson;
          return;
        }
        if (is(false, "call")) return close_call();
        call_stray_ += raw;
        return;
      case State::kArgument:
        call_raw_ += raw;
        if (is(false, "argument")) {
          commit_argument();
          state_ = State::kCall;
          return;
        }
        arg_value_ += raw;
        return;
      case State::kJson:
        call_raw_ += raw;
        if (is(false, "json")) {
          state_ = State::kCall;
          return;
        }
        json_block_ += raw;
        return;
    }
  }

  void on_end() {
    if (state_ == State::kDone) return stray("<|end_of_msg|>");
    if (in_call()) abandon_call();
    enter(State::kDone);
  }

  // ---- tool calls ----
  void commit_argument() {
    Json value;
    if (arg_type_ == "string") {
      value = arg_value_;
    } else {
      try {
        value = Json::parse(arg_value_);
      } catch (const nlohmann::json::exception&) {
        value = arg_value_;  // not JSON after all: keep the text
      }
    }
    call_args_[arg_key_] = std::move(value);
  }

  void close_call() {
    const std::string name = attr(call_attrs_, "tool", "");
    if (name.empty()) return abandon_call();  // a call with no name is not a call: keep its text
    ParsedToolCall call;
    call.id = ids_.next();
    call.name = name;
    // A <json> block carries arguments that were not a JSON object when rendered: verbatim.
    call.arguments = has_json_block_ && call_args_.empty() ? json_block_
                                                           : py_json_dumps(call_args_, JsonSeparators::kPythonDefault);
    out_->tool_calls.push_back(std::move(call));
    emit_content(trim(call_stray_));
    call_raw_.clear();
    enter(State::kTools);
  }

  void abandon_call() {
    emit_content(call_raw_);
    call_raw_.clear();
    call_stray_.clear();
    state_ = State::kTools;
  }

  State state_;
  ToolCallIds ids_;

  bool tag_pending_ = false;
  bool tag_is_open_ = false;
  std::string tag_header_;

  bool reasoning_seen_ = false;
  bool response_has_text_ = false;
  std::string held_space_;

  std::string call_raw_;  // the call's text so far, for when it must fall back to content
  std::vector<std::pair<std::string, std::string>> call_attrs_;
  Json call_args_ = Json::object();
  std::string call_stray_;
  std::string json_block_;
  bool has_json_block_ = false;
  std::string arg_key_, arg_type_, arg_value_;
};

}  // namespace

std::unique_ptr<CompletionParser> make_k3_parser(const ParseOptions& options) {
  return std::make_unique<K3Parser>(options);
}

}  // namespace moonrun::chat
