#pragma once
// The recent responses of /v1/responses, kept so that later requests can build on them as
// OpenAI's API allows: `previous_response_id` continues a stored response's conversation,
// and `item_reference` input items name earlier items by id (the Vercel AI SDK's Responses
// provider sends its previous reasoning and message items that way by default, with
// `store` left at its default, true).
//
// Bounded, least recently used out first: at most kMaxResponses responses and kMaxBytes of
// JSON in all, so a server that is never asked to forget still holds a fixed amount. A
// response stored with store: false is not kept; nothing is written to disk, and a restart
// forgets everything (a reference to a forgotten item is a 400 that says so).
#include <cstddef>
#include <list>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>

#include "chat/render_json.h"

namespace moonrun::server {

class ResponseStore {
 public:
  static constexpr size_t kMaxResponses = 1024;
  static constexpr size_t kMaxBytes = size_t{64} << 20;

  explicit ResponseStore(size_t max_responses = kMaxResponses, size_t max_bytes = kMaxBytes);

  // Keeps a response: the conversation it answered (its input items, previous responses'
  // items first) and its output items. Items with an "id" become referable by it.
  void put(const std::string& response_id, chat::Json input_items, chat::Json output_items);

  // The conversation a follow-up continues: the stored input items, then the output items.
  std::optional<chat::Json> conversation(const std::string& response_id);
  // One stored item by its id (the latest response that holds it).
  std::optional<chat::Json> item(const std::string& item_id);

  size_t size() const;
  size_t bytes() const;

 private:
  struct Entry {
    std::string id;
    chat::Json input, output;
    size_t bytes = 0;
  };
  void evict_locked();
  void forget_locked(std::list<Entry>::iterator it);

  const size_t max_responses_, max_bytes_;
  mutable std::mutex mu_;
  std::list<Entry> lru_;  // most recently used first
  std::unordered_map<std::string, std::list<Entry>::iterator> by_id_;
  // item id -> the entry holding it; an item id seen again points at the newer entry.
  std::unordered_map<std::string, std::list<Entry>::iterator> by_item_;
  size_t bytes_ = 0;
};

}  // namespace moonrun::server
