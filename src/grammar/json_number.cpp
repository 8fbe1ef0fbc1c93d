// JSON numbers: the unbounded number and integer grammars, and integer ranges from the
// schema bounds (minimum, maximum, exclusive ones) spelled digit by digit.
#include <cmath>

#include "grammar/json_schema.h"

namespace moonrun::grammar {
namespace {

using Frag = Builder::Frag;

constexpr int kMaxDigits = 16;         // integer (and fraction) digits of an unbounded number
constexpr int kMaxExponentDigits = 2;  // e-99 .. e+99

std::string digits_of(uint64_t v) { return std::to_string(v); }

}  // namespace

Frag JsonGrammar::number_any(bool integer) {
  SymbolSet digit, nonzero;
  for (char c = '0'; c <= '9'; ++c) digit.set(static_cast<unsigned char>(c));
  nonzero = digit;
  nonzero.reset('0');
  auto digits = [&](int min, int max) { return b_.repeat([&] { return b_.symbols(digit); }, min, max); };
  std::vector<Frag> parts;
  parts.push_back(b_.opt(b_.literal("-")));
  parts.push_back(b_.alt({b_.literal("0"), b_.seq({b_.symbols(nonzero), digits(0, kMaxDigits - 1)})}));
  if (!integer) {
    parts.push_back(b_.opt(b_.seq({b_.literal("."), digits(1, kMaxDigits)})));
    SymbolSet e, sign;
    e.set('e');
    e.set('E');
    sign.set('+');
    sign.set('-');
    // Two exponent digits: with 16 integer digits the largest number is ~1e115, the smallest
    // non-zero ~1e-115, so every accepted text is a finite double. Three allowed 1e999, which
    // JavaScript's JSON.parse reads as Infinity and a schema validator (ajv) rejects as not
    // a number (seen at temperature 1 on the GPU, where sampling wandered into it).
    parts.push_back(b_.opt(b_.seq({b_.symbols(e), b_.opt(b_.symbols(sign)), digits(1, kMaxExponentDigits)})));
  }
  return b_.seq(std::move(parts));
}

namespace {

// Decimal text of every integer in [lo, hi] (same number of digits), as alternatives of
// digit ranges: the usual range-to-regex split on the first differing digit.
Frag same_length_range(Builder& b, const std::string& lo, const std::string& hi) {
  if (lo.empty()) return b.empty();
  // Every string of this length: plain digits (without this the split below recurses into
  // both of its ends and grows exponentially with the length).
  if (lo.find_first_not_of('0') == std::string::npos && hi.find_first_not_of('9') == std::string::npos) {
    std::vector<Frag> digits;
    for (size_t k = 0; k < lo.size(); ++k) digits.push_back(b.byte_range('0', '9'));
    return b.seq(std::move(digits));
  }
  if (lo.size() == 1) return b.byte_range(static_cast<uint8_t>(lo[0]), static_cast<uint8_t>(hi[0]));
  if (lo[0] == hi[0]) return b.seq({b.literal(lo.substr(0, 1)), same_length_range(b, lo.substr(1), hi.substr(1))});
  const size_t rest = lo.size() - 1;
  std::vector<Frag> options;
  options.push_back(b.seq({b.literal(lo.substr(0, 1)), same_length_range(b, lo.substr(1), std::string(rest, '9'))}));
  if (lo[0] + 1 <= hi[0] - 1) {
    std::vector<Frag> parts{b.byte_range(static_cast<uint8_t>(lo[0] + 1), static_cast<uint8_t>(hi[0] - 1))};
    for (size_t k = 0; k < rest; ++k) parts.push_back(b.byte_range('0', '9'));
    options.push_back(b.seq(std::move(parts)));
  }
  options.push_back(b.seq({b.literal(hi.substr(0, 1)), same_length_range(b, std::string(rest, '0'), hi.substr(1))}));
  return b.alt(std::move(options));
}

// Every non-negative integer in [lo, hi] without leading zeros; unbounded: hi_inf.
Frag unsigned_range(Builder& b, uint64_t lo, uint64_t hi, bool hi_inf) {
  const std::string a = digits_of(lo);
  const size_t max_len = hi_inf ? static_cast<size_t>(kMaxDigits) : digits_of(hi).size();
  std::vector<Frag> options;
  for (size_t len = a.size(); len <= std::max(max_len, a.size()); ++len) {
    std::string from = len == a.size() ? a : "1" + std::string(len - 1, '0');
    if (len == 1 && lo == 0) from = "0";
    std::string to = std::string(len, '9');
    if (!hi_inf && len == digits_of(hi).size()) to = digits_of(hi);
    if (!hi_inf && len > digits_of(hi).size()) break;
    if (from.size() == to.size() && from <= to) options.push_back(same_length_range(b, from, to));
  }
  return options.size() == 1 ? options[0] : b.alt(std::move(options));
}

}  // namespace

Result<Frag> JsonGrammar::number(const Json& schema, const Ctx& ctx, bool integer) {
  if (auto it = schema.find("multipleOf"); it != schema.end()) {
    if (!(it->is_number() && it->get<double>() == 1.0 && integer))
      return invalid_argument(ctx.path + ".multipleOf: not supported");
  }
  // Bounds as a closed integer interval [lo, hi] (numbers with bounds are generated as
  // integers: every integer in range satisfies the bounds).
  double lo = -INFINITY, hi = INFINITY;
  bool bounded = false;
  for (const char* key : {"minimum", "exclusiveMinimum", "maximum", "exclusiveMaximum"}) {
    auto it = schema.find(key);
    if (it == schema.end()) continue;
    if (!it->is_number()) return invalid_argument(ctx.path + "." + key + ": expected a number");
    bounded = true;
    const double v = it->get<double>();
    const std::string k = key;
    if (k == "minimum") lo = std::max(lo, std::ceil(v));
    if (k == "exclusiveMinimum") lo = std::max(lo, std::floor(v) + 1);
    if (k == "maximum") hi = std::min(hi, std::floor(v));
    if (k == "exclusiveMaximum") hi = std::min(hi, std::ceil(v) - 1);
  }
  if (!bounded) return number_any(integer);
  // A minimum below -1e15 or a maximum above 1e15 (zod's .int() writes +-(2^53 - 1), the
  // safe-integer range) is pulled in to +-1e15: the range only narrows, so every number
  // generated still satisfies the schema. A bound that would have to widen is refused.
  const double limit = 1e15;
  if (lo < -limit) lo = -limit;
  if (hi > limit) hi = limit;
  if (lo > limit || hi < -limit) return invalid_argument(ctx.path + ": bounds beyond 1e15 are not supported");
  if (lo > hi) return invalid_argument(ctx.path + ": no " + std::string(integer ? "integer" : "whole number") + " lies within the bounds");
  std::vector<Frag> options;
  if (lo < 0) {  // the negative part: "-" and the magnitudes [max(1,-hi), -lo]
    const uint64_t mag_lo = hi < 0 ? static_cast<uint64_t>(-hi) : 1;
    const bool mag_inf = !std::isfinite(lo);
    const uint64_t mag_hi = mag_inf ? 0 : static_cast<uint64_t>(-lo);
    if (mag_inf || mag_lo <= mag_hi) options.push_back(b_.seq({b_.literal("-"), unsigned_range(b_, mag_lo, mag_hi, mag_inf)}));
  }
  if (hi >= 0) {
    const uint64_t from = lo > 0 ? static_cast<uint64_t>(lo) : 0;
    const bool inf = !std::isfinite(hi);
    options.push_back(unsigned_range(b_, from, inf ? 0 : static_cast<uint64_t>(hi), inf));
  }
  return options.size() == 1 ? options[0] : b_.alt(std::move(options));
}

}  // namespace moonrun::grammar
