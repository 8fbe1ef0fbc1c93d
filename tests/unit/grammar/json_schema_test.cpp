// JSON Schema grammars against independent judges: nlohmann's JSON parser (is the text
// JSON at all), std::regex in ECMAScript mode (the pattern semantics JSON Schema names),
// plain integer arithmetic (bounds), and the schema's own rules checked on the parsed
// value. Texts come from hand-written valid/invalid examples and from random walks that
// sample any allowed token under the masks, with a token budget.
#include <cmath>
#include <cstdlib>
#include <random>
#include <regex>

#include <gtest/gtest.h>

#include "grammar/json_schema.h"
#include "grammar/matcher.h"

namespace moonrun::grammar {
namespace {

// A byte-level vocabulary: the 256 bytes, some multi-byte tokens that straddle JSON
// structure (as real BPE tokens do), and two special tokens.
std::shared_ptr<const TokenVocab> test_vocab() {
  std::vector<std::string> bytes;
  for (int c = 0; c < 256; ++c) bytes.push_back(std::string(1, static_cast<char>(c)));
  for (const char* t : {"{\"", "\":", "\": ", "\", \"", "\",\"", "true", "false", "null", "abc", " the", "123", "-0",
                        "1.5", "e+", "\"}", "}]", "[{", "\\n", "\\\"", "é", "\xe4\xb8", "\xad", "  ", "\n  "})
    bytes.push_back(t);
  std::vector<bool> special(bytes.size(), false);
  bytes.push_back("<|a|>");
  special.push_back(true);
  bytes.push_back("<|eos|>");
  special.push_back(true);
  const int32_t eos = static_cast<int32_t>(bytes.size()) - 1;
  return std::make_shared<TokenVocab>(bytes, special, std::vector<int32_t>{eos});
}

std::wstring widen(const std::string& utf8) {
  std::wstring out;
  for (size_t i = 0; i < utf8.size();) {
    const auto b = static_cast<unsigned char>(utf8[i]);
    const int len = b < 0x80 ? 1 : b < 0xE0 ? 2 : b < 0xF0 ? 3 : 4;
    uint32_t cp = len == 1 ? b : b & (0x7F >> len);
    for (int k = 1; k < len && i + k < utf8.size(); ++k) cp = (cp << 6) | (static_cast<unsigned char>(utf8[i + k]) & 0x3F);
    out.push_back(static_cast<wchar_t>(cp));
    i += len;
  }
  return out;
}

struct Compiled {
  std::shared_ptr<GrammarRuntime> rt;
  bool accepts(const std::string& text) const {
    int32_t s = rt->initial_state();
    for (unsigned char c : text) s = rt->advance(s, c);
    return rt->accepting(s);
  }
};

Compiled compile(const std::string& schema_text) {
  auto g = compile_json_schema(Json::parse(schema_text), "schema");
  EXPECT_TRUE(g.is_ok()) << g.status().message();
  return {std::make_shared<GrammarRuntime>(std::make_shared<Grammar>(std::move(g).value()), test_vocab())};
}

std::string compile_error(const std::string& schema_text) {
  auto g = compile_json_schema(Json::parse(schema_text), "response_format.json_schema.schema");
  EXPECT_FALSE(g.is_ok()) << schema_text;
  return g.is_ok() ? "" : g.status().message();
}

// Samples tokens uniformly among the allowed ones until EOS; returns the text.
std::string random_walk(const Compiled& c, std::mt19937_64& rng, int64_t max_tokens) {
  const auto& vocab = c.rt->vocab();
  Matcher m(c.rt, max_tokens);
  std::string text;
  std::vector<uint32_t> words((vocab.size() + 31) / 32);
  for (int64_t step = 0; step < max_tokens; ++step) {
    std::fill(words.begin(), words.end(), 0u);
    m.fill_allowed(words);
    std::vector<int32_t> allowed;
    for (int32_t t = 0; t < vocab.size(); ++t)
      if (words[t / 32] >> (t % 32) & 1u) allowed.push_back(t);
    if (allowed.empty()) break;
    const int32_t t = allowed[rng() % allowed.size()];
    EXPECT_TRUE(m.accept(t));
    if (t == vocab.eos()[0]) return text;
    text += vocab.bytes(t);
  }
  ADD_FAILURE() << "no EOS within " << max_tokens << " tokens: " << text;
  return text;
}

TEST(JsonSchema, ObjectPropertiesRequiredAndOrder) {
  const auto c = compile(R"({"type":"object","properties":{"a":{"type":"integer"},"b":{"type":"string"},
                              "c":{"type":"boolean"}},"required":["a"],"additionalProperties":false})");
  for (const char* ok : {R"({"a":1})", R"({"a":-12,"b":"x"})", R"({ "a" : 0 , "c" : true })", R"({"a":1,"b":"","c":false})"})
    EXPECT_TRUE(c.accepts(ok)) << ok;
  for (const char* bad : {R"({"b":"x"})", R"({"a":1.5})", R"({"a":1,"d":2})", R"({"a":1,})", R"({"a":01})", R"({"a":1}x)",
                          R"({"b":"x","a":1})"})  // properties come in schema order
    EXPECT_FALSE(c.accepts(bad)) << bad;
}

