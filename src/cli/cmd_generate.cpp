// `moonrun generate --model M --token-ids 1,2,3 --max-tokens N [--temperature T] [--seed S]
// [--logits-out FILE]`: runs the CPU model on token ids (verbatim, no BOS) and prints one
// JSON line {"prompt_tokens": n, "token_ids": [...]} (+ "logits_shape" with --logits-out,
// whose file holds float32 little-endian logits, one row per generated token).
#include <cstdio>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "model/generate.h"
#include "model/kimi_k3.h"
#if MOONRUN_HAS_CUDA
#include "kernels/cuda/common/device_info.h"
#include "runtime/cuda/cuda_model_runner.h"
#endif

namespace moonrun::cli {

namespace {

struct GenerateArgs {
  std::string model;
  std::string token_ids;
  int max_tokens = 16;
  float temperature = 0.0f;
  uint64_t seed = 0;
  std::string logits_out;
  bool verbose = false;
  std::string device = "auto";
  double mem_fraction_static = 0.5;
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

}  // namespace

// "auto" -> "cuda" when this build has the CUDA backend and a GPU is visible, else "cpu";
// "cuda" without either -> "error: ..." with the reason.
std::string resolve_device(const std::string& requested) {
#if MOONRUN_HAS_CUDA
  const bool gpu = cuda::device_count() > 0;
  if (requested == "auto") return gpu ? "cuda" : "cpu";
  if (requested == "cuda" && !gpu) return "error: --device cuda: no CUDA device is visible; use --device cpu";
  return requested;
#else
  if (requested == "cuda") return "error: --device cuda: this build has no CUDA backend (nvcc was not found at configure time)";
  return "cpu";
#endif
}

namespace {

void run_generate(const GenerateArgs& a) {
  std::vector<int32_t> prompt = parse_token_ids(a.token_ids);
  if (a.max_tokens < 0) fail(2, "--max-tokens must be >= 0");
  if (a.temperature < 0) fail(2, "--temperature must be >= 0");
  const std::string device = resolve_device(a.device);
  if (device.rfind("error: ", 0) == 0) fail(2, device.substr(7));
  WeightLoadOptions load;
  load.mxfp4_packed = device == "cuda";  // the GPU keeps MXFP4 experts packed
  auto model = KimiK3Model::load(a.model, load);
  if (!model.is_ok()) fail(model.status().code() == StatusCode::kInvalidArgument ? 2 : 1, model.status().message());
  const ModelConfig& cfg = (*model)->config();
  for (int32_t id : prompt)
    if (id >= cfg.vocab_size)
      fail(2, "--token-ids: token id " + std::to_string(id) + " is outside the vocabulary (vocab_size " +
                  std::to_string(cfg.vocab_size) + ")");

  GenerateOptions opt;
  opt.max_tokens = a.max_tokens;
  opt.temperature = a.temperature;
  opt.seed = a.seed;
  opt.keep_logits = !a.logits_out.empty();
  Result<GenerateResult> result = invalid_argument("no device");
  if (device == "cpu") {
    result = generate(**model, prompt, opt);
  } else {
#if MOONRUN_HAS_CUDA
    CudaDeviceOptions dev;
    dev.mem_fraction_static = a.mem_fraction_static;
    result = generate_cuda(**model, prompt, opt, dev);
#endif
  }
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
  cmd->add_option("--max-tokens", args->max_tokens, "tokens to generate")->capture_default_str();
  cmd->add_option("--temperature", args->temperature, "0 = greedy")->capture_default_str();
  cmd->add_option("--seed", args->seed, "sampling seed (temperature > 0)")->capture_default_str();
  cmd->add_option("--logits-out", args->logits_out,
                  "write float32 LE logits [generated, vocab] here (row 0 = last prompt position)");
  cmd->add_flag("--verbose", args->verbose, "print prefill/decode timings on stderr");
  cmd->add_option("--device", args->device, "cuda | cpu | auto (cuda when a GPU is present)")
      ->check(CLI::IsMember({"auto", "cpu", "cuda"}))
      ->capture_default_str();
  cmd->add_option("--mem-fraction-static", args->mem_fraction_static, "GPU memory fraction for weights and caches")
      ->capture_default_str();
  cmd->callback([args] { run_generate(*args); });
}

}  // namespace moonrun::cli
