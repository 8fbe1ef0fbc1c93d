// Kimi K3 completion parser: a state machine over markers and tag headers.
//
// A tag is <|open|>HEADER<|sep|> or <|close|>NAME<|sep|>; the header is held until its
// <|sep|> arrives, then the current state decides what the tag means. What the peers
// (vLLM's kimi_k3 reasoning + tool parsers, SGLang's kimik3 reasoning + tool detectors)
// give, and so what this parser gives, whole or streamed:
//   reasoning  the think channel: the one the prompt opened (thinking on), or one the
//              model opens itself before any reply text (thinking off: SGLang's in-band
//              open marker); it ends at <|close|>think, or at any channel tag;
//   content    the response channel's body; without any response channel, the text after
//              the think channel (and before tools); other text outside channels is
//              dropped, and so is a think channel inside the reply that closes
//              (<|close|>think) before the reply ends (SGLang: reasoning is never folded
//              into the reply). A think opener in the reply that never closes was a
//              quoted marker: it and the text after it stay content, verbatim, as vLLM
//              keeps the response channel's body. Content that is only white space is
//              kept when the reply had no markup, and is no content when markup was
//              stripped around it or tool calls came with it (SGLang's
//              strip_template_artifacts);
//   tool_calls each <|open|>call ... <|close|>call inside the tools channel with a tool
//              name; typed argument values JSON-decoded as Python's json.loads does (raw
//              text when that fails), the object re-encoded as json.dumps does. The
//              arguments are the call's argument tags and nothing else, as vLLM's kimi_k3
//              tool parser reads them: a <|open|>json ...<|close|>json block is no
//              argument (a call with only that block has arguments {}), and argument tags
//              inside it still count. Calls that never close are dropped, and so is call
//              syntax outside a tools channel (with what follows it: SGLang cuts the reply
//              there). With no tools declared or tool_choice "none" no call is returned
//              and none of the tools channel's markup shows (vLLM's KimiK3Parser for
//              tool_choice none, SGLang's kimik3 detector for no tools).
// A marker that is a tag where it stands (by the state above) never reaches reasoning or
// content. One that is not (a quoted marker: <|open|>response<|sep|> inside the reply, a
// stray <|sep|>, a marker whose header another marker cut off) is text where it stands,
// kept verbatim, as vLLM's kimi_k3 parsers keep the response channel's body and the think
// channel's text; the prompt's openers the model repeats before any reply text are layout,
// and a stray <|close|>response<|sep|> outside the response channel is dropped (vLLM's
// _strip_response_content). A marker cut off by the end of the stream while it could still
// have become a tag ("<|close|>resp", "<|open|>call tool=\"re") leaves nothing, as SGLang
// strips it (k3::header_leftover); one whose header could not ("<|open|>call, then") is
// text, verbatim.
#include "chat/parse_k3.h"

#include "chat/parse_k3_tags.h"
#include "chat/parse_markers.h"
#include "chat/py_json.h"

