#pragma once
// The Kimi K3 completion parser (reasoning + tool calls, vLLM's kimi_k3 parsers' output).
// With thinking, the prompt ended inside the think channel, so a completion reads
//   REASONING<|close|>think<|sep|><|open|>response<|sep|>CONTENT<|close|>response<|sep|>
//   [<|open|>tools<|sep|>CALLS<|close|>tools<|sep|>]<|close|>message<|sep|><|end_of_msg|>
// and without thinking it starts at CONTENT. Each call is
//   <|open|>call tool="NAME" index="N"<|sep|>
//     <|open|>argument key="K" type="T"<|sep|>VALUE<|close|>argument<|sep|> ...
//   <|close|>call<|sep|>
// with string values raw and other types JSON; attribute values escape & and ".
#include <memory>

#include "chat/parse_message.h"

namespace moonrun::chat {

std::unique_ptr<CompletionParser> make_k3_parser(const ParseOptions& options);

}  // namespace moonrun::chat
