// `moonrun generate --model M --token-ids 1,2,3 --max-tokens N [--temperature T] [--seed S]
// [--top-p P] [--top-k K] [--logits-out FILE] [--device cpu|cuda] [--dtype float32]`: runs the
// model on token ids (verbatim, no BOS) and prints one JSON line
// {"prompt_tokens": n, "token_ids": [...]} (+ "logits_shape" with --logits-out, whose file
// holds float32 little-endian logits, one row per generated token). Sampling is the
// server's: the same seed gives the same tokens as a request to `moonrun serve`.
// `--image FILE` (repeatable, in prompt order): the token ids hold the model's media
// placeholder (<|media_pad|>) once per image, as the chat format writes it; each one is
// expanded to its image's rows (vision/placeholders.h) and "prompt_tokens" counts them.
#include <cstdio>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "model/checkpoint.h"
#include "model/config.h"
#include "model/vision/image_decode.h"
#include "model/vision/placeholders.h"
#include "model/vision/preprocess.h"
#include "runtime/generate.h"
#include "runtime/runtime_builder.h"

namespace moonrun::cli {

namespace {

struct GenerateArgs {
  std::string model;
  std::string token_ids;
  int max_tokens = 16;
  float temperature = 0.0f;
  float top_p = 1.0f;
  int top_k = 0;
  uint64_t seed = 0;
  std::string logits_out;
  bool verbose = false;
  std::string device = "auto";
  std::string dtype = "auto";
  double mem_fraction_static = 0.5;
  bool disable_cuda_graph = false;
  int tp_size = 1;
  int ep_size = 1;
  int pp_size = 1;
  bool split_router = false, split_latent_moe = false, split_latent_up = false;
  bool dp_attention = false;
  std::vector<std::string> images;
};


[[noreturn]] void fail(int code, const std::string& message) {
  std::fprintf(stderr, "moonrun generate: %s\n", message.c_str());
  throw CLI::RuntimeError(code);
}

std::vector<int32_t> parse_token_ids(const std::string& text) {
  std::vector<int32_t> ids;
  size_t pos = 0;
  while (pos <= text.size()) {
    size_t end = text.find(',', pos);
    if (end == std::string::npos) end = text.size();
    std::string item = text.substr(pos, end - pos);
    while (!item.empty() && item.front() == ' ') item.erase(item.begin());
    while (!item.empty() && item.back() == ' ') item.pop_back();
    size_t used = 0;
    long long v = -1;
    try {
      v = std::stoll(item, &used);
    } catch (...) {
      used = 0;
    }
    if (item.empty() || used != item.size() || v < 0 || v > INT32_MAX)
      fail(2, "--token-ids: \"" + item + "\" is not a token id (expected comma-separated integers >= 0)");
    ids.push_back(static_cast<int32_t>(v));
    pos = end + 1;
  }
  return ids;
}

// The images' patches, through the model's processor (the files' bytes as a request's
// data: URI would carry them).
std::vector<vision::ImagePatches> load_images(const std::vector<std::string>& files, const std::string& model) {
  std::vector<vision::ImagePatches> out;
  if (files.empty()) return out;
  auto dir = resolve_model_path(model);
  if (!dir.is_ok()) fail(2, dir.status().message());
  std::ifstream cin(*dir + "/config.json");
  const nlohmann::json j = nlohmann::json::parse(cin, nullptr, false);
  if (j.is_discarded()) fail(2, *dir + "/config.json: not valid JSON");
  auto cfg = parse_model_config(j, *dir + "/config.json");
  if (!cfg.is_ok()) fail(2, cfg.status().message());
  if (!cfg->vision.enabled) fail(2, "--image: the model has no vision tower (config.json's vision_config)");
  auto proc = vision::load_image_processor_config(*dir, cfg->vision);
  if (!proc.is_ok()) fail(2, proc.status().message());
  for (const std::string& f : files) {
    std::ifstream in(f, std::ios::binary);
    if (!in) fail(2, "--image " + f + ": cannot be read");
    const std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    auto decoded = vision::decode_image(bytes, int64_t{1} << 30);
    if (!decoded.is_ok()) fail(2, "--image " + f + ": " + decoded.status().message());
    auto patches = vision::preprocess_image(*decoded, *proc);
    if (!patches.is_ok()) fail(2, "--image " + f + ": " + patches.status().message());
    out.push_back(std::move(patches).value());
  }
  return out;
}

}  // namespace

namespace {

void run_generate(const GenerateArgs& a) {
  std::vector<int32_t> prompt = parse_token_ids(a.token_ids);
  const std::vector<vision::ImagePatches> images = load_images(a.images, a.model);
  if (a.max_tokens < 0) fail(2, "--max-tokens must be >= 0");
  if (a.temperature < 0) fail(2, "--temperature must be >= 0");
  GenerateOptions opt;
  opt.max_tokens = a.max_tokens;
  opt.sampling.temperature = a.temperature;
  opt.sampling.top_p = a.top_p;
  opt.sampling.top_k = a.top_k;
  opt.sampling.seed = a.seed;
  opt.keep_logits = !a.logits_out.empty();
  if (Status st = opt.sampling.validate(); !st.is_ok()) fail(2, st.message());

  int32_t placeholder_id = -1;
  if (!images.empty()) {
    // Expanded before the runtime is sized: the prompt's length counts each image's rows.
    std::ifstream cin(*resolve_model_path(a.model) + "/config.json");
    placeholder_id = nlohmann::json::parse(cin).value("media_placeholder_token_id", -1);
    std::vector<int> rows;
    for (const auto& im : images) rows.push_back(im.num_tokens);
    auto expanded = vision::expand_placeholders(prompt, placeholder_id, rows);
    if (!expanded.is_ok()) fail(2, "--image: " + expanded.status().message());
    prompt = std::move(expanded).value();
  }

  // One sequence: one state slot, pages for the prompt and the generated tokens.
  RuntimeOptions ro;
  ro.device = a.device;
  ro.dtype = a.dtype;
  ro.mem_fraction_static = a.mem_fraction_static;
  ro.max_running_requests = 1;
  ro.max_tokens_per_step = static_cast<int>(std::max<size_t>(prompt.size(), 1));
  ro.page_size_tokens = defaults::kPageSizeTokens;
  ro.context_length = static_cast<int64_t>(prompt.size()) + a.max_tokens;
  ro.max_total_tokens = static_cast<int64_t>(pages_for_generate(prompt.size(), opt, ro.page_size_tokens)) *
                        ro.page_size_tokens;
  ro.prefix_cache = false;
  ro.cuda_graphs = !a.disable_cuda_graph;
  ro.tp_size = a.tp_size;
  ro.ep_size = a.ep_size;
  ro.pp_size = a.pp_size;
  ro.split_router = a.split_router;
  ro.split_latent_moe = a.split_latent_moe;
  ro.split_latent_up = a.split_latent_up;
  ro.dp_attention = a.dp_attention;
  ro.log = a.verbose;
  auto rt = build_runtime(a.model, ro);
  if (!rt.is_ok()) fail(rt.status().code() == StatusCode::kInvalidArgument ? 2 : 1, rt.status().message());
  const ModelConfig& cfg = rt->config;
  for (int32_t id : prompt)
    if (id >= cfg.vocab_size)
      fail(2, "--token-ids: token id " + std::to_string(id) + " is outside the vocabulary (vocab_size " +
                  std::to_string(cfg.vocab_size) + ")");
  if (!images.empty()) {
    std::vector<const vision::ImagePatches*> pointers;
    for (const auto& im : images) pointers.push_back(&im);
    auto rows = rt->runner->encode_images(pointers);
    if (!rows.is_ok()) fail(1, rows.status().message());
    opt.given_rows = std::move(rows).value();
    opt.given_at = vision::placeholder_positions(prompt, placeholder_id);
  }
  Result<GenerateResult> result = generate(*rt->runner, ro.page_size_tokens, prompt, opt);
  if (!result.is_ok()) fail(1, result.status().message());

  nlohmann::ordered_json out;
  out["prompt_tokens"] = prompt.size();
  out["token_ids"] = result->token_ids;
  if (!a.logits_out.empty()) {
    FILE* f = std::fopen(a.logits_out.c_str(), "wb");
    if (!f) fail(1, a.logits_out + ": cannot open for writing");
    // float32 little-endian: the in-memory layout on every platform moonrun builds for.
    static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "logits are written as little-endian float32");
    size_t n = result->logits.size();
    bool ok = std::fwrite(result->logits.data(), sizeof(float), n, f) == n;
    ok = (std::fclose(f) == 0) && ok;
    if (!ok) fail(1, a.logits_out + ": write failed");
    out["logits_shape"] = {result->token_ids.size(), cfg.vocab_size};
  }
  std::printf("%s\n", out.dump().c_str());
  std::fflush(stdout);
  if (a.verbose) {
    const size_t n_dec = result->token_ids.empty() ? 0 : result->token_ids.size() - 1;
    std::fprintf(stderr, "prefill: %zu tokens in %.3f s; decode: %zu tokens in %.3f s (%.1f tokens/s)\n",
                 prompt.size(), result->prefill_seconds, n_dec, result->decode_seconds,
                 result->decode_seconds > 0 ? n_dec / result->decode_seconds : 0.0);
  }
}

}  // namespace