namespace moonrun::chat {
namespace {

using k3::Tag;
using k3::attr;

enum Marker { kOpen = 0, kClose = 1, kSep = 2, kEnd = 3 };

// A header longer than this is not a tag (tool names and keys are short): it is released
// as text instead of being held back indefinitely.
constexpr size_t kMaxHeaderBytes = 4096;

bool is_ascii_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }

std::string_view trim(std::string_view s) {
  while (!s.empty() && is_ascii_space(s.front())) s.remove_prefix(1);
  while (!s.empty() && is_ascii_space(s.back())) s.remove_suffix(1);
  return s;
}

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
    if (tag_pending_) abandon_tag(/*at_end=*/true);
    end_message();
  }

 private:
  enum class State { kReasoning, kTop, kResponse, kHiddenThink, kTools, kCall, kArgument, kDone };

  // ---- pieces -> text / tags / end ----
  void on_piece(const MarkerPiece& p) override {
    switch (p.marker) {
      case -1:
        if (!tag_pending_) return on_text(p.text);
        tag_header_ += p.text;
        if (tag_header_.size() > kMaxHeaderBytes) abandon_tag();  // not a tag: its text flows on
        return;
      case kOpen:
      case kClose:
        if (tag_pending_) abandon_tag();
        tag_pending_ = true;  // a tag left without its <|sep|> is abandoned
        tag_is_open_ = p.marker == kOpen;
        tag_header_.clear();
        return;
      case kSep:
        if (!tag_pending_) return on_stray_marker(p.text);
        tag_pending_ = false;
        return on_tag(k3::make_tag(tag_is_open_, tag_header_));
      case kEnd:
        if (tag_pending_) abandon_tag(/*at_end=*/true);
        return end_message();
    }
  }

  // A marker the reply (not the reasoning) carried: white space around it is no content.
  void note_reply_markup() {
    if (state_ != State::kReasoning && state_ != State::kDone) reply_markup_ = true;
  }

  // A tag that never got its <|sep|>. Inside a raw value it keeps every byte up to the
  // value's own close (vLLM's non-greedy value match); an <|open|>call with attributes in
  // the reply is call syntax; cut off by the end of the message while it could still have
  // become a tag, it leaves nothing; anywhere else it is text where it stands, verbatim.
  void abandon_tag(bool at_end = false) {
    tag_pending_ = false;
    const std::string header = std::move(tag_header_);
    tag_header_.clear();
    if (state_ == State::kArgument) { arg_value_ += (tag_is_open_ ? "<|open|>" : "<|close|>") + header; return; }
    note_reply_markup();
    if (tag_is_open_ && k3::starts_call_syntax(header) &&
        (state_ == State::kTop || state_ == State::kResponse || state_ == State::kHiddenThink)) {
      if (state_ == State::kHiddenThink) release_quoted_think();  // the reply ends here
      return start_unparsed_tools();
    }
    const std::string marker = tag_is_open_ ? "<|open|>" : "<|close|>";
    // Cut off where it could still have become a tag (nothing left once a channel name
    // and its attributes, cut or whole, are taken off): markup the limit cut, not text.
    if (at_end && k3::header_leftover(header, /*complete=*/false).empty()) return;
    on_text(marker + header);
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
    reasoning_done_ = true;
  }
  // Content that is only white space so far is held: whether it is content is known at the
  // end (flush_held_content).
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
  // White space alone is the content only of a reply without markup and without calls:
  // vLLM gives no content when that is all there is beside tool calls, SGLang none when it
  // stripped markup around it ("<|open|>response<|sep|>   <|close|>response<|sep|>").
  void flush_held_content() {
    if (num_calls_ == 0 && !reply_markup_) out_->content += held_content_;
    held_content_.clear();
  }

  // Text between channels. vLLM's content is the response channel's body when there is
  // one, else the text after the think channel: so it is held until the next structural
  // point decides, and given out only if no response channel was seen.
  void release_top_text() {
    if (!response_seen_) emit_content(top_text_);
    top_text_.clear();
  }

  void on_text(std::string_view s) {
    switch (state_) {
      case State::kReasoning: return emit_reasoning(s);
      case State::kResponse: return emit_content(s);
      case State::kTop: top_text_ += s; return;
      case State::kArgument: arg_value_ += s; return;
      case State::kHiddenThink: hidden_text_ += s; return;  // the reply's only if it never closes
      case State::kTools:        // layout or junk between calls: dropped, as vLLM's regexes do
      case State::kCall:         // text between arguments (a JSON block's body too): dropped likewise
      case State::kDone:         // after the message: not part of it
        return;
    }
  }

  // A <|sep|> outside any tag: text where it stands (a raw value's, the reply's, the
  // reasoning's; dropped between channels and calls, as any text there).
  void on_stray_marker(const std::string& marker) {
    if (state_ == State::kArgument) return void(arg_value_ += marker);
    note_reply_markup();
    on_text(marker);
  }

  void enter(State s) {
    if (s == State::kResponse) {
      response_seen_ = true;
      top_text_.clear();  // the response channel's body is the content
    }
    if (s != State::kResponse && s != State::kReasoning) reasoning_done_ = true;
    state_ = s;
  }

  // <|open|>think in the reply. Before any reply text, and when no think channel came
  // before, it is the reasoning (thinking off, the model thinking anyway: SGLang's in-band
  // open marker); the markup and white space before it were layout. Later it is either a
  // think channel inside the reply, dropped if it closes (SGLang), or a marker the reply
  // quotes, if the reply ends first (vLLM keeps the reply's text): what follows it is held
  // until one of the two is known.
  void open_think_in_reply(const std::string& raw) {
    if (!reasoning_done_ && !content_seen_) {
      held_content_.clear();
      top_text_.clear();
      reply_markup_ = false;
      response_seen_ = false;  // as after the prompt's think channel: a response channel may follow
      state_ = State::kReasoning;
      return;
    }
    hidden_return_ = state_;
    hidden_text_ = raw;  // the opener itself is the reply's if it was quoted
    state_ = State::kHiddenThink;
  }

  // The reply ended before the think opener closed: the opener was quoted, and the text
  // held after it is the reply's.
  void release_quoted_think() {
    state_ = hidden_return_;
    std::string held = std::move(hidden_text_);
    hidden_text_.clear();
    on_text(held);
  }

  // Call syntax outside a tools channel: no call (neither peer parses one there) and no
  // reply from there on (SGLang cuts the reply at it).
  void start_unparsed_tools() {
    if (state_ == State::kTop) release_top_text();
    unparsed_calls_ = true;
    enter(State::kTools);
  }

  void end_message() {
    if (state_ == State::kHiddenThink) release_quoted_think();
    if (state_ == State::kReasoning) end_reasoning();
    if (state_ == State::kTop) release_top_text();
    if (state_ != State::kDone) flush_held_content();
    state_ = State::kDone;
  }

  // Nothing but layout so far in the reply (white space).
  bool reply_empty() const {
    if (state_ == State::kTop) return trim(top_text_).empty();
    return !content_seen_;
  }

  // A complete tag that means nothing where it stands: a quoted marker, text there verbatim
  // (vLLM keeps the response channel's body and the think channel's text as generated).
  // Before any reply text, the prompt's openers repeated (<|open|>response<|sep|>,
  // <|open|>message ...<|sep|>) and the think channel's close repeated are layout (vLLM
  // unwraps the first response opener); a stray <|close|>response<|sep|> outside the
  // response channel goes, as vLLM strips it.
  void leftover(const Tag& t) {
    if ((state_ == State::kResponse || state_ == State::kTop) && reply_empty() &&
        ((t.open && (t.name == "response" || t.name == "message")) || t.is(false, "think")))
      return;
    if (state_ == State::kTop && t.is(false, "response")) return;
    on_text(t.raw);
  }

  void on_tag(const Tag& t) {
    note_reply_markup();
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
        return leftover(t);
      case State::kTop:
        if (t.is(true, "response")) return enter(State::kResponse);
        if (t.is(true, "tools")) {
          release_top_text();
          unparsed_calls_ = false;
          return enter(State::kTools);
        }
        if (t.is(false, "message")) return end_message();
        if (t.is(true, "think")) return open_think_in_reply(t.raw);
        if (t.is(true, "call")) {
          start_unparsed_tools();
          return start_call(t);
        }
        return leftover(t);
      case State::kResponse:
        if (t.is(false, "response")) return enter(State::kTop);
        if (t.is(true, "tools")) {  // response left open
          unparsed_calls_ = false;
          return enter(State::kTools);
        }
        if (t.is(false, "message")) return end_message();
        if (t.is(true, "think")) return open_think_in_reply(t.raw);
        if (t.is(true, "call")) {
          start_unparsed_tools();
          return start_call(t);
        }
        return leftover(t);  // the prompt's openers repeated, or any other tag
      case State::kHiddenThink:
        if (t.is(false, "think")) {  // a think channel inside the reply: not the reply
          hidden_text_.clear();
          state_ = hidden_return_;
          return;
        }
        // The reply ends first (its close, a tools channel, call syntax, the message's
        // end): the opener was quoted.
        if (t.is(false, "response") || t.is(true, "tools") || t.is(true, "call") || t.is(false, "message")) {
          release_quoted_think();
          return on_tag(t);
        }
        return leftover(t);
      case State::kTools:
        if (t.open && t.name == "call") return start_call(t);
        if (t.is(true, "tools")) {  // the tools channel proper, after call syntax outside one
          unparsed_calls_ = false;
          return;
        }
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
      case State::kDone:
        return;
    }
  }

  // ---- tool calls ----
  void start_call(const Tag& t) {
    state_ = State::kCall;
    call_name_ = attr(t.attrs, "tool", "");
    call_args_ = PyJson{PyJson::Kind::kObject};
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
    if (unparsed_calls_ || !options_.tool_calls_allowed) return;
    if (!options_.parallel_tool_calls && num_calls_ >= 1) return;
    ParsedToolCall call;
    call.id = ids_.next();
    call.name = call_name_;
    call.arguments = py_json_dumps(call_args_, JsonSeparators::kPythonDefault);
    out_->tool_calls.push_back(std::move(call));
    ++num_calls_;
  }

  const ParseOptions options_;
  State state_;
  bool response_seen_;
  ToolCallIds ids_;

  bool tag_pending_ = false;
  bool tag_is_open_ = false;
  std::string tag_header_;

  bool reasoning_seen_ = false;
  bool reasoning_done_ = false;  // the think channel is over (or the reply began without one)
  bool content_seen_ = false;
  bool reply_markup_ = false;    // the reply carried a marker (see flush_held_content)
  bool unparsed_calls_ = false;  // call syntax began outside a tools channel
  State hidden_return_ = State::kResponse;
  std::string held_content_;
  std::string held_space_;
  std::string hidden_text_;  // a think opener in the reply and the text after it, until it closes or the reply ends
  std::string top_text_;

  std::string call_name_;
  PyJson call_args_{PyJson::Kind::kObject};
  std::string arg_key_, arg_type_, arg_value_;
  size_t num_calls_ = 0;
};

}  // namespace

std::unique_ptr<CompletionParser> make_k3_parser(const ParseOptions& options) {
  return std::make_unique<K3Parser>(options);
}

}  // namespace moonrun::chat
