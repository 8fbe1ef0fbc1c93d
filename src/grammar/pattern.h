#pragma once
// JSON Schema `pattern` (an ECMA-262 regular expression) -> a grammar fragment over the
// string's characters, written the way the value is written: JSON-escaped inside a JSON
// string literal (a quote becomes \", a newline \n), or raw for a K3 XTML argument.
//
// The subset: literals, ., classes ([a-z], [^...], \d \w \s and their negations),
// groups ((...), (?:...), (?<name>...)), alternation, quantifiers (* + ? {n} {n,} {n,m},
// lazy forms too), ^ and $ at the ends. JSON Schema patterns are not anchored, so a side
// without an anchor may hold any text. Lookaround, backreferences and \b are refused.
// Characters are code points; non-ASCII classes become UTF-8 byte-range sequences.
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/status.h"
#include "grammar/grammar.h"

namespace moonrun::grammar {

// How a string value is written: as a JSON string literal (quotes, escapes), or as the raw
// text of a K3 XTML argument (type="string": the value itself, no quotes, no escapes).
enum class StringMode { kJson, kRaw };

// Inclusive code point ranges, sorted and disjoint.
using CharSet = std::vector<std::pair<uint32_t, uint32_t>>;

// Every Unicode scalar value (no surrogates).
CharSet any_char();
// One character of `set`, written in `mode`.
Builder::Frag char_frag(Builder& b, const CharSet& set, StringMode mode);

// The regex as a fragment; errors read "PATH: ..." naming the unsupported construct.
Result<Builder::Frag> pattern_frag(Builder& b, std::string_view pattern, StringMode mode, const std::string& path);

}  // namespace moonrun::grammar
