#pragma once
// OpenAI error envelopes: {"error": {"message", "type", "param", "code"}} with the HTTP status
// the OpenAI API (and vLLM/SGLang) use for each kind of failure.
#include <string>

#include <nlohmann/json.hpp>

#include "common/status.h"

namespace moonrun::server {

struct ApiError {
  int http_status = 400;
  std::string message;
  std::string type = "invalid_request_error";  // invalid_request_error | authentication_error | ...
  std::string param;                            // "" -> null
  std::string code;                             // "" -> null, e.g. "context_length_exceeded"
  nlohmann::json to_json() const;
};

ApiError bad_request(std::string message, std::string param = "", std::string code = "");
ApiError unauthorized();
ApiError not_found_error(std::string message, std::string param = "", std::string code = "");
ApiError payload_too_large(size_t limit_bytes);
ApiError overloaded(std::string message);
// 503 "server_shutting_down": refused after SIGTERM, or cut at --shutdown-timeout.
ApiError shutting_down(std::string message);
ApiError internal(std::string message);

// The HTTP status and type for a request Status coming back from the chat/engine layers.
ApiError from_status(const Status& status);

}  // namespace moonrun::server
