#pragma once
// From a typed chat request to prompt segments, in the checkpoint's chat format.
//
// A prompt is a list of segments because the tokenizer must know where special tokens may
// appear: structural markers (K3's <|open|> <|close|> <|sep|> <|end_of_msg|>, K2's
// <|im_user|> ...) are encoded as special tokens, while user text, tool output, tag names
// and attribute values are ordinary text even when they spell a marker. The K3 reference
// tokenizer also encodes each segment on its own (BPE never merges across a boundary), so
// the segment boundaries are part of the format, not just the concatenated text.
#include <string>
#include <vector>

#include "chat/chat_request.h"
#include "chat/tokenizer.h"  // Segment: {text, allow_special}, what Tokenizer::encode takes
#include "common/status.h"

namespace moonrun::chat {

enum class ChatFormat { kKimiK3, kKimiK2 };
const char* chat_format_name(ChatFormat format);
Result<ChatFormat> chat_format_from_name(const std::string& name);  // "kimi_k3" | "kimi_k2"

// The format of a checkpoint directory: the family table's (model/families.h) row for
// config.json's model_type / architectures: kimi_k3 -> K3; kimi_linear, kimi_k2, kimi_k25,
// deepseek_v3 -> K2 (their text models share the <|im_*|> format); another name is an error.
// Without a model_type, a tokenizer_config.json carrying a chat_template means K2 (K3 ships
// none: its format is code).
Result<ChatFormat> chat_format_for_checkpoint(const std::string& model_dir);

struct RenderOptions {
  bool add_generation_prompt = true;
  // K3: the text each image stands for (e.g. "<|media_begin|>image 128x128<|media_content|>
  // <|media_pad|><|media_end|>"), one per image in message order. Empty: images render as
  // the placeholder <|kimi_image_placeholder|>, as the reference does without prompts.
  std::vector<std::string> image_prompts;
};

Result<std::vector<Segment>> render_chat(ChatFormat format, const ChatRequest& request,
                                         const RenderOptions& options = {});

std::string join_segments(const std::vector<Segment>& segments);

}  // namespace moonrun::chat
