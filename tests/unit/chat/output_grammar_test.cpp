// The completion grammars against the format itself: an assistant message as the reference
// encoders write it (render_chat is byte-exact to encoding_k3.py and the K2 template, see
// render_fixtures_test.cpp) must be a completion the grammar allows, token by token;
// messages that break the request (a wrong tool, an argument outside its schema, a second
// call with parallel_tool_calls false, a markdown fence around JSON) must not be.
#include "chat/output_grammar.h"

#include <gtest/gtest.h>

#include <iostream>

#include "chat/bpe_train.h"
#include "chat/parse_message.h"
#include "chat/pretokenize.h"
#include "grammar/matcher.h"

namespace moonrun::chat {
namespace {

Tokenizer make_tokenizer(ChatFormat format) {
  auto tokens = train_bpe_ranks(builtin_bpe_corpus(), 300, kKimiPattern);
  EXPECT_TRUE(tokens.is_ok());
  auto ranks = RankTable::from_tokens(*tokens);
  const uint32_t base = static_cast<uint32_t>(ranks->size());
  std::vector<SpecialToken> specials = kimi_k3_default_special_tokens(base);
  if (format == ChatFormat::kKimiK2) {
    specials.clear();
    uint32_t id = base;
    for (const char* name : {"<|im_end|>", "<|im_user|>", "<|im_assistant|>", "<|im_system|>", "<|im_middle|>",
                             "<think>", "</think>", "<|tool_calls_section_begin|>", "<|tool_calls_section_end|>",
                             "<|tool_call_begin|>", "<|tool_call_argument_begin|>", "<|tool_call_end|>"})
      specials.push_back({name, id++});
  }
  auto t = Tokenizer::create(std::move(ranks).value(), specials);
  EXPECT_TRUE(t.is_ok()) << t.status().message();
  return std::move(t).value();
}

const char* kTools = R"([
  {"type":"function","function":{"name":"get_weather","parameters":{"type":"object",
    "properties":{"city":{"type":"string","maxLength":12},"unit":{"enum":["c","f"]},"days":{"type":"integer","minimum":1,"maximum":7}},
    "required":["city","unit"]}}},
  {"type":"function","function":{"name":"search","parameters":{"type":"object",
    "properties":{"q":{"type":"string"},"filters":{"type":"object","properties":{"lang":{"type":"string"}}},
    "limit":{"anyOf":[{"type":"integer"},{"type":"null"}]}},"required":["q"]}}}])";

ChatRequest request(const std::string& extra) {
  auto r = parse_chat_request_text(std::string(R"({"messages":[{"role":"user","content":"hi"}],"tools":)") + kTools + extra + "}");
  EXPECT_TRUE(r.is_ok()) << r.status().message();
  return *r;
}

// The completion the model would write for `assistant`: the message rendered as the
// reference does, after the generation prompt.
std::string completion(ChatFormat format, const ChatRequest& req, const std::string& assistant_json) {
  ChatRequest one = req;
  auto msg = parse_chat_request_text(R"({"messages":[)" + assistant_json + "]}");
  EXPECT_TRUE(msg.is_ok()) << msg.status().message();
  one.messages = msg->messages;
  one.tools = Json();  // the message alone: no declarations, no internal system messages after it
  one.tool_choice = ToolChoice{};
  one.response_format = ResponseFormat{};
  RenderOptions o;
  o.add_generation_prompt = false;
  const std::string text = join_segments(*render_chat(format, one, o));
  if (format == ChatFormat::kKimiK3) {
    const std::string opener = one.thinking ? "<|open|>think<|sep|>" : "<|open|>response<|sep|>";
    return text.substr(text.find(opener) + opener.size());
  }
  const size_t at = text.find("<|im_middle|>", text.find("<|im_assistant|>"));
  return text.substr(at + std::string("<|im_middle|>").size());
}

// Feeds the completion's tokens through the grammar: true when every token is allowed
// (the mask has its bit) and the grammar may end there.
bool allows(ChatFormat format, const Tokenizer& tok, const ChatRequest& req, const std::string& text) {
  auto g = output_grammar(format, req, tok);
  EXPECT_TRUE(g.is_ok()) << g.status().message();
  EXPECT_TRUE(*g);
  const int32_t eos = static_cast<int32_t>(*tok.special_id(format == ChatFormat::kKimiK3 ? "<|end_of_msg|>" : "<|im_end|>"));
  auto rt = std::make_shared<grammar::GrammarRuntime>(*g, token_vocab(tok, {eos}));
  grammar::Matcher m(rt, -1);
  std::vector<uint32_t> words((tok.vocab_size() + 31) / 32);
  std::string seen;
  for (uint32_t id : tok.encode(text, /*allow_special=*/true)) {
    std::fill(words.begin(), words.end(), 0u);
    m.fill_allowed(words);
    const bool allowed = words[id / 32] >> (id % 32) & 1u;
    if (!allowed || !m.accept(static_cast<int32_t>(id))) {
      std::cerr << "  (the grammar stops at token " << id << " '" << tok.token_bytes(id) << "' after: " << seen << ")\n";
      return false;
    }
    seen += tok.token_bytes(id);
  }
  return m.finished();
}

