#include "server/response_store.h"

namespace moonrun::server {

using chat::Json;

namespace {
// The item with `id` in an array of items, or null.
const Json* find_item(const Json& items, const std::string& id) {
  for (const Json& it : items)
    if (it.is_object() && it.contains("id") && it["id"].is_string() && it["id"].get<std::string>() == id) return &it;
  return nullptr;
}
}  // namespace

ResponseStore::ResponseStore(size_t max_responses, size_t max_bytes)
    : max_responses_(max_responses), max_bytes_(max_bytes) {}

void ResponseStore::put(const std::string& response_id, Json input_items, Json output_items) {
  Entry e;
  e.id = response_id;
  // The serialized size stands for the memory: within a small factor of the tree's.
  e.bytes = input_items.dump().size() + output_items.dump().size() + response_id.size();
  e.input = std::move(input_items);
  e.output = std::move(output_items);
  std::lock_guard<std::mutex> lock(mu_);
  if (auto old = by_id_.find(response_id); old != by_id_.end()) forget_locked(old->second);
  if (e.bytes > max_bytes_) return;  // larger than the whole store: not kept
  lru_.push_front(std::move(e));
  auto it = lru_.begin();
  by_id_[response_id] = it;
  bytes_ += it->bytes;
  for (const Json* items : {&it->input, &it->output})
    for (const Json& item : *items)
      if (item.is_object() && item.contains("id") && item["id"].is_string()) by_item_[item["id"].get<std::string>()] = it;
  evict_locked();
}

std::optional<Json> ResponseStore::conversation(const std::string& response_id) {
  std::lock_guard<std::mutex> lock(mu_);
  auto found = by_id_.find(response_id);
  if (found == by_id_.end()) return std::nullopt;
  lru_.splice(lru_.begin(), lru_, found->second);
  Json all = found->second->input;
  for (const Json& item : found->second->output) all.push_back(item);
  return all;
}

std::optional<Json> ResponseStore::item(const std::string& item_id) {
  std::lock_guard<std::mutex> lock(mu_);
  auto found = by_item_.find(item_id);
  if (found == by_item_.end()) return std::nullopt;
  auto entry = found->second;
  lru_.splice(lru_.begin(), lru_, entry);
  // The newest copy: the output wins over an input that echoed it.
  if (const Json* it = find_item(entry->output, item_id)) return *it;
  if (const Json* it = find_item(entry->input, item_id)) return *it;
  return std::nullopt;
}

size_t ResponseStore::size() const {
  std::lock_guard<std::mutex> lock(mu_);
  return lru_.size();
}

size_t ResponseStore::bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return bytes_;
}

void ResponseStore::evict_locked() {
  while (!lru_.empty() && (lru_.size() > max_responses_ || bytes_ > max_bytes_)) forget_locked(std::prev(lru_.end()));
}

void ResponseStore::forget_locked(std::list<Entry>::iterator it) {
  for (const Json* items : {&it->input, &it->output})
    for (const Json& item : *items) {
      if (!item.is_object() || !item.contains("id") || !item["id"].is_string()) continue;
      auto ref = by_item_.find(item["id"].get<std::string>());
      if (ref != by_item_.end() && ref->second == it) by_item_.erase(ref);
    }
  by_id_.erase(it->id);
  bytes_ -= it->bytes;
  lru_.erase(it);
}

}  // namespace moonrun::server
