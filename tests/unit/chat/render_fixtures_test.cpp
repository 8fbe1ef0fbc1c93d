// Render output against the reference encoders, byte for byte: every request under
// tests/fixtures/chat/requests/ was rendered by Moonshot's encoding_k3.py (K3 segments) and
// by the Kimi-K2-Thinking chat template under jinja2 (K2 text); see the README there.
#include <filesystem>
#include <fstream>
#include <sstream>

#include <gtest/gtest.h>

#include "chat/chat_request.h"
#include "chat/render_chat.h"

namespace moonrun::chat {
namespace {

const std::filesystem::path kFixtures = std::filesystem::path(MOONRUN_SOURCE_DIR) / "tests/fixtures/chat";

std::string read_file(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// The first differing byte, with context, so a failure says where the prompts part.
std::string first_difference(const std::string& want, const std::string& got) {
  size_t i = 0;
  while (i < want.size() && i < got.size() && want[i] == got[i]) ++i;
  const size_t from = i > 40 ? i - 40 : 0;
  return "at byte " + std::to_string(i) + "\n want: ..." + want.substr(from, 100) + "\n got:  ..." + got.substr(from, 100);
}

std::vector<std::filesystem::path> request_files() {
  std::vector<std::filesystem::path> out;
  for (const auto& e : std::filesystem::directory_iterator(kFixtures / "requests"))
    if (e.path().extension() == ".json") out.push_back(e.path());
  std::sort(out.begin(), out.end());
  return out;
}

// The corpus is whole: enough requests, and each has both references' answers (a request
// without them would be skipped silently by the loops below).
TEST(RenderFixtures, EveryRequestHasBothReferences) {
  const auto files = request_files();
  EXPECT_GE(files.size(), 30u);
  for (const auto& path : files) {
    SCOPED_TRACE(path.filename().string());
    const std::filesystem::path expected = kFixtures / "expected" / path.filename();
    ASSERT_TRUE(std::filesystem::exists(expected));
    const Json e = Json::parse(read_file(expected));
    EXPECT_TRUE(e.contains("kimi_k3") && e.contains("kimi_k2"));
  }
}

TEST(RenderFixtures, K3SegmentsMatchReferenceEncoder) {
  for (const auto& path : request_files()) {
    SCOPED_TRACE(path.filename().string());
    auto req = parse_chat_request_text(read_file(path));
    ASSERT_TRUE(req.is_ok()) << req.status().message();
    const Json expected = Json::parse(read_file(kFixtures / "expected" / path.filename()))["kimi_k3"];
    auto segments = render_chat(ChatFormat::kKimiK3, *req);
    if (expected.contains("error")) {
      // The reference encoder refuses this request (an effort it does not support): a 400
      // that names the field, never a prompt of our own making.
      ASSERT_FALSE(segments.is_ok()) << "the reference refuses: " << expected["error"];
      EXPECT_EQ(segments.status().code(), StatusCode::kInvalidArgument);
      EXPECT_NE(segments.status().message().find("thinking_effort"), std::string::npos) << segments.status().message();
      continue;
    }
    ASSERT_TRUE(segments.is_ok()) << segments.status().message();
    const std::string want = expected["text"].get<std::string>();
    const std::string got = join_segments(*segments);
    ASSERT_EQ(want, got) << first_difference(want, got);
    // Boundaries and special flags too: the tokenizer encodes each segment on its own.
    ASSERT_EQ(expected["segments"].size(), segments->size());
    for (size_t i = 0; i < segments->size(); ++i) {
      EXPECT_EQ(expected["segments"][i][0].get<std::string>(), (*segments)[i].text) << "segment " << i;
      EXPECT_EQ(expected["segments"][i][1].get<bool>(), (*segments)[i].allow_special) << "segment " << i;
    }
  }
}

TEST(RenderFixtures, K2TextMatchesChatTemplate) {
  for (const auto& path : request_files()) {
    SCOPED_TRACE(path.filename().string());
    auto req = parse_chat_request_text(read_file(path));
    ASSERT_TRUE(req.is_ok()) << req.status().message();
    const Json expected = Json::parse(read_file(kFixtures / "expected" / path.filename()))["kimi_k2"];
    auto segments = render_chat(ChatFormat::kKimiK2, *req);
    ASSERT_TRUE(segments.is_ok()) << segments.status().message();
    const std::string want = expected["text"].get<std::string>();
    const std::string got = join_segments(*segments);
    EXPECT_EQ(want, got) << first_difference(want, got);
  }
}

TEST(RenderK3, SpecialSegmentsAreOnlyMarkers) {
  // User text that spells a marker stays ordinary text; only the four markers (and the image
  // placeholder, as the reference marks it) may become special tokens.
  auto req = parse_chat_request_text(read_file(kFixtures / "requests/32_markers_in_user_text.json"));
  ASSERT_TRUE(req.is_ok());
  auto segments = render_chat(ChatFormat::kKimiK3, *req);
  ASSERT_TRUE(segments.is_ok());
  for (const auto& s : *segments) {
    if (!s.allow_special) continue;
    EXPECT_TRUE(s.text == "<|open|>" || s.text == "<|close|>" || s.text == "<|sep|>" || s.text == "<|end_of_msg|>")
        << s.text;
  }
}

TEST(RenderK3, ImagePromptsReplacePlaceholders) {
  auto req = parse_chat_request_text(read_file(kFixtures / "requests/09_images.json"));
  ASSERT_TRUE(req.is_ok());
  RenderOptions opts;
  opts.image_prompts = {"<|media_begin|>image 128x128<|media_content|><|media_pad|><|media_end|>",
                        "<|media_begin|>image 64x32<|media_content|><|media_pad|><|media_end|>"};
  auto segments = render_chat(ChatFormat::kKimiK3, *req, opts);
  ASSERT_TRUE(segments.is_ok()) << segments.status().message();
  const std::string text = join_segments(*segments);
  EXPECT_NE(text.find("Compare <|media_begin|>image 128x128"), std::string::npos) << text;
  EXPECT_NE(text.find(" and <|media_begin|>image 64x32"), std::string::npos) << text;
  opts.image_prompts.pop_back();
  auto short_prompts = render_chat(ChatFormat::kKimiK3, *req, opts);
  ASSERT_FALSE(short_prompts.is_ok());
  EXPECT_NE(short_prompts.status().message().find("more images"), std::string::npos);
}

TEST(RenderK3, UnresolvableToolNameIsAnError) {
  auto req = parse_chat_request_text(R"({"messages":[{"role":"user","content":"x"},{"role":"tool","content":"y"}]})");
  ASSERT_TRUE(req.is_ok());
  auto segments = render_chat(ChatFormat::kKimiK3, *req);
  ASSERT_FALSE(segments.is_ok());
  EXPECT_EQ(segments.status().message().rfind("messages[1]: tool message needs a tool name", 0), 0u)
      << segments.status().message();
}

TEST(RenderK3, NonObjectArgumentsAreAnError) {
  auto req = parse_chat_request_text(
      R"({"messages":[{"role":"assistant","content":"","tool_calls":[{"id":"a","type":"function","function":{"name":"f","arguments":"[1,2]"}}]}]})");
  ASSERT_TRUE(req.is_ok());
  auto segments = render_chat(ChatFormat::kKimiK3, *req);
  ASSERT_FALSE(segments.is_ok());
  EXPECT_EQ(segments.status().message(),
            "messages[0].tool_calls[0].function.arguments: Kimi K3 tool call arguments must be a JSON object");
}

}  // namespace
}  // namespace moonrun::chat
