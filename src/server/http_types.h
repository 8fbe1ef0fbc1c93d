#pragma once
// The request and response a route handler sees, independent of the HTTP machinery in
// http_server.cpp (Boost.Beast on an Asio event loop). Member names follow cpp-httplib's,
// which the handlers were first written against: body, method, path, get_header_value,
// status, set_content, set_header.
//
// A handler runs on a worker thread with the whole request already read and decoded (the
// event loop enforced the deadlines and size limits). It fills the response, or sets
// `stream`: the server then sends the status line and headers with chunked encoding and
// calls stream(sink) on the same worker thread; each sink.write() is one chunk on the wire.
#include <functional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace moonrun::server {

struct HttpRequest {
  std::string method;  // "GET", "POST", ...
  std::string target;  // as sent: path and query
  std::string path;    // target without the query
  std::string body;    // decoded (chunked and gzip/deflate undone), at most --max-request-bytes
  std::vector<std::pair<std::string, std::string>> headers;
  std::string remote_addr;
  int remote_port = 0;
  std::string request_id;  // X-Request-Id as given (when sane), else generated
  // True once the client closed or reset its connection (a poll of the socket; cheap).
  std::function<bool()> client_gone;

  // Case-insensitive; the first value, or "" when absent.
  std::string get_header_value(std::string_view name) const;
  bool has_header(std::string_view name) const;
};

// One open response stream. write() blocks until the bytes are handed to the kernel or the
// write deadline passes; false once the client is gone (then stop writing).
class ChunkSink {
 public:
  virtual ~ChunkSink() = default;
  virtual bool write(std::string_view data) = 0;
  // False once the client closed or reset the connection (no write needed to notice).
  virtual bool is_writable() = 0;
};

struct HttpResponse {
  int status = 200;
  std::string body;
  std::string content_type = "text/plain";
  std::vector<std::pair<std::string, std::string>> headers;
  // Set by a streaming handler; see the header comment.
  std::function<void(ChunkSink&)> stream;

  void set_content(std::string content, std::string type) {
    body = std::move(content);
    content_type = std::move(type);
  }
  void set_header(std::string name, std::string value);  // replaces a header of that name
  std::string get_header_value(std::string_view name) const;
};

bool iequals(std::string_view a, std::string_view b);
std::string http_reason_phrase(int status);  // "Service Unavailable"

}  // namespace moonrun::server