TEST(OutputGrammar, K3ToolCallsAsTheEncoderWritesThem) {
  const Tokenizer tok = make_tokenizer(ChatFormat::kKimiK3);
  ChatRequest req = request(R"(,"tool_choice":"required")");
  const std::string two =
      R"({"role":"assistant","reasoning_content":"Let me look.","content":"Checking.","tool_calls":[
           {"id":"a","type":"function","function":{"name":"get_weather","arguments":"{\"city\": \"Oslo\", \"unit\": \"c\", \"days\": 3}"}},
           {"id":"b","type":"function","function":{"name":"search","arguments":"{\"q\": \"rain \\\"now\\\"\", \"filters\": {\"lang\": \"en\"}, \"limit\": null}"}}]})";
  EXPECT_TRUE(allows(ChatFormat::kKimiK3, tok, req, completion(ChatFormat::kKimiK3, req, two)));
  // Thinking off: the prompt opened the response channel.
  ChatRequest off = request(R"(,"tool_choice":"required","reasoning_effort":"none")");
  EXPECT_TRUE(allows(ChatFormat::kKimiK3, tok, off, completion(ChatFormat::kKimiK3, off, two)));
  // Broken against the request: an enum value outside the schema, an unknown tool, a
  // missing required argument, no call at all.
  for (const std::string bad :
       {R"({"role":"assistant","content":"","tool_calls":[{"id":"a","type":"function","function":{"name":"get_weather","arguments":"{\"city\": \"Oslo\", \"unit\": \"k\"}"}}]})",
        R"({"role":"assistant","content":"","tool_calls":[{"id":"a","type":"function","function":{"name":"delete_all","arguments":"{}"}}]})",
        R"({"role":"assistant","content":"","tool_calls":[{"id":"a","type":"function","function":{"name":"get_weather","arguments":"{\"city\": \"Oslo\"}"}}]})",
        R"({"role":"assistant","content":"no tools today"})"})
    EXPECT_FALSE(allows(ChatFormat::kKimiK3, tok, req, completion(ChatFormat::kKimiK3, req, bad))) << bad;
  // parallel_tool_calls false: one call, not two; a named tool: that one only.
  ChatRequest single = request(R"(,"tool_choice":"required","parallel_tool_calls":false)");
  EXPECT_FALSE(allows(ChatFormat::kKimiK3, tok, single, completion(ChatFormat::kKimiK3, single, two)));
  ChatRequest named = request(R"(,"tool_choice":{"type":"function","function":{"name":"search"}})");
  const std::string search_only =
      R"({"role":"assistant","content":"","tool_calls":[{"id":"b","type":"function","function":{"name":"search","arguments":"{\"q\": \"x\"}"}}]})";
  EXPECT_TRUE(allows(ChatFormat::kKimiK3, tok, named, completion(ChatFormat::kKimiK3, named, search_only)));
  EXPECT_FALSE(allows(ChatFormat::kKimiK3, tok, named, completion(ChatFormat::kKimiK3, named, two)));
}

TEST(OutputGrammar, K3JsonResponse) {
  const Tokenizer tok = make_tokenizer(ChatFormat::kKimiK3);
  auto req = parse_chat_request_text(R"({"messages":[{"role":"user","content":"hi"}],
      "response_format":{"type":"json_schema","json_schema":{"name":"x","schema":{"type":"object",
        "properties":{"n":{"type":"integer"},"tags":{"type":"array","items":{"type":"string"}}},"required":["n"]}}}})");
  ASSERT_TRUE(req.is_ok());
  auto msg = [](const std::string& content) {
    return R"({"role":"assistant","reasoning_content":"r","content":)" + Json(content).dump() + "}";
  };
  EXPECT_TRUE(allows(ChatFormat::kKimiK3, tok, *req, completion(ChatFormat::kKimiK3, *req, msg(R"({"n": 3, "tags": ["a", "b"]})"))));
  EXPECT_FALSE(allows(ChatFormat::kKimiK3, tok, *req, completion(ChatFormat::kKimiK3, *req, msg("```json\n{\"n\": 3}\n```"))));
  EXPECT_FALSE(allows(ChatFormat::kKimiK3, tok, *req, completion(ChatFormat::kKimiK3, *req, msg(R"({"tags": []})"))));
}

TEST(OutputGrammar, K2ToolCallsAsTheTemplateWritesThem) {
  const Tokenizer tok = make_tokenizer(ChatFormat::kKimiK2);
  ChatRequest req = request(R"(,"tool_choice":"required")");
  const std::string call =
      R"({"role":"assistant","reasoning_content":"hm","content":"","tool_calls":[
           {"id":"functions.get_weather:0","type":"function","function":{"name":"get_weather","arguments":"{\"city\": \"Oslo\", \"unit\": \"f\"}"}}]})";
  EXPECT_TRUE(allows(ChatFormat::kKimiK2, tok, req, completion(ChatFormat::kKimiK2, req, call)));
  const std::string wrong =
      R"({"role":"assistant","content":"","tool_calls":[
           {"id":"functions.get_weather:0","type":"function","function":{"name":"get_weather","arguments":"{\"city\": 7, \"unit\": \"f\"}"}}]})";
  EXPECT_FALSE(allows(ChatFormat::kKimiK2, tok, req, completion(ChatFormat::kKimiK2, req, wrong)));
}

TEST(OutputGrammar, NothingToConstrainAndErrorsNameThePart) {
  const Tokenizer tok = make_tokenizer(ChatFormat::kKimiK3);
  EXPECT_FALSE(*output_grammar(ChatFormat::kKimiK3, request(""), tok));  // auto, parallel: free
  auto bad = parse_chat_request_text(std::string(R"({"messages":[{"role":"user","content":"hi"}],"tool_choice":"required",
      "tools":[{"type":"function","function":{"name":"f","parameters":{"type":"object","properties":{"x":{"type":"array","uniqueItems":true}}}}}]})"));
  ASSERT_TRUE(bad.is_ok());
  auto g = output_grammar(ChatFormat::kKimiK3, *bad, tok);
  ASSERT_FALSE(g.is_ok());
  EXPECT_EQ(g.status().message(), "tools[0].function.parameters.properties.x.uniqueItems: not supported");
}

}  // namespace
}  // namespace moonrun::chat
