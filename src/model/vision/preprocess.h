#pragma once
// The K3 image processor (the reference's KimiK3VisionProcessor with media_utils.py):
// decoded pixels -> the patches the vision tower reads, and how many prompt rows they cost.
//
//   1. plan (navit_resize_image): scale down so the image holds at most in_patch_limit
//      patches and at most patch_limit_on_one_side patches per side; then pad right and
//      bottom with zeros to a multiple of patch x merge (28 px): a 128 x 128 image is padded,
//      not resized, to 140 x 140 = 10 x 10 patches = 25 tokens after 2 x 2 merging;
//   2. resize with PIL's BICUBIC filter in PIL's 8-bit fixed point (exactly; RGBA through
//      premultiplied alpha as PIL does; palette images with NEAREST, as PIL forces);
//   3. composite transparency over the configured background (before or after step 2);
//   4. normalise (x / 255 - mean) / std in PIL/numpy's float order, and cut into patches in
//      raster order, each patch's values as (channel, y, x): a Conv2d's input order.
#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"
#include "model/vision/image_decode.h"
#include "model/vision/vision_config.h"

namespace moonrun::vision {

// The reference's TransparentBgConfig and its fill stage.
struct TransparentBackground {
  enum class Pattern { kNone, kWhite, kBlack, kGray, kChessboard };  // kNone: alpha is dropped
  Pattern pattern = Pattern::kChessboard;
  int square_size = 8;
  bool white_on_top_left = true;  // chessboard_square_on_top_left
  int white_value = 255;
  int gray_value = 180;
  bool after_resize = true;       // transparent_bg_fill_stage "after_resize"
};

// media_proc_cfg of the checkpoint's preprocessor_config.json.
struct ImageProcessorConfig {
  int patch_size = 14;
  int merge_kernel_size = 2;
  int64_t in_patch_limit = 65536;
  int patch_limit_on_one_side = 512;
  double image_mean[3] = {0.5, 0.5, 0.5};
  double image_std[3] = {0.5, 0.5, 0.5};
  TransparentBackground background;
};

// DIR/preprocessor_config.json's media_proc_cfg (the reference reads it there); without the
// file, the K3 release's values as deployed (in_patch_limit 65536, 512 patches a side, mean
// and std 0.5, chessboard 8 px of 255/180 after the resize). Checked against the tower's
// patch and merge sizes.
Result<ImageProcessorConfig> load_image_processor_config(const std::string& model_dir, const VisionConfig& vision);
Result<ImageProcessorConfig> parse_image_processor_config(const nlohmann::json& media_proc_cfg,
                                                          const std::string& source);

// Step 1 for an image of width x height.
struct ResizePlan {
  int new_width = 0, new_height = 0;  // after scaling (the original size when it fits)
  int pad_width = 0, pad_height = 0;  // zeros added right and bottom
  int grid_h = 0, grid_w = 0;         // patches
  int num_tokens = 0;                 // rows in the prompt after merging
};
Result<ResizePlan> plan_resize(int width, int height, const ImageProcessorConfig& cfg);

// PIL's Image.resize(size, BICUBIC) of 8-bit interleaved pixels (any channel count, each
// channel resampled alone), and PIL's NEAREST.
std::vector<uint8_t> resize_bicubic(const std::vector<uint8_t>& pixels, int width, int height, int channels,
                                    int new_width, int new_height);
std::vector<uint8_t> resize_nearest(const std::vector<uint8_t>& pixels, int width, int height, int channels,
                                    int new_width, int new_height);

// What the vision tower reads for one image.
struct ImagePatches {
  int width = 0, height = 0;  // the original size (the prompt says "image WxH")
  int grid_h = 0, grid_w = 0;  // patches per column and per row
  int patch_size = 14;
  int num_tokens = 0;          // prompt rows: (grid_h / merge) x (grid_w / merge)
  std::vector<float> values;   // [grid_h * grid_w, 3 * patch * patch]
  uint64_t content_hash = 0;   // of values and grid: tells images apart in the prefix cache
};
Result<ImagePatches> preprocess_image(const DecodedImage& image, const ImageProcessorConfig& cfg);

}  // namespace moonrun::vision
