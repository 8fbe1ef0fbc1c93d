#pragma once
// Runs a generation behind an SSE response: pulls engine outputs on the worker thread,
// turns them into chunks through `on_output`, notices a dead client (a failed write, or a
// socket the peer closed) and aborts the request so its cache is freed within a step.
// Every stream ends with "data: [DONE]": after the usage chunk when it finished, after an
// error event when the engine failed or the server's shutdown deadline cut it.
#include <functional>
#include <memory>
#include <string>

#include "server/generation.h"
#include "server/http_types.h"

namespace moonrun::server {

struct StreamHandlers {
  // Chunks (already "data: ...\n\n" framed) to send for one engine output.
  std::function<std::string(const RequestOutput&)> on_output;
  // Chunks after every sample finished (final usage chunk); "data: [DONE]" is added.
  std::function<std::string()> on_done;
  // An engine error after the stream started: an SSE error event, then [DONE].
  std::function<std::string(const Status&)> on_error;
  std::string first;  // sent before any output (e.g. the role chunk)
  // End with OpenAI's "data: [DONE]" (chat, completions); the Responses and Anthropic
  // Messages streams end with their own final event instead.
  bool done_marker = true;
};

void stream_generation(HttpResponse& res, std::shared_ptr<Generation> generation, StreamHandlers handlers);

}  // namespace moonrun::server
