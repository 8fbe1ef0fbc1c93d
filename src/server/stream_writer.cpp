#include "server/stream_writer.h"

#include <httplib.h>

#include "common/log.h"
#include "server/openai_error.h"

namespace moonrun::server {

void stream_generation(httplib::Response& res, std::shared_ptr<Generation> generation,
                       StreamHandlers handlers) {
  struct State {
    std::shared_ptr<Generation> gen;
    StreamHandlers h;
    bool sent_first = false;
    bool finished = false;
  };
  auto state = std::make_shared<State>();
  state->gen = std::move(generation);
  state->h = std::move(handlers);
  res.set_header("Cache-Control", "no-cache");
  res.set_header("X-Accel-Buffering", "no");
  res.set_chunked_content_provider(
      "text/event-stream",
      [state](size_t, httplib::DataSink& sink) -> bool {
        auto write = [&](const std::string& s) { return s.empty() || sink.write(s.data(), s.size()); };
        if (!state->sent_first) {
          state->sent_first = true;
          if (!write(state->h.first)) {
            state->gen->abort();
            return false;
          }
        }
        // Drain what is ready; wait a little when nothing is, so the thread is not spinning.
        RequestOutput out;
        bool got = state->gen->next(out, std::chrono::milliseconds(50));
        while (got) {
          if (out.finished && !out.error.is_ok()) {
            write(state->h.on_error(out.error));
            if (state->h.done_marker) write("data: [DONE]\n\n");
            state->finished = true;
            sink.done();
            return true;
          }
          if (!write(state->h.on_output(out))) {
            MR_LOG(INFO) << "client disconnected; aborting its request";
            state->gen->abort();
            return false;
          }
          got = state->gen->next(out, std::chrono::milliseconds(0));
        }
        if (state->gen->done()) {
          write(state->h.on_done());
          if (state->h.done_marker) write("data: [DONE]\n\n");
          state->finished = true;
          sink.done();
          return true;
        }
        if (sink.is_writable && !sink.is_writable()) {
          MR_LOG(INFO) << "client disconnected; aborting its request";
          state->gen->abort();
          return false;
        }
        return true;
      },
      [state](bool success) {
        // Called when the response ends, whatever the reason: free the engine's resources
        // if the stream did not finish (a dead client).
        if (!state->finished) state->gen->abort();
      });
}

}  // namespace moonrun::server
