#pragma once
// Everything a request handler needs, built once by `moonrun serve` and shared read-only by
// the HTTP threads (the engine loop and the metrics are thread-safe themselves).
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "chat/render_chat.h"
#include "chat/tokenizer.h"
#include "engine/engine_loop.h"
#include "server/metrics.h"
#include "server/image_input.h"
#include "server/response_store.h"
#include "server/serve_options.h"

namespace moonrun::server {

struct ServingContext {
  ServeOptions options;
  std::string served_model_name;     // what /v1/models lists
  // Every name a request's "model" may use: the served name, the other --served-model-name
  // values, the model path as given and its last component (vLLM answers to the path too).
  std::vector<std::string> model_names;
  int64_t max_model_len = 0;         // prompt + completion tokens
  int64_t created_unix_s = 0;        // /v1/models "created"
  chat::ChatFormat chat_format = chat::ChatFormat::kKimiK3;
  std::shared_ptr<const chat::Tokenizer> tokenizer;
  EngineLoop* engine = nullptr;
  // Images on chat requests (server/image_input.h); null when the model has no vision
  // tower: an image part is then a 400.
  std::shared_ptr<const ImageInputConfig> images;
  Metrics* metrics = nullptr;
  // /v1/responses' recent responses (previous_response_id, item_reference); thread-safe
  // itself. Null: nothing is stored, and references to stored items are 400s.
  std::shared_ptr<ResponseStore> responses;
};

}  // namespace moonrun::server
