// The safetensors reader and writer against the published format: files assembled byte by
// byte, the reference implementation's own test vectors, and every malformed input.
#include <gtest/gtest.h>

#include <cstring>

#include "model/checkpoint.h"
#include "test_files.h"

namespace moonrun {
namespace {

using testing_files::le_f32;
using testing_files::le_u64;
using testing_files::read_bytes;
using testing_files::safetensors_bytes;
using testing_files::TempDir;
using testing_files::write_bytes;

// The error is one line and names the file.
void expect_one_line_naming(const Status& st, const std::string& file, const std::string& needle) {
  ASSERT_FALSE(st.is_ok());
  EXPECT_EQ(st.message().find('\n'), std::string::npos) << st.message();
  EXPECT_NE(st.message().find(file), std::string::npos) << st.message();
  EXPECT_NE(st.message().find(needle), std::string::npos) << st.message();
}

Status open_status(const std::string& path) { return SafetensorsFile::open(path).status(); }

TEST(Safetensors, ReadsHandAssembledFile) {
  TempDir tmp;
  // Two tensors: "w" F32 [2] = {1.5, -2}, then "b" BF16 [1, 2] = {1.0, 0.5} (0x3f80, 0x3f00).
  const std::string header =
      R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
      R"("b":{"dtype":"BF16","shape":[1,2],"data_offsets":[8,12]}})";
  const std::string data = le_f32(1.5f) + le_f32(-2.0f) + std::string("\x80\x3f\x00\x3f", 4);
  const std::string path = tmp / "a.safetensors";
  write_bytes(path, safetensors_bytes(header, data));

  auto f = SafetensorsFile::open(path);
  ASSERT_TRUE(f.is_ok()) << f.status().message();
  ASSERT_EQ((*f)->tensors().size(), 2u);
  EXPECT_EQ((*f)->file_size_bytes(), 8 + header.size() + 12);
  EXPECT_TRUE((*f)->metadata().is_null());

  const TensorInfo* w = (*f)->find("w");
  ASSERT_NE(w, nullptr);
  EXPECT_EQ(w->dtype, DType::F32);
  EXPECT_EQ(w->shape, (std::vector<int64_t>{2}));
  EXPECT_EQ(w->nbytes, 8u);
  EXPECT_EQ(w->offset_bytes, 8 + header.size());
  EXPECT_EQ(w->file, path);
  float vals[2];
  std::memcpy(vals, w->data, 8);
  EXPECT_EQ(vals[0], 1.5f);
  EXPECT_EQ(vals[1], -2.0f);

  const TensorInfo* b = (*f)->find("b");
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(b->dtype, DType::BF16);
  EXPECT_EQ(b->numel(), 2);
  EXPECT_EQ(b->offset_bytes, 8 + header.size() + 8);
  uint16_t bf[2];
  std::memcpy(bf, b->data, 4);
  EXPECT_EQ(bf[0], 0x3f80);  // 1.0 in bfloat16
  EXPECT_EQ(bf[1], 0x3f00);  // 0.5
  EXPECT_EQ((*f)->find("missing"), nullptr);
}

// The reference's load test vector (bindings/python/tests/test_simple.py): a 102-byte header
// with metadata and 7 bytes of space padding, then 16 zero bytes of I32 [2, 2].
TEST(Safetensors, ReadsReferenceVectorWithMetadata) {
  TempDir tmp;
  const std::string bytes =
      std::string("f\0\0\0\0\0\0\0", 8) +
      R"({"__metadata__":{"framework":"pt"},"test1":{"dtype":"I32","shape":[2,2],"data_offsets":[0,16]}}       )" +
      std::string(16, '\0');
  const std::string path = tmp / "ref.safetensors";
  write_bytes(path, bytes);
  auto f = SafetensorsFile::open(path);
  ASSERT_TRUE(f.is_ok()) << f.status().message();
  EXPECT_EQ((*f)->metadata()["framework"], "pt");
  const TensorInfo* t = (*f)->find("test1");
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->dtype, DType::I32);
  EXPECT_EQ(t->shape, (std::vector<int64_t>{2, 2}));
  EXPECT_EQ(t->offset_bytes, 8u + 102u);
}

// The reference's serialization test vector: np.zeros((2, 2), int32) saved as "test" is
// '@' 0 0 0 0 0 0 0, the 60-byte JSON, 4 spaces of padding to 64, then 16 zero bytes.
TEST(Safetensors, WriterMatchesReferenceSerializationBytes) {
  TempDir tmp;
  const std::string path = tmp / "w.safetensors";
  ASSERT_TRUE(write_safetensors(path, {{"test", DType::I32, {2, 2}, std::vector<uint8_t>(16, 0)}}).is_ok());
  const std::string expected =
      std::string("@\0\0\0\0\0\0\0", 8) +
      R"({"test":{"dtype":"I32","shape":[2,2],"data_offsets":[0,16]}}    )" + std::string(16, '\0');
  EXPECT_EQ(read_bytes(path), expected);
}

TEST(Safetensors, EveryDtypeSizeAndName) {
  struct Case { const char* name; DType dtype; size_t size; };
  const Case cases[] = {{"BF16", DType::BF16, 2}, {"F16", DType::F16, 2}, {"F32", DType::F32, 4},
                        {"F8_E4M3", DType::F8_E4M3, 1}, {"U8", DType::U8, 1}, {"I8", DType::I8, 1},
                        {"I32", DType::I32, 4}, {"I64", DType::I64, 8}};
  TempDir tmp;
  std::string header = "{";
  uint64_t offset = 0;
  for (const auto& c : cases) {
    EXPECT_EQ(dtype_size_bytes(c.dtype), c.size);
    EXPECT_STREQ(dtype_name(c.dtype), c.name);
    auto parsed = dtype_from_name(c.name);
    ASSERT_TRUE(parsed.is_ok());
    EXPECT_EQ(*parsed, c.dtype);
    // Each tensor [3]: 3 x size bytes.
    if (offset) header += ",";
    header += std::string("\"t_") + c.name + R"(":{"dtype":")" + c.name + R"(","shape":[3],"data_offsets":[)" +
              std::to_string(offset) + "," + std::to_string(offset + 3 * c.size) + "]}";
    offset += 3 * c.size;
  }
  header += "}";
  const std::string path = tmp / "all.safetensors";
  write_bytes(path, safetensors_bytes(header, std::string(offset, '\x5a')));
  auto f = SafetensorsFile::open(path);
  ASSERT_TRUE(f.is_ok()) << f.status().message();
  for (const auto& c : cases) {
    const TensorInfo* t = (*f)->find(std::string("t_") + c.name);
    ASSERT_NE(t, nullptr) << c.name;
    EXPECT_EQ(t->dtype, c.dtype);
    EXPECT_EQ(t->nbytes, 3 * c.size);
  }
  EXPECT_FALSE(dtype_from_name("F64").is_ok());
  EXPECT_FALSE(dtype_from_name("bf16").is_ok());
}

TEST(Safetensors, ScalarsAndEmptyTensors) {
  TempDir tmp;
  // shape [] is a scalar (1 element); shape [0, 4] has no bytes and may sit anywhere.
  const std::string header =
      R"({"s":{"dtype":"F32","shape":[],"data_offsets":[0,4]},)"
      R"("e":{"dtype":"BF16","shape":[0,4],"data_offsets":[4,4]}})";
  const std::string path = tmp / "s.safetensors";
  write_bytes(path, safetensors_bytes(header, le_f32(3.0f)));
  auto f = SafetensorsFile::open(path);
  ASSERT_TRUE(f.is_ok()) << f.status().message();
  EXPECT_EQ((*f)->find("s")->numel(), 1);
  EXPECT_EQ((*f)->find("e")->numel(), 0);
  EXPECT_EQ((*f)->find("e")->nbytes, 0u);
}

TEST(Safetensors, WriterRoundTripWithMetadataAndAlignment) {
  TempDir tmp;
  const std::string path = tmp / "rt.safetensors";
  std::vector<TensorToWrite> tensors = {
      {"model.embed_tokens.weight", DType::BF16, {3, 2}, {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}},
      {"a.scale", DType::F8_E4M3, {5}, {0x38, 0x40, 0x00, 0x80, 0x7e}},
      {"ids", DType::I64, {1}, {1, 0, 0, 0, 0, 0, 0, 0}},
  };
  ASSERT_TRUE(write_safetensors(path, tensors, {{"format", "pt"}}).is_ok());

  // The layout, read without our parser: length field, 8-aligned header, data in order.
  const std::string bytes = read_bytes(path);
  ASSERT_GE(bytes.size(), 8u);
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<uint8_t>(bytes[i]);
  EXPECT_EQ(n % 8, 0u);
  EXPECT_EQ(bytes.size(), 8 + n + 12 + 5 + 8);
  auto j = nlohmann::json::parse(bytes.substr(8, n));
  EXPECT_EQ(j["__metadata__"]["format"], "pt");
  EXPECT_EQ(j["a.scale"]["data_offsets"], nlohmann::json({12, 17}));
  EXPECT_EQ(bytes.substr(8 + n + 12, 5), std::string("\x38\x40\x00\x80\x7e", 5));

  auto f = SafetensorsFile::open(path);
  ASSERT_TRUE(f.is_ok()) << f.status().message();
  ASSERT_EQ((*f)->tensors().size(), 3u);
  for (const auto& want : tensors) {
    const TensorInfo* t = (*f)->find(want.name);
    ASSERT_NE(t, nullptr) << want.name;
    EXPECT_EQ(t->dtype, want.dtype);
    EXPECT_EQ(t->shape, want.shape);
    EXPECT_EQ(std::vector<uint8_t>(t->data, t->data + t->nbytes), want.bytes);
  }
  // read_safetensors_header (pread, no mmap) agrees with the mmap'd parse.
  auto h = read_safetensors_header(path);
  ASSERT_TRUE(h.is_ok()) << h.status().message();
  EXPECT_EQ(h->header_len_bytes, n);
  ASSERT_EQ(h->tensors.size(), 3u);
  EXPECT_EQ(h->tensors[1].name, "a.scale");
  EXPECT_EQ(h->tensors[1].offset_bytes, 8 + n + 12);
}

TEST(Safetensors, WriterRejectsWrongByteCount) {
  TempDir tmp;
  Status st = write_safetensors(tmp / "x.safetensors", {{"w", DType::F32, {2, 2}, std::vector<uint8_t>(15)}});
  expect_one_line_naming(st, "x.safetensors", "needs 16 bytes, got 15");
}

// ---- malformed files: each one line, naming the file and the problem -------------------

struct BadCase {
  const char* what;
  std::string bytes;
  const char* needle;
};

std::vector<BadCase> bad_cases() {
  const std::string ok_entry = R"("w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]})";
  const std::string data8(8, '\0');
  return {
      {"empty file", "", "truncated"},
      {"shorter than the length field", std::string("\x10\0\0", 3), "truncated"},
      {"header length past end of file", le_u64(1000) + "{}", "past the end of the file"},
      {"huge header length", le_u64(0xffffffffffffff00ull) + "{}", "past the end of the file"},
      {"bad JSON", safetensors_bytes(R"({"w":{"dtype":"F32",)", data8), "not valid JSON"},
      {"header not an object", safetensors_bytes("[1,2]", ""), "not an object"},
      {"unknown dtype", safetensors_bytes(R"({"w":{"dtype":"F64","shape":[1],"data_offsets":[0,8]}})", data8),
       "unknown dtype \"F64\""},
      {"missing dtype", safetensors_bytes(R"({"w":{"shape":[2],"data_offsets":[0,8]}})", data8), "dtype"},
      {"negative dim", safetensors_bytes(R"({"w":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", data8),
       "non-negative"},
      {"fractional dim", safetensors_bytes(R"({"w":{"dtype":"F32","shape":[2.5],"data_offsets":[0,8]}})", data8),
       "non-negative integers"},
      {"offsets past the data (truncated data)",
       safetensors_bytes("{" + ok_entry + "}", std::string(5, '\0')), "past the end of the data"},
      {"offsets inconsistent with dtype x shape",
       safetensors_bytes(R"({"w":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", data8),
       "span 8 bytes but F32 [3] needs 12"},
      {"offsets reversed", safetensors_bytes(R"({"w":{"dtype":"U8","shape":[0],"data_offsets":[8,0]}})", data8),
       "end before they begin"},
      {"offsets malformed", safetensors_bytes(R"({"w":{"dtype":"U8","shape":[8],"data_offsets":[0]}})", data8),
       "data_offsets"},
      {"overlapping tensors",
       safetensors_bytes(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                         R"("b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", data8),
       "overlap"},
      {"hole in the data",
       safetensors_bytes(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", data8), "belong to no tensor"},
      {"trailing data", safetensors_bytes("{" + ok_entry + "}", std::string(12, '\0')), "trailing"},
      {"overflowing shape",
       safetensors_bytes(R"({"w":{"dtype":"I64","shape":[4294967296,4294967296],"data_offsets":[0,8]}})", data8),
       "overflows"},
      {"metadata not strings",
       safetensors_bytes(R"({"__metadata__":{"n":1},)" + ok_entry + "}", data8), "__metadata__"},
  };
}

TEST(Safetensors, MalformedFilesGiveOneLineErrors) {
  TempDir tmp;
  int i = 0;
  for (const auto& c : bad_cases()) {
    SCOPED_TRACE(c.what);
    const std::string path = tmp / ("bad" + std::to_string(i++) + ".safetensors");
    write_bytes(path, c.bytes);
    expect_one_line_naming(open_status(path), path, c.needle);
    // The pread path reports the same problem.
    expect_one_line_naming(read_safetensors_header(path).status(), path, c.needle);
    // And the in-memory parser too, with the whole file given.
    auto h = parse_safetensors_header(reinterpret_cast<const uint8_t*>(c.bytes.data()), c.bytes.size(),
                                      c.bytes.size(), path);
    expect_one_line_naming(h.status(), path, c.needle);
  }
}

TEST(Safetensors, MissingFileAndDirectory) {
  TempDir tmp;
  expect_one_line_naming(open_status(tmp / "nope.safetensors"), "nope.safetensors", "cannot open");
  expect_one_line_naming(open_status(tmp.path()), tmp.path(), "not a regular file");
}

TEST(Safetensors, ParserNeedsTheWholeHeader) {
  // Given only a prefix of the file, the parser says so instead of reading past it.
  const std::string bytes = safetensors_bytes(R"({"w":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}})", "x");
  auto h = parse_safetensors_header(reinterpret_cast<const uint8_t*>(bytes.data()), 20, bytes.size(), "f");
  ASSERT_FALSE(h.is_ok());
  EXPECT_NE(h.status().message().find("only 20 were read"), std::string::npos) << h.status().message();
}

}  // namespace
}  // namespace moonrun
