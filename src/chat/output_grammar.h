#pragma once
// The completion a chat request allows, as a grammar over what the model generates after
// the prompt: the chat format's markup (K3 channels, K2 sections) around what must hold
// there. Built when the request asks for more than the prompt can promise:
//   response_format json_object / json_schema  the response is one JSON value of the
//                                               schema (any object for json_object);
//   tool_choice "required" / a named function   a tool call (of that function), its
//                                               arguments valid against the tool's
//                                               parameters schema;
//   parallel_tool_calls false                   at most one call (exactly one with required).
// Reasoning and free text stay free (any ordinary token); special tokens appear only where
// the format puts them. A request that needs none of this gets no grammar.
//
// Errors are 400s that name the part of the request that cannot be compiled:
//   "response_format.json_schema.schema.properties.tags.uniqueItems: not supported".
#include <memory>

#include "chat/chat_request.h"
#include "chat/render_chat.h"
#include "chat/tokenizer.h"
#include "common/status.h"
#include "grammar/grammar.h"
#include "grammar/vocab.h"

namespace moonrun::chat {

// nullptr: nothing to constrain.
Result<std::shared_ptr<const grammar::Grammar>> output_grammar(ChatFormat format, const ChatRequest& request,
                                                               const Tokenizer& tokenizer);

// The tokenizer's vocabulary as the token masks need it (ordinary tokens' bytes, which ids
// are special); eos: the ids that end a generation.
std::shared_ptr<const grammar::TokenVocab> token_vocab(const Tokenizer& tokenizer, std::vector<int32_t> eos);

// A key naming what output_grammar() depends on in a request (equal keys give equal
// grammars), so compiled grammars and their mask caches can be shared between requests.
std::string output_grammar_key(ChatFormat format, const ChatRequest& request);

}  // namespace moonrun::chat
