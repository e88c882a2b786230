#include "core/json.h"

#include <limits>

#include "core/error.h"

namespace tg::json {
namespace {

// Deep enough for any real header (safetensors nests 3 levels); stops a hostile file from
// overflowing the stack through recursion.
constexpr int kMaxDepth = 64;

class Parser {
 public:
  Parser(std::string_view text, std::size_t base) : s_(text), base_(base) {}

  Value parse_document() {
    skip_space();
    Value v = parse_value(0);
    skip_space();
    if (pos_ != s_.size()) fail("unexpected '", printable(s_[pos_]), "' after the end of the value");
    return v;
  }

 private:
  template <class... Args>
  [[noreturn]] void fail(const Args&... args) const {
    fail_at(pos_, args...);
  }
  template <class... Args>
  [[noreturn]] void fail_at(std::size_t at, const Args&... args) const {
    TG_FAIL("json: ", args..., " at byte ", base_ + at);
  }
  static std::string printable(char c) {
    unsigned char u = static_cast<unsigned char>(c);
    if (u >= 0x20 && u < 0x7f) return std::string(1, c);
    static const char* hex = "0123456789abcdef";
    return std::string("\\x") + hex[u >> 4] + hex[u & 15];
  }

  bool at_end() const { return pos_ >= s_.size(); }
  char peek() const { return s_[pos_]; }

  void skip_space() {
    while (!at_end() && (peek() == ' ' || peek() == '\t' || peek() == '\n' || peek() == '\r')) ++pos_;
  }

  void expect(char c, const char* context) {
    if (at_end()) fail("unexpected end of input, expected '", c, "' ", context);
    if (peek() != c) fail("expected '", c, "' ", context, ", found '", printable(peek()), "'");
    ++pos_;
  }

  Value parse_value(int depth) {
    if (depth > kMaxDepth) fail("nesting deeper than ", kMaxDepth, " levels");
    if (at_end()) fail("unexpected end of input, expected a value");
    Value v;
    v.offset = pos_;
    char c = peek();
    if (c == '{') {
      parse_object(v, depth);
    } else if (c == '[') {
      parse_array(v, depth);
    } else if (c == '"') {
      v.kind = Value::Kind::string;
      v.text = parse_string();
    } else if (c == '-' || (c >= '0' && c <= '9')) {
      v.kind = Value::Kind::number;
      v.text = parse_number();
    } else if (match_word("true")) {
      v.kind = Value::Kind::boolean;
      v.boolean = true;
    } else if (match_word("false")) {
      v.kind = Value::Kind::boolean;
    } else if (match_word("null")) {
      v.kind = Value::Kind::null;
    } else {
      fail("unexpected '", printable(c), "', expected a value");
    }
    return v;
  }

  bool match_word(std::string_view w) {
    if (s_.substr(pos_, w.size()) != w) return false;
    pos_ += w.size();
    return true;
  }

  void parse_object(Value& v, int depth) {
    v.kind = Value::Kind::object;
    ++pos_;  // '{'
    skip_space();
    if (!at_end() && peek() == '}') {
      ++pos_;
      return;
    }
    while (true) {
      skip_space();
      if (at_end()) fail("unexpected end of input inside an object");
      if (peek() != '"') fail("expected a string key, found '", printable(peek()), "'");
      std::size_t key_at = pos_;
      std::string key = parse_string();
      for (const auto& [k, unused] : v.members)
        if (k == key) fail_at(key_at, "duplicate key \"", key, "\"");
      skip_space();
      expect(':', "after an object key");
      skip_space();
      Value member = parse_value(depth + 1);
      v.members.emplace_back(std::move(key), std::move(member));
      skip_space();
      if (at_end()) fail("unexpected end of input inside an object");
      if (peek() == ',') {
        ++pos_;
        continue;
      }
      expect('}', "or ',' in an object");
      return;
    }
  }

  void parse_array(Value& v, int depth) {
    v.kind = Value::Kind::array;
    ++pos_;  // '['
    skip_space();
    if (!at_end() && peek() == ']') {
      ++pos_;
      return;
    }
    while (true) {
      skip_space();
      v.items.push_back(parse_value(depth + 1));
      skip_space();
      if (at_end()) fail("unexpected end of input inside an array");
      if (peek() == ',') {
        ++pos_;
        continue;
      }
      expect(']', "or ',' in an array");
      return;
    }
  }

  std::string parse_number() {
    std::size_t start = pos_;
    if (peek() == '-') ++pos_;
    if (at_end() || !is_digit(peek())) fail("a number needs digits");
    if (peek() == '0') {
      ++pos_;  // JSON forbids leading zeros: "0" alone, or "0.5"
    } else {
      while (!at_end() && is_digit(peek())) ++pos_;
    }
    if (!at_end() && peek() == '.') {
      ++pos_;
      if (at_end() || !is_digit(peek())) fail("a fraction needs digits");
      while (!at_end() && is_digit(peek())) ++pos_;
    }
    if (!at_end() && (peek() == 'e' || peek() == 'E')) {
      ++pos_;
      if (!at_end() && (peek() == '+' || peek() == '-')) ++pos_;
      if (at_end() || !is_digit(peek())) fail("an exponent needs digits");
      while (!at_end() && is_digit(peek())) ++pos_;
    }
    return std::string(s_.substr(start, pos_ - start));
  }
  static bool is_digit(char c) { return c >= '0' && c <= '9'; }

