#pragma once
// Kimi K2 / Kimi Linear prompt rendering: the `<|im_user|>user<|im_middle|>...<|im_end|>`
// format of the Kimi-K2-Thinking chat template (moonshotai/Kimi-K2-Thinking,
// chat_template.jinja), with `<think>` reasoning and `<|tool_calls_section_begin|>` calls.
#include <vector>

#include "chat/render_chat.h"

namespace moonrun::chat {

Result<std::vector<Segment>> render_k2(const ChatRequest& request, const RenderOptions& options);

}  // namespace moonrun::chat
