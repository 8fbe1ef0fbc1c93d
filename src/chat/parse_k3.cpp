// Kimi K3 completion parser: a state machine over markers and tag headers.
//
// A tag is <|open|>HEADER<|sep|> or <|close|>NAME<|sep|>; the header is held until its
// <|sep|> arrives, then the current state decides what the tag means. What the peers
// (vLLM's kimi_k3 reasoning + tool parsers, SGLang's kimik3 detector) give, and so what
// this parser gives, whole or streamed:
//   reasoning  the think channel; it ends at <|close|>think, or at any channel tag;
//   content    the response channel's body; without any response channel, the text after
//              the think channel (and before tools); other text outside channels is dropped;
//   tool_calls each <|open|>call ... <|close|>call with a tool name; typed argument values
//              JSON-decoded as Python's json.loads does (raw text when that fails), the
//              object re-encoded as json.dumps does; calls that never close are dropped.
// No marker ever reaches reasoning or content: a tag that means nothing where it stands is
// dropped, and so is a half-written one (<|open|>tool at the end of a cut-off stream).
#include "chat/parse_k3.h"

#include "chat/parse_markers.h"
#include "chat/py_json.h"

namespace moonrun::chat {
namespace {

enum Marker { kOpen = 0, kClose = 1, kSep = 2, kEnd = 3 };

// A header longer than this is not a tag (tool names and keys are short); it is dropped
// instead of being held back indefinitely.
constexpr size_t kMaxHeaderBytes = 4096;

bool is_ascii_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }

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

using Attrs = std::vector<std::pair<std::string, std::string>>;

// key="value" pairs, in the manner of vLLM's (\w+)="([^"]*)" scan: anything that is not
// such a pair (unknown junk, a stray quote) is skipped; a repeated key keeps its last value.
Attrs parse_attrs(std::string_view s) {
  Attrs out;
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

std::string attr(const Attrs& attrs, std::string_view key, std::string fallback) {
  for (auto it = attrs.rbegin(); it != attrs.rend(); ++it)
    if (it->first == key) return it->second;
  return fallback;
}

struct Tag {
  bool open = false;
  std::string name;
  bool bare = true;  // no attributes
  Attrs attrs;
  std::string raw;   // the whole tag as generated (argument values keep it verbatim)
  bool is(bool o, std::string_view n) const { return open == o && name == n; }
};

class K3Parser final : public MarkerDrivenParser {
 public:
  explicit K3Parser(const ParseOptions& options)
      : MarkerDrivenParser({"<|open|>", "<|close|>", "<|sep|>", "<|end_of_msg|>"}),
        options_(options),
        state_(options.thinking ? State::kReasoning : State::kResponse),
        response_seen_(!options.thinking),
        ids_(options.id_seed) {}

  // An unterminated message (max_tokens): a half-read tag or call is dropped.
  void on_finish() override {
    tag_pending_ = false;
    end_message();
  }

 private:
  enum class State { kReasoning, kTop, kResponse, kTools, kCall, kArgument, kJson, kDone };

  // ---- pieces -> text / tags / end ----
  void on_piece(const MarkerPiece& p) override {
    switch (p.marker) {
      case -1:
        if (!tag_pending_) return on_text(p.text);
        if (tag_overlong_) return;
        tag_header_ += p.text;
        if (tag_header_.size() > kMaxHeaderBytes) {
          // Not a tag: it and its text up to the next marker are dropped, however the
          // text was chunked.
          tag_overlong_ = true;
          tag_header_.clear();
        }
        return;
      case kOpen:
      case kClose:
        if (tag_pending_) abandon_tag();
        tag_pending_ = true;  // a tag left without its <|sep|> is dropped
        tag_overlong_ = false;
        tag_is_open_ = p.marker == kOpen;
        tag_header_.clear();
        return;
      case kSep:
        if (!tag_pending_) return on_stray_marker(p.text);
        tag_pending_ = false;
        if (tag_overlong_) return;
        return on_tag(make_tag());
      case kEnd:
        if (tag_pending_) abandon_tag();
        tag_pending_ = false;
        return end_message();
    }
  }

  // A tag that never got its <|sep|>: dropped, except inside a raw value, which keeps
  // every byte up to its own close (vLLM's non-greedy value match).
  void abandon_tag() {
    const std::string raw = (tag_is_open_ ? "<|open|>" : "<|close|>") + (tag_overlong_ ? std::string() : tag_header_);
    if (state_ == State::kArgument) arg_value_ += raw;
    if (state_ == State::kJson) json_block_ += raw;
    tag_pending_ = false;
  }

  Tag make_tag() const {
    Tag t;
    t.open = tag_is_open_;
    t.raw = (tag_is_open_ ? "<|open|>" : "<|close|>") + tag_header_ + "<|sep|>";
    const std::string_view h = trim(tag_header_);
    const size_t name_end = std::min(h.size(), h.find_first_of(" \t\n\r\f\v"));
    t.name = std::string(h.substr(0, name_end));
    t.bare = name_end == h.size();
    if (!t.bare) t.attrs = parse_attrs(h.substr(name_end));
    return t;
  }

  // ---- output ----
  void emit_reasoning(std::string_view s) {
    if (s.empty()) return;
    // White space before any reasoning is held: a think opener may still follow it (the
    // model repeating the prompt's <|open|>think<|sep|>), and then it was layout.
    if (!reasoning_seen_) {
      held_space_ += s;
      if (trim(held_space_).empty()) return;
      s = held_space_;
    }
    out_->reasoning += s;
    reasoning_seen_ = true;
    held_space_.clear();
  }
  void end_reasoning() {
    held_space_.clear();  // white space alone is not reasoning
  }
  // Content that is only white space so far is held: vLLM gives no content when that is all
  // there is beside tool calls, and the white space is the content otherwise.
  void emit_content(std::string_view s) {
    if (s.empty()) return;
    if (!content_seen_) {
      held_content_ += s;
      if (trim(held_content_).empty()) return;
      s = held_content_;
      content_seen_ = true;
    }
    out_->content += s;
    held_content_.clear();
  }
  void flush_held_content() {
    if (num_calls_ == 0) out_->content += held_content_;
    held_content_.clear();
  }

  // Text between channels. vLLM's content is the response channel's body when there is
  // one, else the text after the think channel: so it is held until the next structural
  // point decides, and given out only if no response channel was seen.
  void release_top_text() {
    if (!response_seen_ && !trim(top_text_).empty()) emit_content(top_text_);
    top_text_.clear();
  }

  void on_text(std::string_view s) {
    switch (state_) {
      case State::kReasoning: return emit_reasoning(s);
      case State::kResponse: return emit_content(s);
      case State::kTop: top_text_ += s; return;
      case State::kArgument: arg_value_ += s; return;
      case State::kJson: json_block_ += s; return;
      case State::kTools:  // layout or junk between calls: dropped, as vLLM's regexes do
      case State::kCall:   // text between arguments: dropped likewise
      case State::kDone:   // after the message: not part of it
        return;
    }
  }

  // A <|sep|> outside any tag: part of a raw value inside a call, else dropped.
  void on_stray_marker(const std::string& marker) {
    if (state_ == State::kArgument) arg_value_ += marker;
    if (state_ == State::kJson) json_block_ += marker;
  }

  void enter(State s) {
    if (s == State::kResponse) {
      response_seen_ = true;
      top_text_.clear();  // the response channel's body is the content
    }
    state_ = s;
  }

  void end_message() {
    if (state_ == State::kReasoning) end_reasoning();
    if (state_ == State::kTop) release_top_text();
    if (state_ != State::kDone) flush_held_content();
    state_ = State::kDone;
  }

  void on_tag(const Tag& t) {
    switch (state_) {
      case State::kReasoning:
        if (!reasoning_seen_ && t.open && (t.name == "think" || t.name == "message")) {
          held_space_.clear();  // the prompt's openers, generated again: layout
          return;
        }
        if (t.is(false, "think")) {
          end_reasoning();
          return enter(State::kTop);
        }
        // A channel tag ends reasoning even if the think channel was never closed.
        if (t.is(true, "response") || t.is(true, "tools") || t.is(false, "message")) {
          end_reasoning();
          state_ = State::kTop;
          return on_tag(t);
        }
        return;  // any other tag inside reasoning: dropped
      case State::kTop:
        if (t.is(true, "response")) return enter(State::kResponse);
        if (t.is(true, "tools")) {
          release_top_text();
          return enter(State::kTools);
        }
        if (t.is(false, "message")) return end_message();
        return;
      case State::kResponse:
        if (t.is(false, "response")) return enter(State::kTop);
        if (t.is(true, "tools")) return enter(State::kTools);  // response left open
        if (t.is(false, "message")) return end_message();
        return;  // the prompt's openers repeated, or any other tag: dropped
      case State::kTools:
        if (t.open && t.name == "call") return start_call(t);
        if (t.is(false, "tools")) return enter(State::kTop);
        if (t.is(false, "message")) return end_message();
        return;
      case State::kCall:
        if (t.open && t.name == "argument") {
          arg_key_ = attr(t.attrs, "key", "");
          arg_type_ = attr(t.attrs, "type", "string");
          arg_value_.clear();
          state_ = State::kArgument;
          return;
        }
        if (t.open && t.name == "json") {
          has_json_block_ = true;
          json_block_.clear();
          state_ = State::kJson;
          return;
        }
        if (t.is(false, "call")) return close_call();
        if (t.open && t.name == "call") return start_call(t);  // the previous never closed: dropped
        if (t.is(false, "tools") || t.is(false, "message")) {  // the call never closed: dropped
          state_ = State::kTools;
          return on_tag(t);
        }
        return;
      case State::kArgument:
        if (t.is(false, "argument")) {
          commit_argument();
          state_ = State::kCall;
          return;
        }
        if (t.is(false, "call")) return close_call();  // an argument without its close: dropped
        arg_value_ += t.raw;  // values are raw text: other tags are part of them
        return;
      case State::kJson:
        if (t.is(false, "json")) {
          state_ = State::kCall;
          return;
        }
        if (t.is(false, "call")) return close_call();
        json_block_ += t.raw;
        return;
      case State::kDone:
        return;
    }
  }

  // ---- tool calls ----
  void start_call(const Tag& t) {
    state_ = State::kCall;
    call_name_ = attr(t.attrs, "tool", "");
    call_args_ = PyJson{PyJson::Kind::kObject};
    json_block_.clear();
    has_json_block_ = false;
  }

  void commit_argument() {
    PyJson value{PyJson::Kind::kString};
    value.text = arg_value_;
    if (arg_type_ != "string") {
      if (auto parsed = py_json_loads(arg_value_)) value = std::move(*parsed);  // else: the raw text
    }
    call_args_.set(arg_key_, std::move(value));
  }

  void close_call() {
    state_ = State::kTools;
    if (call_name_.empty()) return;  // a call with no name is not a call (vLLM drops it)
    if (!options_.tool_calls_allowed) return;
    if (!options_.parallel_tool_calls && num_calls_ >= 1) return;
    ParsedToolCall call;
    call.id = ids_.next();
    call.name = call_name_;
    // A <json> block carries arguments that were not a JSON object when rendered: verbatim.
    call.arguments = has_json_block_ && call_args_.members.empty()
                         ? json_block_
                         : py_json_dumps(call_args_, JsonSeparators::kPythonDefault);
    out_->tool_calls.push_back(std::move(call));
    ++num_calls_;
  }

  const ParseOptions options_;
  State state_;
  bool response_seen_;
  ToolCallIds ids_;

  bool tag_pending_ = false;
  bool tag_overlong_ = false;
  bool tag_is_open_ = false;
  std::string tag_header_;

  bool reasoning_seen_ = false;
  bool content_seen_ = false;
  std::string held_content_;
  std::string held_space_;
  std::string top_text_;

  std::string call_name_;
  PyJson call_args_{PyJson::Kind::kObject};
  std::string json_block_;
  bool has_json_block_ = false;
  std::string arg_key_, arg_type_, arg_value_;
  size_t num_calls_ = 0;
};

}  // namespace

std::unique_ptr<CompletionParser> make_k3_parser(const ParseOptions& options) {
  return std::make_unique<K3Parser>(options);
}

}  // namespace moonrun::chat
