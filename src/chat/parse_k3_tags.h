#pragma once
// K3 XTML tag headers: what the K3 parser reads between <|open|> (or <|close|>) and <|sep|>,
// and what is left of a marker that turns out not to be a tag where it stands.
//
// A tag is <|open|>NAME key="value" ...<|sep|> or <|close|>NAME<|sep|>; attribute values
// escape & and " (&amp; &quot;). A marker the reply merely quotes is kept verbatim by the
// K3 parser (as vLLM keeps it); one the end of the stream cut off is matched here the way
// SGLang's kimik3 detector strips markers from client-bound text (strip_template_markers):
// the marker goes, and so do a channel name right after it and that name's key="value"
// attributes; any other text stays. A cut-off header that is only the start of a channel
// name ("<|open|>tool" at the end of a stream) leaves nothing.
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace moonrun::chat::k3 {

using Attrs = std::vector<std::pair<std::string, std::string>>;

struct Tag {
  bool open = false;
  std::string name;
  bool bare = true;  // no attributes
  Attrs attrs;
  std::string header;  // the text between the marker and <|sep|>, as generated
  std::string raw;     // the whole tag as generated (argument values keep it verbatim)
  bool is(bool o, std::string_view n) const { return open == o && name == n; }
};

// The tag a complete header makes (the text between the marker and its <|sep|>).
Tag make_tag(bool open, std::string_view header);

// The value of `key` (its last occurrence), else fallback.
std::string attr(const Attrs& attrs, std::string_view key, std::string fallback);

// What a marker that is not a tag leaves of its header. `complete`: the header reached its
// <|sep|> (a tag that means nothing where it stands); otherwise it was cut off by the next
// marker or the end of the text, and a trailing `key` or `key="val` (an attribute cut
// mid-way) goes too.
std::string header_leftover(std::string_view header, bool complete);

// An <|open|> header that starts a call ("call" then white space): call syntax, even
// without its <|sep|> (SGLang cuts the reply there rather than show it).
bool starts_call_syntax(std::string_view header);

}  // namespace moonrun::chat::k3
