// The vision fixtures (tests/fixtures/k3-vision-tiny, made by the K3 reference, and
// k25-vision-tiny, made by transformers' kimi_k25: see tests/fixtures/README.md) through
// the CPU backend, stage by stage, each against the reference's numbers:
//   1. preprocessing: the PNG files through decode + processor = the reference
//      processor's pixel values (same grid, values to float rounding);
//   2. the tower and projector: the rows that replace the placeholders;
//   3. the whole model: greedy ids and logits after prompts holding one placeholder per
//      image, expanded and filled in as the reference's merge does; and the same through
//      `moonrun generate --image`;
//   4. every tower of tests/fixtures/k3-vision-variants (other widths, heads, head sizes,
//      qkv widths, layers, MLPs, position tables and their resize modes, patch sizes and
//      merge kernels), on the same text model: preprocessing, image rows, greedy ids and
//      logits, each a test of its own.
#include <cctype>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <memory>
#include <string>
#include <unistd.h>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "../support/command.h"
#include "../support/fixture_files.h"
#include "../support/runtimes.h"
#include "../support/vision_cases.h"
#include "../support/vision_variants.h"
#include "model/vision/image_decode.h"
#include "model/vision/placeholders.h"
#include "model/vision/preprocess.h"
#include "cache/cache_manager.h"
#include "engine/engine.h"
#include "runtime/generate.h"

namespace moonrun {
namespace {

namespace fs = std::filesystem;
using fixtures::fixtures_dir;
using fixtures::read_f32;

class VisionFixture : public ::testing::TestWithParam<std::string> {
 protected:
  std::string vision_dir() const { return fixtures_dir() + "/" + GetParam(); }

  void SetUp() override {
    std::ifstream in(vision_dir() + "/vision_expected.json");
    if (!in) GTEST_SKIP() << vision_dir() << "/vision_expected.json is missing (see its README)";
    expected_ = nlohmann::json::parse(in);
    std::ifstream cin(vision_dir() + "/config.json");
    config_ = nlohmann::json::parse(cin);
    auto cfg = parse_model_config(config_, "config.json");
    ASSERT_TRUE(cfg.is_ok()) << cfg.status().to_string();
    ASSERT_TRUE(cfg->vision.enabled);
    vision_ = cfg->vision;
    auto proc = vision::load_image_processor_config(vision_dir(), vision_);
    ASSERT_TRUE(proc.is_ok()) << proc.status().to_string();
    processor_ = *proc;
  }

  vision::ImagePatches load(const std::string& file) {
    auto p = testing::load_fixture_image(vision_dir() + "/" + file, processor_);
    EXPECT_TRUE(p.is_ok()) << file << ": " << p.status().to_string();
    return p.is_ok() ? std::move(p).value() : vision::ImagePatches{};
  }
  // Image k of case c as the tower's input: the reference processor's own pixel values and
  // grid where the fixture records them (k25-vision-tiny: transformers' kimi_k25 processor
  // resizes some images where the release's NaViT rule, which moonrun and vLLM follow, only
  // pads: see PreprocessingMatchesTheReferenceProcessor), else moonrun's preprocessing.
  vision::ImagePatches input(const nlohmann::json& c, size_t k) {
    const std::string file = c.at("images")[k].get<std::string>();
    vision::ImagePatches p = load(file);
    if (!c.contains("grid_thws")) return p;
    const auto grid = c.at("grid_thws")[k].get<std::vector<int>>();
    if (p.grid_h == grid[1] && p.grid_w == grid[2]) return p;
    const std::string pv_file = vision_dir() + "/" + file.substr(0, file.size() - 4) + ".pixel_values.f32";
    p.grid_h = grid[1];
    p.grid_w = grid[2];
    p.num_tokens = c.at("image_tokens")[k].get<int>();
    p.values = read_f32(pv_file, fs::file_size(pv_file) / sizeof(float));
    p.content_hash ^= 0x9e3779b97f4a7c15ull * static_cast<uint64_t>(p.values.size());
    return p;
  }
  // Whether moonrun's own preprocessing of case c's images gives the reference's grids.
  bool preprocessed_as_the_reference(const nlohmann::json& c) {
    if (!c.contains("grid_thws")) return true;
    for (size_t k = 0; k < c.at("images").size(); ++k) {
      const vision::ImagePatches p = load(c.at("images")[k].get<std::string>());
      const auto grid = c.at("grid_thws")[k].get<std::vector<int>>();
      if (p.grid_h != grid[1] || p.grid_w != grid[2]) return false;
    }
    return true;
  }

