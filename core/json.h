// A small JSON reader and string quoter, enough for safetensors headers. No dependency:
// the header is untrusted input (a truncated or corrupt file), so the parser checks every
// byte, limits nesting, rejects duplicate keys and reports the byte offset of each error.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace tg::json {

struct Value {
  enum class Kind { null, boolean, number, string, array, object };
  Kind kind = Kind::null;
  bool boolean = false;
  std::string text;  // a string's decoded value, or a number's literal as written
  std::vector<Value> items;                            // array elements
  std::vector<std::pair<std::string, Value>> members;  // object members, in file order
  std::size_t offset = 0;  // byte offset of the value's first character in the parsed text

  bool is_object() const { return kind == Kind::object; }
  bool is_array() const { return kind == Kind::array; }
  bool is_string() const { return kind == Kind::string; }
  bool is_number() const { return kind == Kind::number; }
  // The member named `key`, or nullptr.
  const Value* find(std::string_view key) const;
  // A number that is a non-negative integer (no fraction, no exponent) that fits in int64;
  // throws tg::Error naming `what` and the offset (+ `base`, for file offsets) otherwise.
  int64_t as_size(const char* what, std::size_t base = 0) const;
};

const char* kind_name(Value::Kind k);

// Parses one JSON value that spans all of `text` (trailing whitespace allowed). Throws
// tg::Error "json: <problem> at byte N" where N = `base` + the offset in `text`, so a caller
// that parses a slice of a file can report file offsets.
Value parse(std::string_view text, std::size_t base = 0);

// `s` as a JSON string literal, quotes included (control characters escaped; other bytes,
// UTF-8 included, written as they are).
std::string quote(std::string_view s);

}  // namespace tg::json
