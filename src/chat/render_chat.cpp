// Chat format selection and dispatch.
#include "chat/render_chat.h"

#include <filesystem>
#include <fstream>
#include <sstream>

#include "chat/render_k2.h"
#include "chat/render_k3.h"
#include "model/families.h"

namespace moonrun::chat {
namespace {

Result<Json> read_json_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return not_found(path.string() + ": cannot open");
  std::stringstream ss;
  ss << in.rdbuf();
  try {
    return Json::parse(ss.str());
  } catch (const nlohmann::json::exception& e) {
    return invalid_argument(path.string() + ": invalid JSON: " + e.what());
  }
}

}  // namespace

const char* chat_format_name(ChatFormat format) {
  return format == ChatFormat::kKimiK3 ? "kimi_k3" : "kimi_k2";
}

Result<ChatFormat> chat_format_from_name(const std::string& name) {
  if (name == "kimi_k3") return ChatFormat::kKimiK3;
  if (name == "kimi_k2") return ChatFormat::kKimiK2;
  return invalid_argument("--format: unknown chat format '" + name + "' (kimi_k3, kimi_k2)");
}

Result<ChatFormat> chat_format_for_checkpoint(const std::string& model_dir) {
  namespace fs = std::filesystem;
  const fs::path dir(model_dir);
  if (!fs::is_directory(dir)) return not_found(model_dir + ": not a directory");
  const fs::path config = dir / "config.json";
  if (fs::exists(config)) {
    Json cfg = MR_TRY(read_json_file(config));
    // The family table (model/families.h) names each family's chat format.
    const bool names_a_model = cfg.is_object() && (cfg.contains("model_type") || !architecture_of(cfg).empty());
    if (names_a_model) {
      auto family = find_model_family(cfg, config.string());
      if (!family)
        return failed_precondition(family.status().message() + "; so it has no known Kimi chat format");
      return chat_format_from_name((*family)->chat_format);
    }
  }
  const fs::path tok_config = dir / "tokenizer_config.json";
  if (fs::exists(tok_config)) {
    Json tc = MR_TRY(read_json_file(tok_config));
    if (tc.is_object() && tc.contains("chat_template")) return ChatFormat::kKimiK2;
    return ChatFormat::kKimiK3;  // K3 ships its format as code, not as a template
  }
  return not_found(model_dir + ": neither config.json (model_type) nor tokenizer_config.json says which chat format to use");
}

Result<std::vector<Segment>> render_chat(ChatFormat format, const ChatRequest& request, const RenderOptions& options) {
  return format == ChatFormat::kKimiK3 ? render_k3(request, options) : render_k2(request, options);
}

std::string join_segments(const std::vector<Segment>& segments) {
  size_t n = 0;
  for (const auto& s : segments) n += s.text.size();
  std::string out;
  out.reserve(n);
  for (const auto& s : segments) out += s.text;
  return out;
}

}  // namespace moonrun::chat
