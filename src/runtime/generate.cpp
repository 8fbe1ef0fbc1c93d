#include "runtime/generate.h"

#include <algorithm>
#include <chrono>

#include "runtime/sequence_sampler.h"

namespace moonrun {

namespace {
double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}
}  // namespace

int pages_for_generate(size_t prompt_tokens, const GenerateOptions& opt, int page_size_tokens) {
  const int64_t n_total = static_cast<int64_t>(prompt_tokens) + std::max(opt.max_tokens, 0);
  return static_cast<int>(std::max<int64_t>(1, (n_total + page_size_tokens - 1) / page_size_tokens));
}

Result<GenerateResult> generate(StepRunner& runner, int page_size_tokens, const std::vector<int32_t>& prompt,
                                const GenerateOptions& opt) {
  if (prompt.empty()) return invalid_argument("the prompt has no tokens");
  if (opt.max_tokens < 0) return invalid_argument("max_tokens must be >= 0");
  if (!opt.forced_ids.empty() && static_cast<int>(opt.forced_ids.size()) + 1 < opt.max_tokens)
    return invalid_argument("teacher forcing needs max_tokens - 1 forced ids");
  MR_RETURN_IF_ERROR(opt.sampling.validate());
  std::vector<int32_t> pages(pages_for_generate(prompt.size(), opt, page_size_tokens));
  for (size_t p = 0; p < pages.size(); ++p) pages[p] = static_cast<int32_t>(p);
  // The engine seeds sample i of a seeded request with seed + i: this is sample 0.
  SequenceSampler sampler(opt.sampling, opt.sampling.seed.value_or(0), prompt);

  if (opt.prefill_chunk_tokens < 0) return invalid_argument("prefill_chunk_tokens must be >= 0");
  if (!opt.given_at.empty() && opt.prefill_chunk_tokens > 0)
    return invalid_argument("image rows need the prompt in one step");

  GenerateResult r;
  int n_past = 0;
  StepInput in;
  in.before.push_back({-1, 0});  // a fresh sequence: zero its state slot
  StepOutput out;
  auto t0 = std::chrono::steady_clock::now();
  // Every chunk of the prompt but the last: into the caches, nothing sampled.
  const int chunk = opt.prefill_chunk_tokens;
  while (chunk > 0 && opt.max_tokens > 0 && static_cast<int>(prompt.size()) - n_past > chunk) {
    in.seqs.assign(1, StepSeq{});
    StepSeq& seq = in.seqs[0];
    seq.new_token_ids = std::span<const int32_t>(prompt).subspan(n_past, chunk);
    seq.n_past = n_past;
    seq.state_slot = 0;
    seq.pages = pages;
    seq.sample = false;
    in.sampling = SamplingBatch{};
    in.return_logits = false;
    MR_RETURN_IF_ERROR(runner.step(in, out));
    in.before.clear();
    n_past += chunk;
  }
  std::vector<int32_t> fed(prompt.begin() + n_past, prompt.end());  // the tokens of this step
  in.return_logits = opt.keep_logits;
  for (int k = 0; k < opt.max_tokens; ++k) {
    in.seqs.assign(1, StepSeq{});
    StepSeq& seq = in.seqs[0];
    seq.new_token_ids = fed;
    seq.n_past = n_past;
    seq.state_slot = 0;
    seq.pages = pages;
    seq.sample = true;
    if (k == 0) {
      seq.given_at = opt.given_at;
      seq.given_rows = opt.given_rows;
    }
    in.sampling = SamplingBatch{};
    sampler.add_row(in.sampling, k, {});
    MR_RETURN_IF_ERROR(runner.step(in, out));
    in.before.clear();
    if (k == 0) {
      r.prefill_seconds = seconds_since(t0);
      t0 = std::chrono::steady_clock::now();
    }
    const int32_t token = out.samples.at(0).token;
    sampler.accept(token);
    r.token_ids.push_back(token);
    if (opt.keep_logits) r.logits.insert(r.logits.end(), out.logits.begin(), out.logits.end());
    n_past += static_cast<int>(fed.size());
    if (k + 1 < opt.max_tokens) fed.assign(1, opt.forced_ids.empty() ? token : opt.forced_ids[k]);
  }
  r.decode_seconds = seconds_since(t0);
  return r;
}

}  // namespace moonrun
