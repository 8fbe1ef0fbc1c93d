#include "server/chat_pipeline.h"

#include "chat/render_chat.h"
#include "server/handlers.h"
#include "server/image_input.h"
#include "server/output_constraint.h"
#include "server/sampling_request.h"

namespace moonrun::server {

Result<ChatPrompt> chat_prompt(const ServingContext& ctx, const chat::ChatRequest& request,
                               chat::RenderOptions render) {
  // Images, in message order (the order the chat format consumes them): each one decoded
  // and preprocessed now, so a bad image is a 400 before anything is queued.
  std::vector<int> tokens_per_image;
  int64_t patches = 0;
  auto images = std::make_shared<vision::PromptImages>();
  for (size_t i = 0; i < request.messages.size(); ++i) {
    const chat::Content& content = request.messages[i].content;
    if (content.num_images() == 0) continue;
    for (size_t k = 0; k < content.parts.size(); ++k) {
      if (content.parts[k].kind != chat::ContentPart::Kind::kImage) continue;
      const std::string where = "messages[" + std::to_string(i) + "].content[" + std::to_string(k) + "].image_url";
      if (!ctx.images)
        return invalid_argument(where + ": this model takes no images (its checkpoint has no vision tower)");
      if (static_cast<int>(images->images.size()) >= ctx.images->limits.max_images)
        return invalid_argument(where + ": more than " + std::to_string(ctx.images->limits.max_images) +
                                " images in one request (--max-images-per-request)");
      images->images.push_back(MR_TRY(load_image(content.parts[k].image_url, *ctx.images, where)));
      const vision::ImagePatches& im = images->images.back();
      patches += static_cast<int64_t>(im.grid_h) * im.grid_w;
      if (patches > ctx.images->limits.max_patches)
        return invalid_argument(where + ": the request's images hold " + std::to_string(patches) +
                                " patches of 14 px, over the " + std::to_string(ctx.images->limits.max_patches) +
                                " the vision tower takes at once (4 per token of --chunked-prefill-size)");
      render.image_prompts.push_back(vision::image_prompt(im.width, im.height));
      tokens_per_image.push_back(im.num_tokens);
    }
  }

  ChatPrompt out;
  auto segments = MR_TRY(chat::render_chat(ctx.chat_format, request, render));
  std::vector<uint32_t> ids;
  for (const auto& s : segments) ctx.tokenizer->encode_append(s.text, s.allow_special, ids);
  out.prompt_ids.assign(ids.begin(), ids.end());
  if (!images->images.empty()) {
    images->placeholder_id = ctx.images->placeholder_id;
    out.prompt_ids = MR_TRY(vision::expand_placeholders(out.prompt_ids, images->placeholder_id, tokens_per_image));
    out.images = std::move(images);
  }
  return out;
}

Result<PreparedChat> prepare_chat(const ServingContext& ctx, const chat::Json& body, ContextFit fit) {
  PreparedChat out;
  out.request = MR_TRY(chat::parse_chat_request(body));
  ChatPrompt prompt = MR_TRY(chat_prompt(ctx, out.request));
  out.prompt_ids = std::move(prompt.prompt_ids);
  out.images = std::move(prompt.images);

  // The sampling fields read the same body (unordered is fine for them).
  const nlohmann::json plain = nlohmann::json::parse(body.dump(-1, ' ', false, chat::Json::error_handler_t::replace));
  out.params = MR_TRY(sampling_params_from_json(plain, Endpoint::kChat));
  MR_RETURN_IF_ERROR(check_token_ids(out.params, ctx.engine ? ctx.engine->vocab() : ctx.tokenizer->vocab_size()));
  // Kimi's markers are special tokens: the parser must see them in the text.
  out.params.skip_special_tokens = false;
  int max_tokens = out.params.max_tokens;
  MR_RETURN_IF_ERROR(fit ? fit(ctx.max_model_len, out.prompt_ids.size(), max_tokens)
                         : fit_context(ctx, out.prompt_ids.size(), max_tokens));
  out.params.max_tokens = max_tokens;
  out.params.make_constraint = MR_TRY(output_constraint(ctx, out.request, max_tokens));
  out.parse_options = chat::parse_options_for(out.request);
  return out;
}

ChoiceMessage parse_sample(const PreparedChat& chat, chat::ChatFormat format, const SampleOutcome& s) {
  auto parser = make_chat_output_parser(format, chat.parse_options);
  ChoiceMessage m;
  auto add = [&m](ParsedDelta d) {
    m.reasoning += d.reasoning;
    m.content += d.content;
    for (auto& c : d.tool_calls) m.tool_calls.push_back(std::move(c));
  };
  for (size_t k = 0; k < s.text_pieces.size(); ++k) {
    if (parser->in_reasoning()) m.reasoning_tokens += s.piece_tokens[k];
    add(parser->feed(s.text_pieces[k]));
  }
  add(parser->finish());
  return m;
}

const char* chat_finish_reason(FinishReason reason, bool had_tool_calls) {
  if (reason == FinishReason::kStop && had_tool_calls) return "tool_calls";
  return finish_reason_name(reason);
}

}  // namespace moonrun::server