  unsigned read_hex4() {
    if (s_.size() - pos_ < 4) fail("truncated \\u escape");
    unsigned v = 0;
    for (int i = 0; i < 4; ++i) {
      char c = s_[pos_++];
      v <<= 4;
      if (c >= '0' && c <= '9') v |= static_cast<unsigned>(c - '0');
      else if (c >= 'a' && c <= 'f') v |= static_cast<unsigned>(c - 'a' + 10);
      else if (c >= 'A' && c <= 'F') v |= static_cast<unsigned>(c - 'A' + 10);
      else fail_at(pos_ - 1, "invalid hex digit '", printable(c), "' in a \\u escape");
    }
    return v;
  }

  static void append_utf8(std::string& out, unsigned cp) {
    if (cp < 0x80) {
      out += static_cast<char>(cp);
    } else if (cp < 0x800) {
      out += static_cast<char>(0xC0 | (cp >> 6));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
      out += static_cast<char>(0xE0 | (cp >> 12));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    } else {
      out += static_cast<char>(0xF0 | (cp >> 18));
      out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    }
  }

  std::string parse_string() {
    std::size_t start = pos_;
    ++pos_;  // opening quote
    std::string out;
    while (true) {
      if (at_end()) fail_at(start, "unterminated string");
      char c = s_[pos_];
      if (c == '"') {
        ++pos_;
        return out;
      }
      if (static_cast<unsigned char>(c) < 0x20) fail("control character ", printable(c), " inside a string");
      if (c != '\\') {
        out += c;
        ++pos_;
        continue;
      }
      ++pos_;
      if (at_end()) fail_at(start, "unterminated string");
      char e = s_[pos_++];
      switch (e) {
        case '"': out += '"'; break;
        case '\\': out += '\\'; break;
        case '/': out += '/'; break;
        case 'b': out += '\b'; break;
        case 'f': out += '\f'; break;
        case 'n': out += '\n'; break;
        case 'r': out += '\r'; break;
        case 't': out += '\t'; break;
        case 'u': {
          unsigned cp = read_hex4();
          if (cp >= 0xD800 && cp <= 0xDBFF) {  // a surrogate pair encodes one code point
            if (s_.substr(pos_, 2) != "\\u") fail("unpaired UTF-16 surrogate in a \\u escape");
            pos_ += 2;
            unsigned low = read_hex4();
            if (low < 0xDC00 || low > 0xDFFF) fail("unpaired UTF-16 surrogate in a \\u escape");
            cp = 0x10000 + ((cp - 0xD800) << 10) + (low - 0xDC00);
          } else if (cp >= 0xDC00 && cp <= 0xDFFF) {
            fail("unpaired UTF-16 surrogate in a \\u escape");
          }
          append_utf8(out, cp);
          break;
        }
        default: fail_at(pos_ - 1, "invalid escape '\\", printable(e), "'");
      }
    }
  }

  std::string_view s_;
  std::size_t base_;
  std::size_t pos_ = 0;
};

}  // namespace

const char* kind_name(Value::Kind k) {
  switch (k) {
    case Value::Kind::null: return "null";
    case Value::Kind::boolean: return "a boolean";
    case Value::Kind::number: return "a number";
    case Value::Kind::string: return "a string";
    case Value::Kind::array: return "an array";
    default: return "an object";
  }
}

const Value* Value::find(std::string_view key) const {
  for (const auto& [k, v] : members)
    if (k == key) return &v;
  return nullptr;
}

int64_t Value::as_size(const char* what, std::size_t base) const {
  TG_CHECK(kind == Kind::number, "json: ", what, " must be a number, found ", kind_name(kind), " at byte ",
           base + offset);
  TG_CHECK(!text.empty() && text[0] != '-' && text.find_first_of(".eE") == std::string::npos, "json: ", what,
           " must be a non-negative integer, found ", text, " at byte ", base + offset);
  // Accumulate with an overflow check: a corrupt header may hold any number of digits.
  int64_t v = 0;
  for (char c : text) {
    int digit = c - '0';
    TG_CHECK(v <= (std::numeric_limits<int64_t>::max() - digit) / 10, "json: ", what, " ", text,
             " does not fit in 64 bits at byte ", base + offset);
    v = v * 10 + digit;
  }
  return v;
}

Value parse(std::string_view text, std::size_t base) { return Parser(text, base).parse_document(); }

std::string quote(std::string_view s) {
  static const char* hex = "0123456789abcdef";
  std::string out = "\"";
  for (char c : s) {
    unsigned char u = static_cast<unsigned char>(c);
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      default:
        if (u < 0x20) {
          out += "\\u00";
          out += hex[u >> 4];
          out += hex[u & 15];
        } else {
          out += c;
        }
    }
  }
  out += '"';
  return out;
}

}  // namespace tg::json
