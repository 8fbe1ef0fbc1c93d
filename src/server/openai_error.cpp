#include "server/openai_error.h"

namespace moonrun::server {

nlohmann::json ApiError::to_json() const {
  nlohmann::json err = {{"message", message}, {"type", type}};
  err["param"] = param.empty() ? nlohmann::json(nullptr) : nlohmann::json(param);
  err["code"] = code.empty() ? nlohmann::json(nullptr) : nlohmann::json(code);
  return {{"error", err}};
}

ApiError bad_request(std::string message, std::string param, std::string code) {
  return {400, std::move(message), "invalid_request_error", std::move(param), std::move(code)};
}

ApiError unauthorized() {
  return {401, "Incorrect API key provided. Pass it as 'Authorization: Bearer <key>'.",
          "authentication_error", "", "invalid_api_key"};
}

ApiError not_found_error(std::string message, std::string param, std::string code) {
  return {404, std::move(message), "invalid_request_error", std::move(param), std::move(code)};
}

ApiError payload_too_large(size_t limit_bytes) {
  return {413,
          "Request body is larger than the server's limit of " + std::to_string(limit_bytes) +
              " bytes (--max-request-bytes).",
          "invalid_request_error", "", "request_too_large"};
}

ApiError overloaded(std::string message) {
  return {503, std::move(message), "server_error", "", "server_overloaded"};
}

ApiError shutting_down(std::string message) {
  return {503, std::move(message), "server_error", "", "server_shutting_down"};
}

ApiError internal(std::string message) {
  return {500, std::move(message), "server_error", "", "internal_error"};
}

ApiError from_status(const Status& st) {
  switch (st.code()) {
    case StatusCode::kOk:
      return internal("ok status reported as an error");
    case StatusCode::kInvalidArgument:
      return bad_request(st.message());
    case StatusCode::kOutOfRange:
      return bad_request(st.message(), "messages", "context_length_exceeded");
    case StatusCode::kNotFound:
      return not_found_error(st.message());
    case StatusCode::kUnauthenticated:
      return unauthorized();
    case StatusCode::kResourceExhausted:
    case StatusCode::kUnavailable:
      return overloaded(st.message());
    case StatusCode::kUnimplemented:
      return bad_request(st.message(), "", "unsupported");
    default:
      return internal(st.message());
  }
}

}  // namespace moonrun::server