TEST(JsonSchema, EnumsConstAnyOfNullable) {
  const auto c = compile(R"({"type":"object","properties":{
      "e":{"enum":["red","green",3,null]}, "k":{"const":{"x":[1,2]}},
      "u":{"anyOf":[{"type":"string","maxLength":2},{"type":"integer","minimum":5}]},
      "n":{"type":["number","null"]}},"required":["e","k","u","n"]})");
  EXPECT_TRUE(c.accepts(R"({"e":"red","k":{"x":[1,2]},"u":"ab","n":null})"));
  EXPECT_TRUE(c.accepts(R"({"e":3,"k":{"x":[1,2]},"u":7,"n":-1.5e3})"));
  EXPECT_FALSE(c.accepts(R"({"e":"blue","k":{"x":[1,2]},"u":"ab","n":null})"));
  EXPECT_FALSE(c.accepts(R"({"e":null,"k":{"x":[1,3]},"u":"ab","n":null})"));
  EXPECT_FALSE(c.accepts(R"({"e":null,"k":{"x":[1,2]},"u":"abc","n":null})"));
  EXPECT_FALSE(c.accepts(R"({"e":null,"k":{"x":[1,2]},"u":4,"n":null})"));
}

TEST(JsonSchema, RefsAndRecursion) {
  const auto c = compile(R"({"$defs":{"node":{"type":"object","properties":{"v":{"type":"integer"},
      "kids":{"type":"array","items":{"$ref":"#/$defs/node"}}},"required":["v"]}},"$ref":"#/$defs/node"})");
  EXPECT_TRUE(c.accepts(R"({"v":1})"));
  EXPECT_TRUE(c.accepts(R"({"v":1,"kids":[{"v":2},{"v":3,"kids":[{"v":4,"kids":[]}]}]})"));
  EXPECT_FALSE(c.accepts(R"({"v":1,"kids":[{"w":2}]})"));
}

TEST(JsonSchema, ArraysCountsAndTuples) {
  const auto c = compile(R"({"type":"array","items":{"type":"integer"},"minItems":2,"maxItems":3})");
  EXPECT_FALSE(c.accepts("[1]"));
  EXPECT_TRUE(c.accepts("[1,2]"));
  EXPECT_TRUE(c.accepts("[ 1 , 2 , 3 ]"));
  EXPECT_FALSE(c.accepts("[1,2,3,4]"));
  EXPECT_FALSE(c.accepts("[1,2,]"));
  const auto t = compile(R"({"type":"array","prefixItems":[{"type":"string"},{"type":"boolean"}],"items":false})");
  EXPECT_TRUE(t.accepts(R"(["a",true])"));
  EXPECT_TRUE(t.accepts(R"(["a"])"));
  EXPECT_TRUE(t.accepts("[]"));
  EXPECT_FALSE(t.accepts(R"(["a",true,1])"));
  EXPECT_FALSE(t.accepts("[true]"));
}

TEST(JsonSchema, IntegerBoundsAgreeWithArithmetic) {
  const std::vector<std::pair<int, int>> ranges = {{0, 150}, {-40, 40}, {7, 7}, {-1000, -17}, {95, 105}, {0, 0}, {1, 9999}};
  for (auto [lo, hi] : ranges) {
    const auto c = compile(R"({"type":"integer","minimum":)" + std::to_string(lo) + R"(,"maximum":)" + std::to_string(hi) + "}");
    for (int v = lo - 120; v <= hi + 120; ++v)
      EXPECT_EQ(c.accepts(std::to_string(v)), v >= lo && v <= hi) << v << " in [" << lo << ", " << hi << "]";
    EXPECT_FALSE(c.accepts("-0"));
    EXPECT_FALSE(c.accepts("007"));
  }
  const auto open = compile(R"({"type":"integer","exclusiveMinimum":10})");
  for (int v = -30; v < 200; ++v) EXPECT_EQ(open.accepts(std::to_string(v)), v > 10) << v;
  EXPECT_TRUE(open.accepts("123456789012"));
  // number with bounds: whole numbers in range (every one is valid).
  const auto num = compile(R"({"type":"number","minimum":0.5,"exclusiveMaximum":3})");
  EXPECT_TRUE(num.accepts("1"));
  EXPECT_TRUE(num.accepts("2"));
  EXPECT_FALSE(num.accepts("3"));
  EXPECT_FALSE(num.accepts("0"));
}

