#pragma once
// A case of the vision fixture (tests/fixtures/k3-vision-tiny) through a runner, as the
// reference's merge runs it: the prompt's one placeholder per image expanded to the image's
// rows, those positions taking the tower's rows instead of embeddings, greedy, with the
// logits kept. Shared by the CPU fixture test and the CUDA one.
#include <cstdint>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/status.h"
#include "model/vision/image_decode.h"
#include "model/vision/placeholders.h"
#include "model/vision/preprocess.h"
#include "runtime/generate.h"

namespace moonrun::testing {

// A fixture's image file as the server takes an image: decoded (stb_image), preprocessed.
inline Result<vision::ImagePatches> load_fixture_image(const std::string& path, const vision::ImageProcessorConfig& proc) {
  std::ifstream file(path, std::ios::binary);
  if (!file) return not_found(path + ": cannot open");
  const std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
  const vision::DecodedImage img = MR_TRY(vision::decode_image(bytes, int64_t{1} << 24));
  return vision::preprocess_image(img, proc);
}

struct VisionCaseRun {
  size_t prompt_positions = 0;  // after the expansion
  GenerateResult result;
};

inline Result<VisionCaseRun> run_vision_case(StepRunner& runner, int page_size_tokens, const nlohmann::json& c,
                                             int32_t placeholder, const std::vector<int>& rows_per_image,
                                             const std::vector<float>& image_rows) {
  const std::vector<int32_t> prompt = MR_TRY(
      vision::expand_placeholders(c.at("prompt_ids").get<std::vector<int32_t>>(), placeholder, rows_per_image));
  GenerateOptions opt;
  opt.max_tokens = c.at("max_tokens").get<int>();
  opt.keep_logits = true;
  opt.given_at = vision::placeholder_positions(prompt, placeholder);
  opt.given_rows = image_rows;
  VisionCaseRun run;
  run.prompt_positions = prompt.size();
  run.result = MR_TRY(generate(runner, page_size_tokens, prompt, opt));
  return run;
}

}  // namespace moonrun::testing
