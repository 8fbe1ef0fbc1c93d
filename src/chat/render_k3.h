#pragma once
// Kimi K3 "XTML" prompt rendering, segment for segment as Moonshot's reference encoder
// (encoding_k3.py, build_chat_segments) produces it. The request-level choices the
// reference takes as keyword arguments come from ChatRequest: thinking on/off,
// thinking_effort, tool_choice, response_format.
#include <vector>

#include "chat/render_chat.h"

namespace moonrun::chat {

// The four K3 markers, the only text that may become special tokens.
inline constexpr const char* kK3Open = "<|open|>";
inline constexpr const char* kK3Close = "<|close|>";
inline constexpr const char* kK3Sep = "<|sep|>";
inline constexpr const char* kK3EndOfMsg = "<|end_of_msg|>";
inline constexpr const char* kK3ImagePlaceholder = "<|kimi_image_placeholder|>";

Result<std::vector<Segment>> render_k3(const ChatRequest& request, const RenderOptions& options);

}  // namespace moonrun::chat
