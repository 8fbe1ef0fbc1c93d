#include "model/vision/placeholders.h"

namespace moonrun::vision {

int PromptImages::num_tokens() const {
  int n = 0;
  for (const ImagePatches& im : images) n += im.num_tokens;
  return n;
}

std::vector<const ImagePatches*> PromptImages::pointers() const {
  std::vector<const ImagePatches*> out;
  for (const ImagePatches& im : images) out.push_back(&im);
  return out;
}

Result<std::vector<int32_t>> expand_placeholders(std::span<const int32_t> ids, int32_t placeholder_id,
                                                 std::span<const int> tokens_per_image) {
  std::vector<int32_t> out;
  out.reserve(ids.size());
  size_t image = 0;
  for (int32_t id : ids) {
    if (id != placeholder_id) {
      out.push_back(id);
      continue;
    }
    if (image >= tokens_per_image.size())
      return invalid_argument("images: the prompt holds more media placeholders (token " +
                              std::to_string(placeholder_id) + ") than the " + std::to_string(tokens_per_image.size()) +
                              " images given");
    out.insert(out.end(), static_cast<size_t>(tokens_per_image[image++]), placeholder_id);
  }
  if (image != tokens_per_image.size())
    return invalid_argument("images: " + std::to_string(tokens_per_image.size()) + " images given but the prompt holds " +
                            std::to_string(image) + " media placeholders (token " + std::to_string(placeholder_id) +
                            "), one per image");
  return out;
}

std::vector<int32_t> placeholder_positions(std::span<const int32_t> ids, int32_t placeholder_id) {
  std::vector<int32_t> out;
  for (size_t i = 0; i < ids.size(); ++i)
    if (ids[i] == placeholder_id) out.push_back(static_cast<int32_t>(i));
  return out;
}

std::string image_prompt(int width, int height) {
  return "<|media_begin|>image " + std::to_string(width) + "x" + std::to_string(height) +
         "<|media_content|><|media_pad|><|media_end|>";
}

}  // namespace moonrun::vision
