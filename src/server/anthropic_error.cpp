#include "server/anthropic_error.h"

namespace moonrun::server {

bool is_anthropic_route(std::string_view path) {
  constexpr std::string_view kPrefix = "/v1/messages";
  return path.substr(0, kPrefix.size()) == kPrefix && (path.size() == kPrefix.size() || path[kPrefix.size()] == '/');
}

int anthropic_status(int http_status) { return http_status == 503 ? 529 : http_status; }

const char* anthropic_error_type(int status) {
  switch (status) {
    case 401: return "authentication_error";
    case 403: return "permission_error";
    case 404: return "not_found_error";
    case 413: return "request_too_large";
    case 429: return "rate_limit_error";
    case 529: return "overloaded_error";
    default: return status >= 500 ? "api_error" : "invalid_request_error";
  }
}

nlohmann::json anthropic_error_json(const ApiError& error) {
  const int status = anthropic_status(error.http_status);
  return {{"type", "error"}, {"error", {{"type", anthropic_error_type(status)}, {"message", error.message}}}};
}

void send_anthropic_error(HttpResponse& res, const ApiError& error) {
  res.status = anthropic_status(error.http_status);
  res.stream = nullptr;
  res.set_content(anthropic_error_json(error).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace),
                  "application/json");
  if (res.status == 529 || res.status == 429) res.set_header("Retry-After", "1");
}

}  // namespace moonrun::server
