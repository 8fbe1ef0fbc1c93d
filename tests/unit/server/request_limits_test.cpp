// The pieces of the HTTP layer's limits that need no socket: JSON nesting depth, typed
// field access, decoded-size limits for gzip/deflate bodies, and one-line log records.
#include <zlib.h>

#include <gtest/gtest.h>

#include <string>

#include "common/log.h"
#include "server/content_decoding.h"
#include "server/request_json.h"

namespace moonrun::server {
namespace {

std::string gzip(const std::string& in, bool raw_deflate = false) {
  z_stream zs{};
  deflateInit2(&zs, 9, Z_DEFLATED, raw_deflate ? -15 : 15 + 16, 9, Z_DEFAULT_STRATEGY);
  std::string out(deflateBound(&zs, in.size()) + 64, '\0');
  zs.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(in.data()));
  zs.avail_in = in.size();
  zs.next_out = reinterpret_cast<Bytef*>(out.data());
  zs.avail_out = out.size();
  deflate(&zs, Z_FINISH);
  out.resize(zs.total_out);
  deflateEnd(&zs);
  return out;
}

TEST(RequestJson, DepthIsCountedOutsideStringsOnly) {
  EXPECT_EQ(json_nesting_depth("{}"), 1);
  EXPECT_EQ(json_nesting_depth(R"({"a":[{"b":[1]}]})"), 4);
  EXPECT_EQ(json_nesting_depth(R"({"a":"[[[[[[\"[[["})"), 1);
  const std::string deep = std::string(20000, '[') + std::string(20000, ']');
  EXPECT_GT(json_nesting_depth(deep), kMaxJsonDepth);
}

TEST(RequestJson, TooDeepIsAnErrorBeforeParsing) {
  const std::string body = R"({"tools":)" + std::string(20000, '[') + std::string(20000, ']') + "}";
  auto r = parse_request_json(body);
  ASSERT_FALSE(r.is_ok());
  EXPECT_NE(r.status().message().find("nested deeper than"), std::string::npos);
  const std::string ok = R"({"a":)" + std::string(kMaxJsonDepth - 1, '[') + std::string(kMaxJsonDepth - 1, ']') + "}";
  EXPECT_TRUE(parse_request_json(ok).is_ok());
}

TEST(RequestJson, WrongTypesAreStatusesNamingTheField) {
  auto j = nlohmann::json::parse(R"({"stream":"yes","n":1.5,"name":3,"ok":true})");
  auto b = json_bool(j, "stream", false);
  ASSERT_FALSE(b.is_ok());
  EXPECT_EQ(b.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(b.status().message().find("stream"), std::string::npos);
  EXPECT_FALSE(json_int(j, "n", 0).is_ok());
  EXPECT_FALSE(json_string(j, "name", "").is_ok());
  EXPECT_TRUE(*json_bool(j, "ok", false));
  EXPECT_TRUE(*json_bool(j, "absent", true));
}

TEST(ContentDecoding, GzipAndDeflateRoundTrip) {
  const std::string text = R"({"prompt":"hello"})";
  std::string body = gzip(text);
  EXPECT_EQ(decode_content("gzip", body, 1 << 20).status, 200);
  EXPECT_EQ(body, text);
  body = gzip(text, /*raw_deflate=*/true);
  EXPECT_EQ(decode_content("deflate", body, 1 << 20).status, 200);
  EXPECT_EQ(body, text);
  body = text;
  EXPECT_EQ(decode_content("", body, 1 << 20).status, 200);
  EXPECT_EQ(body, text);
}

TEST(ContentDecoding, ABombStopsAtTheLimit) {
  // 64 MB of zeros compress to ~64 KB; the limit is 1 MB.
  std::string body = gzip(std::string(64 << 20, '0'));
  ASSERT_LT(body.size(), 200000u);
  const DecodeResult r = decode_content("gzip", body, 1 << 20);
  EXPECT_EQ(r.status, 413);
  EXPECT_NE(r.error.find("--max-request-bytes"), std::string::npos);
}

TEST(ContentDecoding, CorruptAndUnknownEncodingsAreRefused) {
  std::string body = "not gzip at all";
  EXPECT_EQ(decode_content("gzip", body, 1 << 20).status, 400);
  body = "x";
  EXPECT_EQ(decode_content("br", body, 1 << 20).status, 415);
  EXPECT_EQ(decode_content("gzip, gzip", body, 1 << 20).status, 415);
}

TEST(Log, ControlCharactersCannotStartANewLine) {
  EXPECT_EQ(escape_log_text("low\n[2026-01-01 00:00:00] admin"), "low\\n[2026-01-01 00:00:00] admin");
  EXPECT_EQ(escape_log_text("a\rb\x1b[31mc"), "a\\rb\\x1b[31mc");
  EXPECT_EQ(escape_log_text("x\xe2\x80\xa8y"), "x\\u2028y");
  EXPECT_EQ(escape_log_text("caf\xc3\xa9"), "caf\xc3\xa9");  // UTF-8 text stays as it is
}

TEST(Log, EveryLevelHasANameAndParses) {
  for (const char* name : {"trace", "debug", "info", "warning", "error", "critical"}) {
    LogLevel l;
    ASSERT_TRUE(parse_log_level(name, l)) << name;
    EXPECT_STREQ(log_level_name(l), name);
  }
  LogLevel l;
  EXPECT_FALSE(parse_log_level("verbose", l));
}

}  // namespace
}  // namespace moonrun::server
