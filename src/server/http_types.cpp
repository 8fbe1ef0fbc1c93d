#include "server/http_types.h"

#include <cctype>

namespace moonrun::server {

bool iequals(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (std::tolower(static_cast<unsigned char>(a[i])) != std::tolower(static_cast<unsigned char>(b[i]))) return false;
  return true;
}

std::string HttpRequest::get_header_value(std::string_view name) const {
  for (const auto& [k, v] : headers)
    if (iequals(k, name)) return v;
  return "";
}

bool HttpRequest::has_header(std::string_view name) const {
  for (const auto& [k, v] : headers)
    if (iequals(k, name)) return true;
  return false;
}

void HttpResponse::set_header(std::string name, std::string value) {
  for (auto& [k, v] : headers)
    if (iequals(k, name)) {
      v = std::move(value);
      return;
    }
  headers.emplace_back(std::move(name), std::move(value));
}

std::string HttpResponse::get_header_value(std::string_view name) const {
  for (const auto& [k, v] : headers)
    if (iequals(k, name)) return v;
  return "";
}

}  // namespace moonrun::server
