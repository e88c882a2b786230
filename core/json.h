// JSON for safetensors headers, on top of nlohmann/json (Debian's nlohmann-json3-dev,
// header-only, included by json.cpp alone so that tapegrad's installed headers do not
// need it). The header is untrusted input, so the parse is stricter than the library's
// default: nesting is limited, duplicate keys are errors, every error and every value
// carries its byte offset, and numbers keep their literal text so that sizes are read as
// exact integers (never through a double).
//
// Two forms: a streaming parse into a Handler (linear in the text, memory bounded by what
// the handler keeps: what safetensors uses) and a small document tree (Value) for tests
// and small documents.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace tg::json {

// Nesting deeper than this is an error: no real header needs it (safetensors nests three
// levels) and handlers or trees built by recursion would otherwise grow without bound.
constexpr int kMaxDepth = 64;

struct Value {
  enum class Kind { null, boolean, number, string, array, object };
  Kind kind = Kind::null;
  bool boolean = false;
  std::string text;  // a string's decoded value, or a number's literal as written
  std::vector<Value> items;                            // array elements
  std::vector<std::pair<std::string, Value>> members;  // object members, in file order
  std::size_t offset = 0;  // byte offset of the value's first character (plus the parse's base)

  bool is_object() const { return kind == Kind::object; }
  bool is_array() const { return kind == Kind::array; }
  bool is_string() const { return kind == Kind::string; }
  bool is_number() const { return kind == Kind::number; }
  // The member named `key`, or nullptr (a linear scan: for small objects).
  const Value* find(std::string_view key) const;
  // A number that is a non-negative integer (no sign, fraction or exponent) that fits in
  // int64; throws tg::Error naming `what` and the offset (+ `base`) otherwise.
  int64_t as_size(const char* what, std::size_t base = 0) const;
};

const char* kind_name(Value::Kind k);

// The events of a streaming parse, in document order. Offsets are the byte offset of the
// value's (or key's) first character plus the parse's `base`. Keys arrive already checked
// for duplicates within their object; nesting is already limited to kMaxDepth. A handler
// rejects what it does not expect by throwing tg::Error, which ends the parse.
class Handler {
 public:
  virtual ~Handler() = default;
  virtual void begin_object(std::size_t at) = 0;
  virtual void key(std::string&& name, std::size_t at) = 0;
  virtual void end_object() = 0;
  virtual void begin_array(std::size_t at) = 0;
  virtual void end_array() = 0;
  // null, boolean, number (text: the literal as written) or string (text: decoded UTF-8).
  virtual void scalar(Value&& v) = 0;
};

// Parses one JSON value that spans all of `text` (surrounding whitespace allowed). Throws
// tg::Error "json: <problem> at byte N", N = `base` + the offset in `text`, so that a
// caller parsing a slice of a file reports file offsets. Strings must be valid UTF-8.
void parse(std::string_view text, Handler& handler, std::size_t base = 0);
Value parse(std::string_view text, std::size_t base = 0);

// Whether `s` is well-formed UTF-8 as JSON requires (RFC 3629: no overlong forms, no
// surrogates, nothing past U+10FFFF); if not and `bad` is given, the offset of the first
// byte of the first ill-formed sequence.
bool valid_utf8(std::string_view s, std::size_t* bad = nullptr);
// `s` with each byte that starts no well-formed UTF-8 sequence replaced by U+FFFD, for text
// that must be written whatever it holds (op names in a trace).
std::string with_replacement_characters(std::string_view s);

// `s` for an error message: control and non-ASCII bytes as \xNN, cut after `max` bytes
// (a hostile header may hold a 100 MB string).
std::string printable(std::string_view s, std::size_t max = 200);

// `s` as a JSON string literal, quotes included (control characters escaped; other bytes,
// UTF-8 included, written as they are). Callers check valid_utf8 first: the parser refuses
// ill-formed UTF-8, so writing it would make an unreadable file.
std::string quote(std::string_view s);

}  // namespace tg::json