// zod's z.number().int() (LangChain's withStructuredOutput, the AI SDK) bounds every integer
// by the safe-integer range; the grammar narrows such bounds to +-1e15, so what it allows
// still satisfies them. A bound that cannot be narrowed that way is a 400.
TEST(JsonSchema, SafeIntegerBoundsAreNarrowed) {
  const auto c = compile(R"({"type":"integer","minimum":-9007199254740991,"maximum":9007199254740991})");
  for (const char* v : {"0", "42", "-17", "999999999999999", "-1000000000000000"}) EXPECT_TRUE(c.accepts(v)) << v;
  EXPECT_FALSE(c.accepts("1000000000000001"));
  EXPECT_FALSE(c.accepts("9007199254740991"));  // valid, but outside the narrowed range
  EXPECT_NE(compile_error(R"({"type":"integer","minimum":2e15})").find("bounds beyond 1e15"), std::string::npos);
}

// Every number the unbounded grammar accepts is a finite double: JSON.parse reads 1e999 as
// Infinity, which a validator (ajv) rejects as "must be number". The largest and smallest
// texts it allows, read by strtod, stay finite and non-zero.
TEST(JsonSchema, UnboundedNumbersAreFiniteDoubles) {
  const auto num = compile(R"({"type":"number"})");
  const std::string sixteen_nines(16, '9');
  for (const std::string& t : std::vector<std::string>{sixteen_nines + "." + sixteen_nines + "e99",
                                                      "-" + sixteen_nines + "E+99", "0.0000000000000001e-99",
                                                      "1.5e-7", "-0.25", "42"}) {
    EXPECT_TRUE(num.accepts(t)) << t;
    const double v = std::strtod(t.c_str(), nullptr);
    EXPECT_TRUE(std::isfinite(v) && v != 0) << t << " reads as " << v;
  }
  for (const std::string& t : std::vector<std::string>{"1e999", "1e100", "9E+308", "1e-400", sixteen_nines + "9"})
    EXPECT_FALSE(num.accepts(t)) << t;
}

TEST(JsonSchema, PatternsAgreeWithEcmaScriptRegex) {
  const std::vector<std::string> patterns = {"^[a-z]{2,4}-\\d{3}$", "^(foo|bar)+x?$", "ab[^c]d", "^\\w+@\\w+\\.com$",
                                             "^[A-F0-9]{4}$", "^.{0,3}$", "^(a|b)*c$"};
  const std::string alphabet = "abcdfoxrABF09-@.\\\" 3w";
  std::mt19937_64 rng(7);
  for (const std::string& p : patterns) {
    const auto c = compile(Json{{"type", "string"}, {"pattern", p}}.dump());
    // std::regex works on code units: wide strings (UTF-32 here) make them code points.
    const std::wregex re(widen(p), std::regex::ECMAScript);
    for (int i = 0; i < 3000; ++i) {
      std::string s;
      const int len = static_cast<int>(rng() % 9);
      for (int k = 0; k < len; ++k) s += alphabet[rng() % alphabet.size()];
      EXPECT_EQ(c.accepts(Json(s).dump()), std::regex_search(widen(s), re)) << p << " on " << Json(s).dump();
    }
    std::mt19937_64 walk_rng(11);
    for (int i = 0; i < 30; ++i) {
      const std::string text = random_walk(c, walk_rng, 60);
      const Json v = Json::parse(text);
      EXPECT_TRUE(std::regex_search(widen(v.get<std::string>()), re)) << p << " generated " << text;
    }
  }
}

TEST(JsonSchema, FormatsAndLengths) {
  const auto c = compile(R"({"type":"object","properties":{"d":{"type":"string","format":"date"},
      "u":{"type":"string","format":"uuid"},"s":{"type":"string","minLength":2,"maxLength":3}},
      "required":["d","u","s"]})");
  EXPECT_TRUE(c.accepts(R"({"d":"2024-02-28","u":"123e4567-e89b-12d3-a456-426614174000","s":"ab"})"));
  EXPECT_FALSE(c.accepts(R"({"d":"2024-13-01","u":"123e4567-e89b-12d3-a456-426614174000","s":"ab"})"));
  EXPECT_FALSE(c.accepts(R"({"d":"2024-02-28","u":"123e4567","s":"ab"})"));
  EXPECT_FALSE(c.accepts(R"({"d":"2024-02-28","u":"123e4567-e89b-12d3-a456-426614174000","s":"abcd"})"));
  EXPECT_TRUE(c.accepts(R"({"d":"2024-02-28","u":"123e4567-e89b-12d3-a456-426614174000","s":"é\n"})"));
}

