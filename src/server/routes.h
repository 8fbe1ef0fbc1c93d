#pragma once
// What a request gets, once read whole: CORS, auth, then the route. Runs on a worker thread.
//   - OPTIONS (a CORS preflight) is answered without a key, as vLLM and SGLang do;
//   - /health and /metrics are open unless --protect-metrics (Prometheus scrapers and load
//     balancers carry no key); every other route needs one of the keys when keys are set;
//   - keys are compared in constant time.
#include "server/http_types.h"
#include "server/serving_context.h"

namespace moonrun::server {

// draining: SIGTERM was received; generation routes answer 503 and /health 503.
void route_request(const ServingContext& ctx, const HttpRequest& req, HttpResponse& res, bool draining);

// Whether `name` is one the served model answers to (ctx.model_names; "" always is).
bool model_name_matches(const ServingContext& ctx, const std::string& name);

}  // namespace moonrun::server
