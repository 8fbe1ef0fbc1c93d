#include "server/web_ui.h"

namespace moonrun::server {

namespace {

std::string_view content_type_of(std::string_view name) {
  auto ends = [&](std::string_view ext) { return name.size() >= ext.size() && name.substr(name.size() - ext.size()) == ext; };
  if (ends(".html")) return "text/html; charset=utf-8";
  if (ends(".js") || ends(".mjs")) return "text/javascript; charset=utf-8";
  if (ends(".css")) return "text/css; charset=utf-8";
  if (ends(".svg")) return "image/svg+xml";
  return "application/octet-stream";
}

const EmbeddedFile* find_file(std::string_view name) {
  for (const EmbeddedFile& f : embedded_web_files())
    if (f.name == name) return &f;
  return nullptr;
}

}  // namespace

bool serve_web_ui(const std::string& path, HttpResponse& res) {
  std::string_view name;
  if (path == "/" || path == "/chat" || path == "/chat/") name = "chat.html";
  else if (path.starts_with("/chat/")) name = std::string_view(path).substr(6);
  else return false;
  const EmbeddedFile* file = find_file(name);
  if (!file) return false;
  res.status = 200;
  res.set_content(std::string(reinterpret_cast<const char*>(file->bytes.data()), file->bytes.size()),
                  std::string(content_type_of(name)));
  // Model output is untrusted text on this page: the renderer never parses it as HTML, and the
  // policy below blocks any script, style or frame that is not one of these files, should a
  // bug ever let markup through. connect-src 'self': the page talks to this server only.
  res.set_header("Content-Security-Policy",
                 "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data: blob:; "
                 "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'");
  res.set_header("X-Content-Type-Options", "nosniff");
  res.set_header("Referrer-Policy", "no-referrer");
  // The bytes change only with the binary; revalidating is cheap and an upgrade shows at once.
  res.set_header("Cache-Control", "no-cache");
  return true;
}

}  // namespace moonrun::server
