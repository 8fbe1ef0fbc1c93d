#include "server/stream_writer.h"

#include "common/log.h"
#include "server/handlers.h"
#include "server/openai_error.h"

namespace moonrun::server {

void stream_generation(HttpResponse& res, std::shared_ptr<Generation> generation, StreamHandlers handlers) {
  res.set_header("Cache-Control", "no-cache");
  res.set_header("X-Accel-Buffering", "no");
  res.content_type = "text/event-stream";
  res.stream = [gen = std::move(generation), h = std::move(handlers)](ChunkSink& sink) {
    auto write = [&](const std::string& s) { return s.empty() || sink.write(s); };
    auto end_with_error = [&](const Status& st) {
      // The cut of a shutdown is the server's doing, not an engine failure: its own code.
      write(gen->was_cut() ? sse_data(shutting_down(st.message()).to_json())
            : h.on_error   ? h.on_error(st)
                           : sse_data(from_status(st).to_json()));
      if (h.done_marker) write("data: [DONE]\n\n");
    };
    if (!write(h.first)) return gen->abort();
    RequestOutput out;
    while (true) {
      // Drain what is ready; wait a little when nothing is, then check the client.
      bool got = gen->next(out, std::chrono::milliseconds(50));
      while (got) {
        if (out.finished && !out.error.is_ok()) return end_with_error(out.error);
        if (out.finished && out.finish_reason == FinishReason::kAbort && gen->was_cut())
          return end_with_error(shutdown_cut_status());
        if (!write(h.on_output(out))) {
          MR_LOG(DEBUG) << "client disconnected; aborting its request";
          return gen->abort();
        }
        got = gen->next(out, std::chrono::milliseconds(0));
      }
      if (gen->done()) {
        if (gen->was_cut()) return end_with_error(shutdown_cut_status());
        write(h.on_done ? h.on_done() : std::string());
        if (h.done_marker) write("data: [DONE]\n\n");
        return;
      }
      if (!sink.is_writable()) {
        MR_LOG(DEBUG) << "client disconnected; aborting its request";
        return gen->abort();
      }
    }
  };
}

}  // namespace moonrun::server
