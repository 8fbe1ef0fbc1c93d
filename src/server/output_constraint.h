#pragma once
// Structured output on the engine: a chat request's completion grammar (chat/
// output_grammar.h) as the engine's per-sequence TokenConstraint factory.
//
// Grammars and their mask caches are shared between requests that constrain the same way
// (same format, schema, tools, choice): the second request with a schema starts with the
// masks the first one computed.
#include <functional>
#include <memory>

#include "chat/chat_request.h"
#include "common/status.h"
#include "runtime/token_constraint.h"
#include "server/serving_context.h"

namespace moonrun::server {

using ConstraintFactory = std::function<std::unique_ptr<TokenConstraint>()>;

// An empty factory when the request constrains nothing. max_tokens: the generation's
// token budget (the constraint closes the output within it); a budget too small for the
// shortest valid output is a 400.
Result<ConstraintFactory> output_constraint(const ServingContext& ctx, const chat::ChatRequest& request,
                                            int max_tokens);

}  // namespace moonrun::server
