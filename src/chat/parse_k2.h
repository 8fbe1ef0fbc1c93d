#pragma once
// The Kimi K2 / Kimi Linear completion parser (vLLM's kimi_k2 reasoning and tool parsers):
//   [<think>]REASONING</think>CONTENT
//   [<|tool_calls_section_begin|>
//      <|tool_call_begin|>functions.NAME:IDX<|tool_call_argument_begin|>{JSON}<|tool_call_end|> ...
//    <|tool_calls_section_end|>]<|im_end|>
// The call header is the model's own call id; the name is its part before ":IDX" without
// the "functions." prefix. Arguments are the JSON text as generated (trimmed; "{}" if empty).
#include <memory>

#include "chat/parse_message.h"

namespace moonrun::chat {

std::unique_ptr<CompletionParser> make_k2_parser(const ParseOptions& options);

}  // namespace moonrun::chat