void add_generate_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("generate", "Run the model on token ids and print the generated ids as JSON");
  auto args = std::make_shared<GenerateArgs>();
  cmd->add_option("--model", args->model, "checkpoint directory or Hugging Face repo id")->required();
  cmd->add_option("--token-ids", args->token_ids, "prompt token ids, comma-separated (used verbatim, no BOS)")
      ->required();
  cmd->add_option("--image", args->images,
                  "an image file (repeatable, prompt order); the token ids hold the media placeholder once per image");
  cmd->add_option("--max-tokens", args->max_tokens, "tokens to generate")->capture_default_str();
  cmd->add_option("--temperature", args->temperature, "0 = greedy")->capture_default_str();
  cmd->add_option("--seed", args->seed, "sampling seed (temperature > 0)")->capture_default_str();
  cmd->add_option("--top-p", args->top_p, "nucleus sampling mass")->capture_default_str();
  cmd->add_option("--top-k", args->top_k, "keep the k most likely tokens (0: off)")->capture_default_str();
  cmd->add_option("--logits-out", args->logits_out,
                  "write float32 LE logits [generated, vocab] here (row 0 = last prompt position)");
  cmd->add_flag("--verbose", args->verbose, "print the load log and prefill/decode timings on stderr");
  cmd->add_option("--device", args->device, "cuda | cpu | auto (cuda when a GPU is present)")
      ->check(CLI::IsMember({"auto", "cpu", "cuda"}))
      ->capture_default_str();
  cmd->add_option("--mem-fraction-static", args->mem_fraction_static, "GPU memory fraction for weights and caches")
      ->capture_default_str();
  cmd->add_option("--dtype", args->dtype, "auto | bfloat16 | float32 (CUDA: every op in fp32)")
      ->check(CLI::IsMember({"auto", "bfloat16", "bf16", "float32"}))
      ->capture_default_str();
  cmd->add_flag("--disable-cuda-graph", args->disable_cuda_graph, "decode steps without CUDA graphs");
  cmd->add_option("--tp-size,--tensor-parallel-size", args->tp_size,
                  "tensor-parallel ranks (CPU: threads of this process)")->capture_default_str();
  cmd->add_option("--ep-size,--expert-parallel-size", args->ep_size,
                  "expert-parallel groups (must divide --tp-size)")->capture_default_str();
  cmd->add_option("--pp-size,--pipeline-parallel-size", args->pp_size,
                  "pipeline stages, each a --tp-size group (CPU: threads of this process)")->capture_default_str();
  cmd->add_flag("--split-router", args->split_router, "the MoE router split over the TP ranks by expert");
  cmd->add_flag_callback(
      "--split-latent-moe", [args] { args->split_latent_moe = args->split_latent_up = true; },
      "the LatentMoE down and up projections split over the TP ranks");
  cmd->add_flag_callback(
      "--split-latent-moe-down", [args] { args->split_latent_moe = true; },
      "only the LatentMoE down projection split over the TP ranks");
  cmd->add_flag("--enable-dp-attention", args->dp_attention,
                "attention whole on each TP rank for its own sequences, the routed experts split (--ep-size)");
  cmd->callback([args] { run_generate(*args); });
}

}  // namespace moonrun::cli
