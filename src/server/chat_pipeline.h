#pragma once
// The steps every chat-shaped endpoint shares (/v1/chat/completions, /v1/responses,
// /v1/messages): an OpenAI chat body -> the prompt in the checkpoint's chat format, the
// sampling parameters with the structured-output constraint, the parse options; and each
// finished sample -> reasoning, content and tool calls. The Responses and Messages
// handlers translate their bodies into a chat body first, so all three APIs render, sample
// and parse exactly alike.
#include <memory>
#include <string>
#include <vector>

#include "chat/chat_request.h"
#include "chat/parse_message.h"
#include "chat/render_chat.h"
#include "common/status.h"
#include "model/vision/placeholders.h"
#include "runtime/sampling_params.h"
#include "server/chat_output.h"
#include "server/generation.h"
#include "server/serving_context.h"

namespace moonrun::server {

struct PreparedChat {
  chat::ChatRequest request;
  SamplingParams params;         // max_tokens filled in, constraint attached
  std::vector<int32_t> prompt_ids;  // each image's placeholder expanded to its rows
  chat::ParseOptions parse_options;
  std::shared_ptr<const vision::PromptImages> images;  // null: no images
};

// A chat request's prompt ids in the checkpoint's format: its images loaded (image_input.h),
// each rendered as its image prompt with the placeholder expanded to its rows. What
// prepare_chat and /tokenize share, so /tokenize counts what usage.prompt_tokens will.
struct ChatPrompt {
  std::vector<int32_t> prompt_ids;
  std::shared_ptr<const vision::PromptImages> images;  // null: no images
};
Result<ChatPrompt> chat_prompt(const ServingContext& ctx, const chat::ChatRequest& request,
                               chat::RenderOptions render = {});

// How a prompt that does not fit the context is refused (and max_tokens defaulted):
// fit_context's OpenAI/vLLM texts unless the route's clients read other texts
// (anthropic_fit_context for /v1/messages).
using ContextFit = Status (*)(int64_t max_model_len, size_t prompt_tokens, int& max_tokens);

// body: the chat body as parsed (object key order kept; the chat format prints parts of it
// back byte for byte). Errors are request errors (400s) naming the field.
Result<PreparedChat> prepare_chat(const ServingContext& ctx, const chat::Json& body, ContextFit fit = nullptr);

struct ChoiceMessage {
  std::string reasoning;
  std::string content;
  std::vector<ToolCallOut> tool_calls;
  int reasoning_tokens = 0;
};

// One finished sample parsed the way the stream would have been (piece by piece).
ChoiceMessage parse_sample(const PreparedChat& chat, chat::ChatFormat format, const SampleOutcome& sample);

// "tool_calls" when a finished sample called tools, else the engine's reason.
const char* chat_finish_reason(FinishReason reason, bool had_tool_calls);

}  // namespace moonrun::server