TEST(JsonSchema, UnsupportedPartsAreNamed) {
  EXPECT_EQ(compile_error(R"({"type":"object","properties":{"tags":{"type":"array","uniqueItems":true}}})"),
            "response_format.json_schema.schema.properties.tags.uniqueItems: not supported");
  EXPECT_EQ(compile_error(R"({"not":{"type":"string"}})"), "response_format.json_schema.schema.not: not supported");
  EXPECT_NE(compile_error(R"({"type":"string","pattern":"(?=a)b"})").find("schema.pattern: a lookaround"), std::string::npos);
  EXPECT_NE(compile_error(R"({"$ref":"#/$defs/missing"})").find("does not resolve"), std::string::npos);
  EXPECT_NE(compile_error(R"({"type":"integer","minimum":5,"maximum":1})").find("no integer"), std::string::npos);
  EXPECT_NE(compile_error(R"({"$defs":{"a":{"$ref":"#/$defs/a"}},"$ref":"#/$defs/a"})").find("infinite"), std::string::npos);
  // Hostile sizes are refused before they are built.
  EXPECT_NE(compile_error(R"({"type":"string","pattern":"^(a{1000}){1000}$"})").find("more than 20000"), std::string::npos);
  Json many = {{"type", "object"}, {"properties", Json::object()}};
  for (int i = 0; i < 400; ++i) many["properties"]["p" + std::to_string(i)] = {{"type", "string"}, {"maxLength", 1000}};
  EXPECT_NE(compile_error(many.dump()).find("too large"), std::string::npos);
}

// Random walks under the masks always end in JSON the schema accepts, within the budget,
// even though nothing steers them to finish: budget forcing closes every string, array
// and object in time.
TEST(JsonSchema, RandomWalksFinishValidWithinBudget) {
  const auto c = compile(R"({"type":"object","properties":{
      "name":{"type":"string"},"age":{"type":"integer","minimum":0,"maximum":150},
      "tags":{"type":"array","items":{"type":"string"},"maxItems":3},
      "addr":{"type":"object","properties":{"city":{"type":"string"},"zip":{"type":"string","pattern":"^[0-9]{5}$"}},
              "required":["city","zip"]},
      "kind":{"enum":["a","b"]}},"required":["name","age","addr","kind"]})");
  // The shortest valid value takes this many tokens (the server refuses a smaller
  // max_tokens); every budget from there up must be met.
  const int32_t least = c.rt->distance(c.rt->initial_state());
  EXPECT_GT(least, 50);
  EXPECT_TRUE(c.accepts(R"({"name":"","age":0,"addr":{"city":"","zip":"00000"},"kind":"a"})"));
  std::mt19937_64 rng(1);
  for (int64_t budget : {static_cast<int64_t>(least), least + 5L, 100L, 200L}) {
    for (int i = 0; i < 25; ++i) {
      const std::string text = random_walk(c, rng, budget);
      Json v;
      ASSERT_NO_THROW(v = Json::parse(text)) << text;
      ASSERT_TRUE(v.is_object()) << text;
      EXPECT_TRUE(v["name"].is_string());
      EXPECT_TRUE(v["age"].is_number_integer() && v["age"] >= 0 && v["age"] <= 150) << text;
      EXPECT_TRUE(v["addr"]["city"].is_string());
      EXPECT_TRUE(std::regex_match(v["addr"]["zip"].get<std::string>(), std::regex("[0-9]{5}"))) << text;
      EXPECT_TRUE(v["kind"] == "a" || v["kind"] == "b");
      if (v.contains("tags")) EXPECT_LE(v["tags"].size(), 3u);
    }
  }
}

TEST(JsonSchema, AnyJsonObject) {
  Builder b;
  JsonGrammar jg(b);
  const int32_t root = jg.any_object();
  auto g = std::make_shared<Grammar>(b.finish(root));
  Compiled c{std::make_shared<GrammarRuntime>(g, test_vocab())};
  EXPECT_TRUE(c.accepts(R"({"a":[1,{"b":null}],"c":"\u00e9\n"})"));
  EXPECT_FALSE(c.accepts(R"([1])"));
  std::mt19937_64 rng(5);
  for (int i = 0; i < 50; ++i) {
    const std::string text = random_walk(c, rng, 48);
    EXPECT_TRUE(Json::accept(text)) << text;
  }
}

}  // namespace
}  // namespace moonrun::grammar
