// The boolean fields of every route, checked before any handler reads the body: the walk
// over nested objects and arrays, what passes (true, false, null, absent, a container that
// is not there) and what is a 400 naming the field with its indices.
#include <gtest/gtest.h>

#include "server/request_json.h"

namespace moonrun::server {
namespace {

using nlohmann::json;

// The body that sets the field at `path` (dots and "[]" as boolean_fields() spells them) to
// `value`, every array holding two elements with the value in the second.
json body_with(const std::string& path, const json& value) {
  json body = json::object();
  json* at = &body;
  size_t from = 0;
  for (;;) {
    const size_t dot = path.find('.', from);
    std::string key = path.substr(from, dot == std::string::npos ? std::string::npos : dot - from);
    const bool each = key.size() > 2 && key.compare(key.size() - 2, 2, "[]") == 0;
    if (each) key.resize(key.size() - 2);
    if (dot == std::string::npos) {
      (*at)[key] = value;
      return body;
    }
    if (each) {
      (*at)[key] = json::array({json::object(), json::object()});
      at = &(*at)[key][1];
    } else {
      at = &(*at)[key];
      *at = json::object();
    }
    from = dot + 1;
  }
}

std::string with_indices(const std::string& path) {
  std::string out;
  for (size_t i = 0; i < path.size(); ++i)
    if (path.compare(i, 2, "[]") == 0) out += "[1]", ++i;
    else out += path[i];
  return out;
}

TEST(RequestBooleans, EveryRoutesFieldsRefuseWhatIsNotABoolean) {
  for (const char* route : {"/v1/chat/completions", "/v1/completions", "/v1/responses", "/v1/messages", "/tokenize"}) {
    ASSERT_FALSE(boolean_fields(route).empty()) << route;
    for (const std::string& path : boolean_fields(route)) {
      SCOPED_TRACE(std::string(route) + " " + path);
      for (const json& bad : {json("yes"), json("true"), json(1), json(0), json::object(), json::array()}) {
        auto e = check_boolean_fields(body_with(path, bad), route);
        ASSERT_TRUE(e.has_value()) << bad.dump();
        EXPECT_EQ(e->field, with_indices(path));
        EXPECT_EQ(e->message.rfind(with_indices(path) + ": expected true or false, got ", 0), 0u) << e->message;
      }
      for (const json& good : {json(true), json(false), json(nullptr)})
        EXPECT_FALSE(check_boolean_fields(body_with(path, good), route).has_value()) << good.dump();
    }
  }
}

TEST(RequestBooleans, ContainersThatAreNotThereAreTheRoutesToName) {
  // A tools that is not an array, a stream_options that is not an object: those checks
  // belong to the route (its message names the container); nothing here to refuse.
  EXPECT_FALSE(check_boolean_fields({{"tools", "x"}}, "/v1/chat/completions").has_value());
  EXPECT_FALSE(check_boolean_fields({{"stream_options", 3}}, "/v1/chat/completions").has_value());
  EXPECT_FALSE(check_boolean_fields({{"tools", json::array({1, json::object()})}}, "/v1/chat/completions"));
  EXPECT_FALSE(check_boolean_fields({{"stream", "yes"}}, "/detokenize").has_value());
  EXPECT_FALSE(check_boolean_fields({{"stream", "yes"}}, "/no/such/route").has_value());
}

TEST(RequestBooleans, TheFirstWrongFieldIsNamed) {
  const json body = {{"stream", true}, {"echo", "yes"}, {"ignore_eos", 1}};
  auto e = check_boolean_fields(body, "/v1/completions");
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->field, "echo");
  EXPECT_EQ(e->message, "echo: expected true or false, got string");
}

}  // namespace
}  // namespace moonrun::server
