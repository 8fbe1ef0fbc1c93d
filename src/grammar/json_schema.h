#pragma once
// JSON Schema -> grammar rules, for structured output and tool-call arguments.
//
// Supported (what OpenAI strict mode accepts, plus what xgrammar/llguidance users lean on):
//   type (one or a list), properties / required / additionalProperties (declared
//   properties are generated in schema order; extra keys only for property-less maps),
//   items / prefixItems / minItems / maxItems, enum, const, anyOf / oneOf, allOf of one,
//   $ref into #/$defs, #/definitions or any JSON pointer (recursion included), string
//   minLength / maxLength / pattern (ECMA regex without lookaround or backreferences) /
//   format (date-time, date, time, uuid, email; others are annotations), integer and
//   number bounds (numbers with bounds are generated as integers in range), nullable
//   type lists. Annotations (title, description, default, examples, ...) are ignored.
// Anything that would let the output break the schema (uniqueItems, not, if/then/else,
// patternProperties, multipleOf, ...) is refused with a message that names the part:
//   "response_format.json_schema.schema.properties.tags.uniqueItems: not supported".
//
// Every generated value is valid against the schema; the grammar only narrows what the
// model may choose (no whitespace runs over 20 characters, numbers of at most 16 digits).
#include <cstdint>
#include <map>
#include <string>

#include <nlohmann/json.hpp>

#include "common/status.h"
#include "grammar/grammar.h"
#include "grammar/pattern.h"

namespace moonrun::grammar {

using Json = nlohmann::ordered_json;

class JsonGrammar {
 public:
  explicit JsonGrammar(Builder& builder) : b_(builder) {}

  // A rule matching the JSON text of one value of schema. root is the document $refs
  // resolve in; path names schema in error messages.
  Result<int32_t> value(const Json& schema, const Json& root, const std::string& path);
  // A rule matching the raw text of a string value of schema (XTML type="string").
  Result<int32_t> raw_string(const Json& schema, const Json& root, const std::string& path);
  // Any JSON value / any JSON object (response_format json_object).
  int32_t any_value();
  int32_t any_object();
  int32_t whitespace();

  // The JSON types a schema allows at its top ("string", "integer", ...; anyOf/$ref
  // followed). Empty when unrestricted. Used for K3 argument type attributes.
  Result<std::vector<std::string>> types_of(const Json& schema, const Json& root, const std::string& path);

 private:
  using Frag = Builder::Frag;
  struct Ctx {
    const Json* root;
    std::string path;
  };
  Result<Frag> schema_frag(const Json& schema, const Ctx& ctx, int depth);
  Result<Frag> typed(const Json& schema, const std::string& type, const Ctx& ctx, int depth);
  Result<Frag> object(const Json& schema, const Ctx& ctx, int depth);
  Result<Frag> array(const Json& schema, const Ctx& ctx, int depth);
  Result<Frag> string(const Json& schema, const Ctx& ctx, StringMode mode);
  Result<Frag> number(const Json& schema, const Ctx& ctx, bool integer);
  Result<int32_t> ref_rule(const std::string& ref, const Ctx& ctx, int depth);
  Result<const Json*> resolve(const std::string& ref, const Ctx& ctx);
  Result<int32_t> rule_for(const Json& schema, const Ctx& ctx, int depth);
  Frag json_literal(const Json& value);
  Frag json_char();
  Frag raw_char();
  Frag string_literal_any();  // "..." of any JSON string
  Frag number_any(bool integer);

  Builder& b_;
  std::map<std::pair<const Json*, std::string>, int32_t> refs_;
  int32_t ws_ = -1, any_value_ = -1, any_object_ = -1, any_string_ = -1;
};

// A standalone grammar for one JSON value of schema (the root rule); the 400 names path.
Result<Grammar> compile_json_schema(const Json& schema, const std::string& path);

}  // namespace moonrun::grammar
