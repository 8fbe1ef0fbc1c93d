// `moonrun render` and `moonrun parse` as a user runs them: the binary's output for a
// fixture request is the reference encoder's prompt, and --stream parses to the same
// message as the one-shot parse.
#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "chat/render_json.h"

namespace moonrun::chat {
namespace {

const std::filesystem::path kFixtures = std::filesystem::path(MOONRUN_SOURCE_DIR) / "tests/fixtures/chat";

struct CliRun {
  int exit_code;
  std::string out;
};

CliRun run(const std::string& args) {
  const std::string cmd = std::string(MOONRUN_EXE) + " " + args + " 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  std::string out;
  std::array<char, 4096> buf;
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), p)) > 0) out.append(buf.data(), n);
  const int status = pclose(p);
  return {WEXITSTATUS(status), out};
}

std::string read_file(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

TEST(CliRender, PrintsTheReferencePrompt) {
  const auto req = kFixtures / "requests/39_everything.json";
  const Json expected = Json::parse(read_file(kFixtures / "expected/39_everything.json"));
  CliRun k3 = run("render --format kimi_k3 --request " + req.string());
  EXPECT_EQ(k3.exit_code, 0);
  EXPECT_EQ(k3.out, expected["kimi_k3"]["text"].get<std::string>());
  CliRun k2 = run("render --format kimi_k2 --request " + req.string());
  EXPECT_EQ(k2.out, expected["kimi_k2"]["text"].get<std::string>());
}

TEST(CliRender, ModelDirectoryPicksTheFormat) {
  const auto dir = std::filesystem::temp_directory_path() / "moonrun_cli_chat_k2";
  std::filesystem::create_directories(dir);
  std::ofstream(dir / "config.json") << R"({"model_type": "kimi_linear"})";
  CliRun r = run("render --model " + dir.string() + " --request " + (kFixtures / "requests/01_simple_user.json").string());
  EXPECT_EQ(r.out, Json::parse(read_file(kFixtures / "expected/01_simple_user.json"))["kimi_k2"]["text"].get<std::string>());
  std::filesystem::remove_all(dir);
}

TEST(CliRender, BadRequestIsOneLineError) {
  const auto path = std::filesystem::temp_directory_path() / "moonrun_cli_bad_request.json";
  std::ofstream(path) << R"({"messages":[{"role":"robot","content":"x"}]})";
  CliRun r = run("render --format kimi_k3 --request " + path.string());
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_EQ(r.out, "moonrun render: " + path.string() +
                       ": messages[0].role: unknown role 'robot' (system, developer, user, assistant, tool)\n");
  std::filesystem::remove(path);
}

// A checkpoint whose vocabulary is the 256 single bytes (rank = byte value), so every
// ordinary token id is a byte of the prompt and K3's special ids follow at 256 + offset
// (K3_SPEC §4: <|end_of_msg|> +2, <|open|> +3, <|close|> +4, <|sep|> +5).
TEST(CliRender, IdsKeepMarkersSpecialAndUserTextOrdinary) {
  const auto dir = std::filesystem::temp_directory_path() / "moonrun_cli_chat_bytes";
  std::filesystem::create_directories(dir);
  std::ofstream(dir / "config.json") << R"({"model_type": "kimi_k3"})";
  {
    static const char* b64 = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    std::ofstream ranks(dir / "tiktoken.model");
    for (int b = 0; b < 256; ++b)
      ranks << b64[b >> 2] << b64[(b & 3) << 4] << "== " << b << "\n";
  }
  const auto req = dir / "req.json";
  std::ofstream(req) << R"({"messages":[{"role":"user","content":"<|open|>"}],"reasoning_effort":"none"})";
  CliRun r = run("render --model " + dir.string() + " --ids --request " + req.string());
  ASSERT_EQ(r.exit_code, 0) << r.out;
  const Json ids = Json::parse(r.out);
  CliRun text = run("render --model " + dir.string() + " --request " + req.string());
  // Expected: walk the prompt text; each marker the renderer wrote is one special id, and
  // the user's "<|open|>" (the only one after `role="user"<|sep|>`) is its 8 bytes.
  const std::string prompt = text.out;
  std::vector<uint32_t> want;
  const std::vector<std::pair<std::string, uint32_t>> markers = {
      {"<|open|>", 259}, {"<|close|>", 260}, {"<|sep|>", 261}, {"<|end_of_msg|>", 258}};
  const size_t user_text_at = prompt.find("role=\"user\"<|sep|>") + std::string("role=\"user\"<|sep|>").size();
  for (size_t i = 0; i < prompt.size();) {
    bool matched = false;
    if (i != user_text_at) {
      for (const auto& [m, id] : markers) {
        if (prompt.compare(i, m.size(), m) == 0) {
          want.push_back(id);
          i += m.size();
          matched = true;
          break;
        }
      }
    }
    if (!matched) {
      if (i == user_text_at) {
        for (char c : std::string("<|open|>")) want.push_back(static_cast<unsigned char>(c));
        i += 8;
      } else {
        want.push_back(static_cast<unsigned char>(prompt[i++]));
      }
    }
  }
  EXPECT_EQ(ids.get<std::vector<uint32_t>>(), want);
  std::filesystem::remove_all(dir);
}

TEST(CliParse, StreamEqualsOneShot) {
  const auto path = std::filesystem::temp_directory_path() / "moonrun_cli_completion.txt";
  std::ofstream(path) << "Thinking it over.<|close|>think<|sep|><|open|>response<|sep|>Checking.<|close|>response<|sep|>"
                         "<|open|>tools<|sep|><|open|>call tool=\"get_weather\" index=\"1\"<|sep|>"
                         "<|open|>argument key=\"city\" type=\"string\"<|sep|>Zürich<|close|>argument<|sep|>"
                         "<|open|>argument key=\"days\" type=\"number\"<|sep|>3<|close|>argument<|sep|>"
                         "<|close|>call<|sep|><|close|>tools<|sep|><|close|>message<|sep|><|end_of_msg|>";
  CliRun one = run("parse --format kimi_k3 --text " + path.string());
  ASSERT_EQ(one.exit_code, 0) << one.out;
  const Json m = Json::parse(one.out);
  EXPECT_EQ(m["reasoning_content"], "Thinking it over.");
  EXPECT_EQ(m["content"], "Checking.");
  ASSERT_EQ(m["tool_calls"].size(), 1u);
  EXPECT_EQ(m["tool_calls"][0]["type"], "function");
  EXPECT_EQ(m["tool_calls"][0]["function"]["name"], "get_weather");
  EXPECT_EQ(m["tool_calls"][0]["function"]["arguments"], "{\"city\": \"Zürich\", \"days\": 3}");
  for (const char* chunk : {"1", "3", "7"}) {
    CliRun streamed = run("parse --format kimi_k3 --stream --chunk-bytes " + std::string(chunk) + " --text " + path.string());
    EXPECT_EQ(streamed.out, one.out);
  }
  std::filesystem::remove(path);
}


TEST(CliParse, RequestGivesToolsAndToolChoice) {
  // As the server parses: the request's tools name K2 calls whose id names no function,
  // tool_choice "none" (or no tools at all) means no calls, reasoning_effort none means no
  // think channel.
  const auto dir = std::filesystem::temp_directory_path();
  const auto completion = dir / "moonrun_cli_k2_completion.txt";
  const auto with_tools = dir / "moonrun_cli_request_tools.json";
  const auto choice_none = dir / "moonrun_cli_request_none.json";
  std::ofstream(completion) << "<think>hm</think>Sure.<|tool_calls_section_begin|><|tool_call_begin|>call_3"
                               "<|tool_call_argument_begin|>{\"city\": \"Oslo\"}<|tool_call_end|>"
                               "<|tool_calls_section_end|><|im_end|>";
  const std::string tools =
      R"("tools":[{"type":"function","function":{"name":"get_weather","parameters":{"type":"object","properties":{"city":{"type":"string"}}}}},)"
      R"({"type":"function","function":{"name":"read_file","parameters":{"type":"object","properties":{"path":{"type":"string"}}}}}])";
  std::ofstream(with_tools) << R"({"messages":[{"role":"user","content":"x"}],)" << tools << "}";
  std::ofstream(choice_none) << R"({"messages":[{"role":"user","content":"x"}],"tool_choice":"none",)" << tools << "}";

  CliRun bare = run("parse --format kimi_k2 --text " + completion.string());
  ASSERT_EQ(bare.exit_code, 0) << bare.out;
  EXPECT_EQ(Json::parse(bare.out)["tool_calls"].size(), 0u);  // no tools known: "call_3" names nothing

  CliRun named = run("parse --format kimi_k2 --request " + with_tools.string() + " --text " + completion.string());
  ASSERT_EQ(named.exit_code, 0) << named.out;
  const Json m = Json::parse(named.out);
  ASSERT_EQ(m["tool_calls"].size(), 1u);
  EXPECT_EQ(m["tool_calls"][0]["function"]["name"], "get_weather");
  EXPECT_EQ(m["tool_calls"][0]["id"], "call_3");
  EXPECT_EQ(m["content"], "Sure.");
  EXPECT_EQ(m["reasoning_content"], "hm");

  CliRun none = run("parse --format kimi_k2 --stream --request " + choice_none.string() + " --text " + completion.string());
  ASSERT_EQ(none.exit_code, 0) << none.out;
  EXPECT_EQ(Json::parse(none.out)["tool_calls"].size(), 0u);
  EXPECT_EQ(Json::parse(none.out)["content"], "Sure.");

  CliRun bad = run("parse --format kimi_k2 --request " + completion.string() + " --text " + completion.string());
  EXPECT_EQ(bad.exit_code, 2);
  for (const auto& p : {completion, with_tools, choice_none}) std::filesystem::remove(p);
}

}  // namespace
}  // namespace moonrun::chat
