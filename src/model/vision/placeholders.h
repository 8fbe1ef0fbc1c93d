#pragma once
// The prompt side of images. The chat format writes one <|media_pad|> per image
// (<|media_begin|>image WxH<|media_content|><|media_pad|><|media_end|>); the reference's
// _merge_input_ids_with_image_features then gives that one token as many rows as the
// image has merged tokens. moonrun does the expansion in the token ids instead: the run of
// placeholders holds a position (a KV row, a usage token) per image row, and the forward
// replaces each placeholder's embedding by the next image row. Same sequence of rows.
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "common/status.h"
#include "model/vision/preprocess.h"

namespace moonrun::vision {

// A prompt's images, preprocessed, in prompt order (shared by its n samples).
struct PromptImages {
  int32_t placeholder_id = -1;  // config.json's media_placeholder_token_id
  std::vector<ImagePatches> images;
  int num_tokens() const;       // rows over all images
  std::vector<const ImagePatches*> pointers() const;
};

// ids with its k-th placeholder replaced by tokens_per_image[k] placeholders. Errors: the
// counts disagree (more or fewer placeholders than images).
Result<std::vector<int32_t>> expand_placeholders(std::span<const int32_t> ids, int32_t placeholder_id,
                                                 std::span<const int> tokens_per_image);

// The positions of placeholder_id in ids, in order (where an expanded prompt takes rows).
std::vector<int32_t> placeholder_positions(std::span<const int32_t> ids, int32_t placeholder_id);

// What the chat format writes for an image of width x height (the reference's
// KimiK3VisionProcessor.make_image_prompt): special tokens allowed.
std::string image_prompt(int width, int height);

}  // namespace moonrun::vision
