// Checkpoint directories: config.json, single-file and sharded (through the index), and
// get() with dtype/shape checks. Shards are assembled byte by byte from the format.
#include <gtest/gtest.h>

#include <filesystem>

#include "model/checkpoint.h"
#include "test_files.h"

namespace moonrun {
namespace {

namespace fs = std::filesystem;
using testing_files::le_f32;
using testing_files::safetensors_bytes;
using testing_files::TempDir;
using testing_files::write_bytes;

void expect_one_line_containing(const Status& st, std::initializer_list<std::string> needles) {
  ASSERT_FALSE(st.is_ok());
  EXPECT_EQ(st.message().find('\n'), std::string::npos) << st.message();
  for (const auto& n : needles) EXPECT_NE(st.message().find(n), std::string::npos) << st.message();
}

// A two-shard checkpoint whose shard names deliberately do not follow the usual
// model-0000X-of-0000Y pattern: only the index says where tensors live.
void make_sharded(const TempDir& dir) {
  write_bytes(dir / "config.json", R"({"model_type":"kimi_linear","hidden_size":2})");
  write_bytes(dir / "first-part.safetensors",
              safetensors_bytes(R"({"embed":{"dtype":"F32","shape":[2,2],"data_offsets":[0,16]}})",
                                le_f32(1) + le_f32(2) + le_f32(3) + le_f32(4)));
  write_bytes(dir / "zz.safetensors",
              safetensors_bytes(R"({"norm":{"dtype":"BF16","shape":[2],"data_offsets":[0,4]},)"
                                R"("lm_head":{"dtype":"F32","shape":[1,2],"data_offsets":[4,12]}})",
                                std::string("\x80\x3f\x80\x3f", 4) + le_f32(5) + le_f32(6)));
  write_bytes(dir / "model.safetensors.index.json",
              R"({"metadata":{"total_size":32},"weight_map":{"embed":"first-part.safetensors",)"
              R"("norm":"zz.safetensors","lm_head":"zz.safetensors"}})");
}

TEST(Checkpoint, SingleFile) {
  TempDir dir;
  write_bytes(dir / "config.json", R"({"model_type":"kimi_k3"})");
  write_bytes(dir / "model.safetensors",
              safetensors_bytes(R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", le_f32(7)));
  auto ck = Checkpoint::open(dir.path());
  ASSERT_TRUE(ck.is_ok()) << ck.status().message();
  EXPECT_EQ((*ck)->dir(), dir.path());
  EXPECT_EQ((*ck)->config()["model_type"], "kimi_k3");
  EXPECT_EQ((*ck)->tensor_names(), std::vector<std::string>{"w"});
  EXPECT_EQ((*ck)->total_bytes(), fs::file_size(dir / "model.safetensors"));
  auto w = (*ck)->get("w", DType::F32, {1});
  ASSERT_TRUE(w.is_ok()) << w.status().message();
  float v;
  std::memcpy(&v, (*w)->data, 4);
  EXPECT_EQ(v, 7.0f);
}

TEST(Checkpoint, ShardedThroughTheIndex) {
  TempDir dir;
  make_sharded(dir);
  // A stray file next to the shards is not part of the checkpoint when an index exists.
  write_bytes(dir / "stray.safetensors", "garbage");
  auto ck = Checkpoint::open(dir.path() + "/");  // trailing slash tolerated
  ASSERT_TRUE(ck.is_ok()) << ck.status().message();
  EXPECT_EQ((*ck)->tensor_names(), (std::vector<std::string>{"embed", "lm_head", "norm"}));
  EXPECT_EQ((*ck)->files().size(), 2u);
  EXPECT_EQ((*ck)->total_bytes(),
            fs::file_size(dir / "first-part.safetensors") + fs::file_size(dir / "zz.safetensors"));
  const TensorInfo* lm = (*ck)->find("lm_head");
  ASSERT_NE(lm, nullptr);
  EXPECT_EQ(lm->file, dir / "zz.safetensors");
  float v[2];
  std::memcpy(v, lm->data, 8);
  EXPECT_EQ(v[0], 5.0f);
  EXPECT_EQ(v[1], 6.0f);
  EXPECT_EQ((*ck)->find("nope"), nullptr);
}

TEST(Checkpoint, GetChecksDtypeAndShapeInOneLine) {
  TempDir dir;
  make_sharded(dir);
  auto ck = Checkpoint::open(dir.path());
  ASSERT_TRUE(ck.is_ok()) << ck.status().message();
  auto bad = (*ck)->get("lm_head", DType::BF16, {1, 4});
  ASSERT_FALSE(bad.is_ok());
  EXPECT_EQ(bad.status().message(),
            dir / "zz.safetensors" +
                ": tensor lm_head has dtype F32 and shape [1, 2], expected BF16 [1, 4] (from config.json)");
  auto missing = (*ck)->get("model.layers.0.mlp.gate.weight", DType::F32, {2});
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  expect_one_line_containing(missing.status(), {dir.path(), "model.layers.0.mlp.gate.weight", "not found"});
}

TEST(Checkpoint, MissingShardNamesIndexAndShard) {
  TempDir dir;
  make_sharded(dir);
  fs::remove(dir / "zz.safetensors");
  expect_one_line_containing(Checkpoint::open(dir.path()).status(),
                             {"model.safetensors.index.json", "zz.safetensors", "missing"});
}

TEST(Checkpoint, TensorListedButAbsentFromItsShard) {
  TempDir dir;
  make_sharded(dir);
  write_bytes(dir / "model.safetensors.index.json",
              R"({"weight_map":{"embed":"first-part.safetensors","norm":"zz.safetensors",)"
              R"("lm_head":"zz.safetensors","extra":"first-part.safetensors"}})");
  expect_one_line_containing(Checkpoint::open(dir.path()).status(),
                             {"model.safetensors.index.json", "\"extra\"", "first-part.safetensors",
                              "does not contain it"});
}

TEST(Checkpoint, TruncatedShard) {
  TempDir dir;
  make_sharded(dir);
  fs::resize_file(dir / "zz.safetensors", fs::file_size(dir / "zz.safetensors") - 3);
  expect_one_line_containing(Checkpoint::open(dir.path()).status(), {"zz.safetensors", "past the end"});
}

TEST(Checkpoint, BrokenIndex) {
  TempDir dir;
  make_sharded(dir);
  write_bytes(dir / "model.safetensors.index.json", R"({"weight_map": )");
  expect_one_line_containing(Checkpoint::open(dir.path()).status(),
                             {"model.safetensors.index.json", "not valid JSON"});
  write_bytes(dir / "model.safetensors.index.json", R"({"metadata":{}})");
  expect_one_line_containing(Checkpoint::open(dir.path()).status(), {"weight_map"});
  write_bytes(dir / "model.safetensors.index.json", R"({"weight_map":{"embed":"../x.safetensors"}})");
  expect_one_line_containing(Checkpoint::open(dir.path()).status(), {"not a file in"});
}

TEST(Checkpoint, ConfigMissingOrBroken) {
  TempDir dir;
  make_sharded(dir);
  fs::remove(dir / "config.json");
  expect_one_line_containing(Checkpoint::open(dir.path()).status(), {dir / "config.json", "missing"});
  write_bytes(dir / "config.json", R"({"model_type": "kimi_k3",)");
  expect_one_line_containing(Checkpoint::open(dir.path()).status(), {dir / "config.json", "not valid JSON"});
  write_bytes(dir / "config.json", "[]");
  expect_one_line_containing(Checkpoint::open(dir.path()).status(), {dir / "config.json", "not a JSON object"});
}

TEST(Checkpoint, NoWeightsAndDuplicateTensors) {
  TempDir dir;
  write_bytes(dir / "config.json", "{}");
  expect_one_line_containing(Checkpoint::open(dir.path()).status(), {dir.path(), "no model.safetensors.index.json"});
  const std::string one = safetensors_bytes(R"({"w":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}})", "a");
  write_bytes(dir / "a.safetensors", one);
  write_bytes(dir / "b.safetensors", one);
  expect_one_line_containing(Checkpoint::open(dir.path()).status(), {"\"w\"", "a.safetensors", "b.safetensors"});
}

TEST(Checkpoint, ModelPathErrors) {
  TempDir dir;
  expect_one_line_containing(Checkpoint::open(dir / "nope").status(), {dir / "nope", "no such directory"});
  write_bytes(dir / "file", "x");
  expect_one_line_containing(Checkpoint::open(dir / "file").status(), {dir / "file", "not a directory"});
}

}  // namespace
}  // namespace moonrun
