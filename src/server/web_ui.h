#pragma once
// The built-in chat page (docs/chat-page.md): the files of src/server/web/, embedded in the
// binary at build time (cmake/embed_files.cmake), served at GET / and /chat without a key.
#include <span>
#include <string_view>

#include "server/http_types.h"

namespace moonrun::server {

struct EmbeddedFile {
  std::string_view name;  // relative to src/server/web/: "chat.html", "chat.js"
  std::span<const unsigned char> bytes;
};
// Generated at build time from src/server/web/* (build/generated/web_files.cpp).
std::span<const EmbeddedFile> embedded_web_files();

// Answers GET / and /chat (the page) and /chat/<file> (its script and styles); false for
// any other path, which the caller then routes as usual.
bool serve_web_ui(const std::string& path, HttpResponse& res);

}  // namespace moonrun::server