  nlohmann::json expected_, config_;
  VisionConfig vision_;
  vision::ImageProcessorConfig processor_;
};

TEST_P(VisionFixture, PreprocessingMatchesTheReferenceProcessor) {
  for (const auto& c : expected_.at("cases")) {
    for (size_t k = 0; k < c.at("images").size(); ++k) {
      const std::string file = c.at("images")[k].get<std::string>();
      const vision::ImagePatches p = load(file);
      if (c.contains("grid_thws")) {
        // transformers' kimi_k25 image processor scales some images up (its own resize);
        // the release's processor (NaViT: scale <= 1, then pad to the merge grid), which
        // moonrun follows as vLLM's K2.5 processing does, does not. Such an image is
        // checked to be one the reference enlarged; the others must match exactly.
        const auto grid = c.at("grid_thws")[k].get<std::vector<int>>();
        if (p.grid_h != grid[1] || p.grid_w != grid[2]) {
          std::printf("%s: moonrun %d x %d patches (the release's NaViT rule), transformers' processor %d x %d\n",
                      file.c_str(), p.grid_h, p.grid_w, grid[1], grid[2]);
          EXPECT_GE(grid[1] * grid[2], p.grid_h * p.grid_w) << file << ": only an enlargement is expected";
          continue;
        }
      }
      EXPECT_EQ(p.num_tokens, c.at("image_tokens")[k].get<int>()) << file;
      const std::string pv_file = file.substr(0, file.size() - 4) + ".pixel_values.f32";
      const size_t n = fs::file_size(vision_dir() + "/" + pv_file) / sizeof(float);
      ASSERT_EQ(p.values.size(), n) << file;
      const std::vector<float> want = read_f32(vision_dir() + "/" + pv_file, n);
      float worst = 0;
      for (size_t i = 0; i < n; ++i) worst = std::max(worst, std::fabs(p.values[i] - want[i]));
      std::printf("%s: %d x %d patches, max |dpixel| = %.3g\n", file.c_str(), p.grid_h, p.grid_w, worst);
      // Values are (u8 / 255 - mean) / std in float: equal inputs give equal values.
      EXPECT_LE(worst, 1e-6f) << file;
    }
  }
}

TEST_P(VisionFixture, TowerRowsAndLogitsMatchTheReference) {
  Runtime rt = testing::make_runtime(vision_dir(), testing::test_runtime_options("cpu", 512));
  ASSERT_TRUE(rt.runner);
  const int V = rt.config.vocab_size, H = rt.config.hidden_size;
  const float tol = expected_.at("tolerance_abs_logit").get<float>();
  const float tol_rows = expected_.at("tolerance_abs_image_row").get<float>();
  int index = 0;
  for (const auto& c : expected_.at("cases")) {
    SCOPED_TRACE("case " + std::to_string(index++));
    std::vector<vision::ImagePatches> images;
    std::vector<int> rows_per_image;
    for (size_t k = 0; k < c.at("images").size(); ++k) {
      images.push_back(input(c, k));
      rows_per_image.push_back(images.back().num_tokens);
    }
    std::vector<const vision::ImagePatches*> pointers;
    for (const auto& im : images) pointers.push_back(&im);
    auto rows = rt.runner->encode_images(pointers);
    ASSERT_TRUE(rows.is_ok()) << rows.status().to_string();
    const auto rows_shape = c.at("image_rows_shape").get<std::vector<size_t>>();
    ASSERT_EQ(rows->size(), rows_shape[0] * rows_shape[1]);
    ASSERT_EQ(rows_shape[1], static_cast<size_t>(H));
    const auto want_rows = read_f32(vision_dir() + "/" + c.at("image_rows_file").get<std::string>(), rows->size());
    float worst_row = 0;
    for (size_t i = 0; i < want_rows.size(); ++i) worst_row = std::max(worst_row, std::fabs((*rows)[i] - want_rows[i]));
    std::printf("image rows: %zu x %d, max |drow| = %.3g\n", rows_shape[0], H, worst_row);
    EXPECT_LE(worst_row, tol_rows);

    const int32_t placeholder = config_.at("media_placeholder_token_id").get<int32_t>();
    auto run = testing::run_vision_case(*rt.runner, rt.cache.page_size_tokens, c, placeholder, rows_per_image, *rows);
    ASSERT_TRUE(run.is_ok()) << run.status().to_string();
    const GenerateResult* got = &run->result;
    EXPECT_EQ(got->token_ids, c.at("greedy_ids").get<std::vector<int32_t>>());
    const auto want = read_f32(vision_dir() + "/" + c.at("logits_file").get<std::string>(), got->logits.size());
    float worst = 0;
    for (size_t i = 0; i < want.size(); ++i) worst = std::max(worst, std::fabs(got->logits[i] - want[i]));
    std::printf("prompt %zu positions (%zu images): max |dlogit| = %.3g\n", run->prompt_positions, images.size(), worst);
    EXPECT_LE(worst, tol);
    EXPECT_EQ(got->logits.size(), static_cast<size_t>(c.at("max_tokens").get<int>()) * V);
  }
}

// Both cases at once through the engine with 16-token prefill chunks: the image rows cross
// chunk boundaries and share steps with the other request's decode, and the greedy ids
// are still the reference's (its margins, >= 0.04, dwarf the chunking's float noise).
TEST_P(VisionFixture, EngineWithChunkedPrefillGivesTheReferenceTokens) {
  RuntimeOptions ro = testing::test_runtime_options("cpu", 512, 2);
  ro.max_tokens_per_step = 128;  // the runner's bound (the tower takes 4 patches per token: 512 >= 452)
  ro.page_size_tokens = 16;
  Runtime rt = testing::make_runtime(vision_dir(), ro);
  ASSERT_TRUE(rt.runner);
  CacheManager cache(rt.cache);
  Engine engine(EngineConfig{{.max_running_requests = 2, .max_tokens_per_step = 16}, 256, {}, 0}, cache, *rt.runner,
                nullptr);
  const int32_t placeholder = config_.at("media_placeholder_token_id").get<int32_t>();
  uint64_t id = 0;
  for (const auto& c : expected_.at("cases")) {
    auto images = std::make_shared<vision::PromptImages>();
    images->placeholder_id = placeholder;
    std::vector<int> rows;
    for (size_t k = 0; k < c.at("images").size(); ++k) {
      images->images.push_back(input(c, k));
      rows.push_back(images->images.back().num_tokens);
    }
    auto prompt = vision::expand_placeholders(c.at("prompt_ids").get<std::vector<int32_t>>(), placeholder, rows);
    ASSERT_TRUE(prompt.is_ok());
    SamplingParams p;
    p.temperature = 0.0f;
    p.max_tokens = c.at("max_tokens").get<int>();
    p.ignore_eos = true;
    const Status st = engine.add_request(id++, *prompt, p, images);
    ASSERT_TRUE(st.is_ok()) << st.to_string();
  }
  std::map<uint64_t, std::vector<int32_t>> got;
  std::vector<RequestOutput> outs;
  int steps = 0;
  for (; engine.has_work() && steps < 1000; ++steps) ASSERT_TRUE(engine.step(outs).is_ok());
  for (const auto& o : outs) got[o.request_id].insert(got[o.request_id].end(), o.new_token_ids.begin(), o.new_token_ids.end());
  EXPECT_GT(steps, 7);  // 104 prompt positions in 16-token steps
  for (uint64_t i = 0; i < id; ++i)
    EXPECT_EQ(got[i], expected_.at("cases")[i].at("greedy_ids").get<std::vector<int32_t>>()) << "case " << i;
}

// The command line: --image files and one placeholder per image in --token-ids.
TEST_P(VisionFixture, GenerateCliTakesImages) {
  // The last case whose images moonrun's own preprocessing gives the reference's grids.
  const nlohmann::json* pick = nullptr;
  for (const auto& c : expected_.at("cases"))
    if (preprocessed_as_the_reference(c)) pick = &c;
  ASSERT_NE(pick, nullptr);
  const auto& c = *pick;
  std::string ids, images;
  for (int id : c.at("prompt_ids")) ids += (ids.empty() ? "" : ",") + std::to_string(id);
  for (const auto& f : c.at("images")) images += " --image " + vision_dir() + "/" + f.get<std::string>();
  const std::string out_file =
      (fs::temp_directory_path() / ("moonrun_vision_logits_" + std::to_string(getpid()))).string();
  const std::string cmd = std::string(MOONRUN_EXE) + " generate --device cpu --model " + vision_dir() +
                          " --token-ids " + ids + images + " --max-tokens " +
                          std::to_string(c.at("max_tokens").get<int>()) + " --logits-out " + out_file;
  const testing::CommandRun run = testing::run_command(cmd);
  ASSERT_EQ(run.exit_code, 0) << cmd;
  const auto j = nlohmann::json::parse(run.out);
  int image_rows = 0;
  for (int n : c.at("image_tokens")) image_rows += n;
  EXPECT_EQ(j.at("prompt_tokens").get<size_t>(), c.at("prompt_ids").size() - c.at("images").size() + image_rows);
  EXPECT_EQ(j.at("token_ids"), c.at("greedy_ids"));
  const auto shape = c.at("logits_shape").get<std::vector<size_t>>();
  const auto got = read_f32(out_file, shape[0] * shape[1]);
  const auto want = read_f32(vision_dir() + "/" + c.at("logits_file").get<std::string>(), shape[0] * shape[1]);
  for (size_t i = 0; i < want.size(); ++i) ASSERT_NEAR(got[i], want[i], 1e-3) << i;
  fs::remove(out_file);
}

std::string fixture_test_name(const ::testing::TestParamInfo<std::string>& info) {
  std::string n = info.param;
  for (char& ch : n)
    if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
  return n;
}

// K3's MoonViT-V2 and K2.5's MoonViT (LayerNorm, biases, the patchmerger projector) on a
// DeepSeek-V3 text model nested in text_config.
INSTANTIATE_TEST_SUITE_P(Fixtures, VisionFixture, ::testing::Values("k3-vision-tiny", "k25-vision-tiny"),
                         fixture_test_name);

// ---- the variants ----------------------------------------------------------------------

class VisionVariant : public ::testing::TestWithParam<std::string> {};

TEST_P(VisionVariant, RowsAndLogitsMatchTheReference) {
  const std::string name = GetParam();
  const std::string root = testing::vision_variants_dir();
  std::ifstream in(root + "/" + name + "/vision_expected.json");
  ASSERT_TRUE(in) << name;
  const nlohmann::json expected = nlohmann::json::parse(in);
  auto dir = testing::assemble_vision_variant(name);
  ASSERT_TRUE(dir.is_ok()) << dir.status().to_string();
  std::ifstream cin(*dir + "/config.json");
  const nlohmann::json config = nlohmann::json::parse(cin);
  auto cfg = parse_model_config(config, "config.json");
  ASSERT_TRUE(cfg.is_ok()) << cfg.status().to_string();
  ASSERT_TRUE(cfg->vision.enabled);
  auto proc = vision::load_image_processor_config(*dir, cfg->vision);
  ASSERT_TRUE(proc.is_ok()) << proc.status().to_string();
  Runtime rt = testing::make_runtime(*dir, testing::test_runtime_options("cpu", 512));
  ASSERT_TRUE(rt.runner);
  const int H = rt.config.hidden_size;
  const float tol = expected.at("tolerance_abs_logit").get<float>();
  const float tol_rows = expected.at("tolerance_abs_image_row").get<float>();
  const int32_t placeholder = config.at("media_placeholder_token_id").get<int32_t>();
  ASSERT_FALSE(expected.at("cases").empty());
  int index = 0;
  for (const auto& c : expected.at("cases")) {
    SCOPED_TRACE(name + " case " + std::to_string(index++));
    std::vector<vision::ImagePatches> images;
    std::vector<int> rows_per_image;
    for (size_t k = 0; k < c.at("images").size(); ++k) {
      const std::string file = c.at("images")[k].get<std::string>();
      auto p = testing::load_fixture_image(root + "/" + file, *proc);
      ASSERT_TRUE(p.is_ok()) << file << ": " << p.status().to_string();
      // The reference processor's grid and token count, and its pixel values' sums.
      const auto grid = c.at("grid_thws")[k];
      EXPECT_EQ(p->grid_h, grid[1].get<int>()) << file;
      EXPECT_EQ(p->grid_w, grid[2].get<int>()) << file;
      EXPECT_EQ(p->num_tokens, c.at("image_tokens")[k].get<int>()) << file;
      const std::string base = file.substr(file.rfind('/') + 1);
      const auto& info = expected.at("image_info").at(base);
      double sum = 0, abs_sum = 0;
      for (float v : p->values) sum += v, abs_sum += std::fabs(v);
      EXPECT_NEAR(sum, info.at("pixel_values_sum").get<double>(), 1e-6 * p->values.size()) << file;
      EXPECT_NEAR(abs_sum, info.at("pixel_values_abs_sum").get<double>(), 1e-6 * p->values.size()) << file;
      rows_per_image.push_back(p->num_tokens);
      images.push_back(std::move(p).value());
    }
    std::vector<const vision::ImagePatches*> pointers;
    for (const auto& im : images) pointers.push_back(&im);
    auto rows = rt.runner->encode_images(pointers);
    ASSERT_TRUE(rows.is_ok()) << rows.status().to_string();
    const auto rows_shape = c.at("image_rows_shape").get<std::vector<size_t>>();
    ASSERT_EQ(rows_shape[1], static_cast<size_t>(H));
    ASSERT_EQ(rows->size(), rows_shape[0] * rows_shape[1]);
    const auto want_rows =
        read_f32(root + "/" + name + "/" + c.at("image_rows_file").get<std::string>(), rows->size());
    float worst_row = 0;
    for (size_t i = 0; i < want_rows.size(); ++i) worst_row = std::max(worst_row, std::fabs((*rows)[i] - want_rows[i]));
    std::printf("%s: image rows %zu x %d, max |drow| = %.3g\n", name.c_str(), rows_shape[0], H, worst_row);
    EXPECT_LE(worst_row, tol_rows);

    auto run = testing::run_vision_case(*rt.runner, rt.cache.page_size_tokens, c, placeholder, rows_per_image, *rows);
    ASSERT_TRUE(run.is_ok()) << run.status().to_string();
    const GenerateResult* got = &run->result;
    EXPECT_EQ(got->token_ids, c.at("greedy_ids").get<std::vector<int32_t>>());
    const auto want = read_f32(root + "/" + name + "/" + c.at("logits_file").get<std::string>(), got->logits.size());
    float worst = 0;
    for (size_t i = 0; i < want.size(); ++i) worst = std::max(worst, std::fabs(got->logits[i] - want[i]));
    std::printf("%s: prompt %zu positions (%zu images): max |dlogit| = %.3g\n", name.c_str(), run->prompt_positions,
                images.size(), worst);
    EXPECT_LE(worst, tol);
  }
  std::filesystem::remove_all(*dir);
}

std::string variant_test_name(const ::testing::TestParamInfo<std::string>& info) {
  std::string n = info.param;
  for (char& ch : n)
    if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
  return n;
}

INSTANTIATE_TEST_SUITE_P(Towers, VisionVariant, ::testing::ValuesIn(testing::vision_variant_names()),
                         variant_test_name);
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(VisionVariant);

}  // namespace
}  // namespace moonrun
