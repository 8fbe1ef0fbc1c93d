#pragma once
// Runs a generation behind an SSE response: pulls engine outputs on the HTTP thread, turns
// them into chunks through `on_output`, notices a dead client (a failed write, or a socket
// that is no longer writable) and aborts the request so its cache is freed within a step.
#include <functional>
#include <memory>
#include <string>

#include "server/generation.h"

namespace httplib {
struct Response;
}

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

void stream_generation(httplib::Response& res, std::shared_ptr<Generation> generation,
                       StreamHandlers handlers);

}  // namespace moonrun::server
