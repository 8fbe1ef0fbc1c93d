// image_url parts through the server's checks (server/image_input.h): each kind of bad
// image a hostile or careless client sends is a request error naming the problem, and the
// seed's image becomes the 25 rows the spec promises.
#include <gtest/gtest.h>

#include "../../support/png.h"
#include "server/image_input.h"

namespace moonrun::server {
namespace {

ImageInputConfig config() {
  ImageInputConfig c;
  c.placeholder_id = 163605;
  return c;
}

std::string data_uri(const std::string& type, const std::vector<uint8_t>& bytes) {
  return "data:" + type + ";base64," + testing::base64(bytes);
}

std::string error_of(const std::string& url, const ImageInputConfig& c = config()) {
  auto r = load_image(url, c, "messages[0].content[1].image_url");
  EXPECT_FALSE(r.is_ok()) << url.substr(0, 60);
  if (r.is_ok()) return "";
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(r.status().message().rfind("messages[0].content[1].image_url: ", 0), 0u) << r.status().message();
  return r.status().message();
}

TEST(ImageInput, SeedImageGives25Tokens) {
  auto r = load_image(data_uri("image/png", testing::seed_png()), config(), "image");
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  EXPECT_EQ(r->width, 128);
  EXPECT_EQ(r->height, 128);
  EXPECT_EQ(r->num_tokens, 25);
}

TEST(ImageInput, UrlsAreRefusedWithoutTheFlag) {
  EXPECT_NE(error_of("https://example.com/cat.png").find("--allow-image-urls"), std::string::npos);
  EXPECT_NE(error_of("http://169.254.169.254/latest/meta-data").find("refused"), std::string::npos);
  ImageInputConfig allowed = config();
  allowed.limits.allow_urls = true;
  EXPECT_NE(error_of("https://example.com/cat.png", allowed).find("not supported"), std::string::npos);
  EXPECT_NE(error_of("file:///etc/passwd").find("data: URI"), std::string::npos);
}

TEST(ImageInput, WrongMediaTypeIsRefused) {
  EXPECT_NE(error_of(data_uri("text/plain", testing::seed_png())).find("not an image type"), std::string::npos);
  // A PNG labelled as JPEG.
  EXPECT_NE(error_of(data_uri("image/jpeg", testing::seed_png())).find("the data is a png image"),
            std::string::npos);
  EXPECT_NE(error_of("data:image/png," + std::string("abc")).find("not base64"), std::string::npos);
}

TEST(ImageInput, NotBase64IsRefused) {
  EXPECT_NE(error_of("data:image/png;base64,iVBOR*w0KGgo=").find("not valid base64"), std::string::npos);
  EXPECT_NE(error_of("data:image/png;base64,iVBORw0KG").find("not valid base64"), std::string::npos);
  EXPECT_NE(error_of("data:image/png;base64,").find("no data"), std::string::npos);
}

TEST(ImageInput, TruncatedPngIsRefused) {
  std::vector<uint8_t> png = testing::seed_png();
  png.resize(png.size() - 30);
  EXPECT_NE(error_of(data_uri("image/png", png)).find("corrupt or truncated"), std::string::npos);
}

TEST(ImageInput, DecompressionBombIsRefusedFromItsHeader) {
  const std::string msg = error_of(data_uri("image/png", testing::bomb_png(20000, 20000)));
  EXPECT_NE(msg.find("20000x20000"), std::string::npos) << msg;
  EXPECT_NE(msg.find("--max-image-pixels"), std::string::npos) << msg;
}

TEST(ImageInput, EncodedSizeIsCappedBeforeDecoding) {
  ImageInputConfig small = config();
  small.limits.max_bytes = 100;
  EXPECT_NE(error_of(data_uri("image/png", testing::seed_png()), small).find("--max-image-bytes"),
            std::string::npos);
}

TEST(ImageInput, Base64Decoding) {
  auto r = decode_base64("aGVs\nbG8=", 100);
  ASSERT_TRUE(r.is_ok());
  EXPECT_EQ(std::string(r->begin(), r->end()), "hello");
  EXPECT_FALSE(decode_base64("aGVsbG8=x", 100).is_ok());  // data after the padding
  EXPECT_FALSE(decode_base64("aGVsbG8", 3).is_ok());      // over the limit
}

}  // namespace
}  // namespace moonrun::server
