#include "core/json.h"

#include <iterator>
#include <limits>
#include <nlohmann/json.hpp>
#include <unordered_set>

#include "core/error.h"

namespace tg::json {
namespace {

// An iterator over the text that publishes how far the library has read. nlohmann's SAX
// events carry no position; the offset of each value is derived from this count, the
// token the event reports and the text itself.
class TrackingIterator {
 public:
  using iterator_category = std::input_iterator_tag;
  using value_type = char;
  using difference_type = std::ptrdiff_t;
  using pointer = const char*;
  using reference = const char&;

  TrackingIterator(const char* p, const char** read_to) : p_(p), read_to_(read_to) {}
  reference operator*() const { return *p_; }
  TrackingIterator& operator++() {
    *read_to_ = ++p_;
    return *this;
  }
  TrackingIterator operator++(int) {
    TrackingIterator old = *this;
    ++*this;
    return old;
  }
  bool operator==(const TrackingIterator& o) const { return p_ == o.p_; }

 private:
  const char* p_;
  const char** read_to_;
};

// The keys of one open object, for the duplicate check: a short list scanned while the
// object is small (the common case, cheaper than hashing), a hash set once it is large.
class KeySet {
 public:
  // False if `k` was already there.
  bool insert(const std::string& k) {
    if (many_.empty()) {
      for (const std::string& f : few_)
        if (f == k) return false;
      if (few_.size() < kFew) {
        few_.push_back(k);
        return true;
      }
      many_.insert(few_.begin(), few_.end());
      few_.clear();
    }
    return many_.insert(k).second;
  }
  void clear() {
    few_.clear();
    if (!many_.empty()) many_ = {};
  }

 private:
  static constexpr std::size_t kFew = 16;
  std::vector<std::string> few_;
  std::unordered_set<std::string> many_;
};

// nlohmann's SAX interface, forwarding to a Handler with offsets, the depth limit and the
// duplicate-key check. When an event fires the lexer has read exactly the token (objects,
// arrays, strings, true/false/null) or the token and one character after it (numbers,
// whose end is only known from the next character).
class Sax {
 public:
  using json_t = nlohmann::json;
  Sax(std::string_view text, std::size_t base, Handler& h, const char* const* read_to)
      : text_(text), base_(base), h_(h), read_to_(read_to) {}

  bool null() { return literal(Value::Kind::null, false, 4); }
  bool boolean(bool b) { return literal(Value::Kind::boolean, b, b ? 4 : 5); }
  bool number_integer(json_t::number_integer_t v) { return integer(std::to_string(v), v == 0); }
  bool number_unsigned(json_t::number_unsigned_t v) { return integer(std::to_string(v), v == 0); }
  bool number_float(json_t::number_float_t, const json_t::string_t& literal) { return number(literal); }
  bool string(json_t::string_t& s) {
    Value v;
    v.kind = Value::Kind::string;
    v.offset = base_ + string_start();
    v.text = std::move(s);
    h_.scalar(std::move(v));
    return true;
  }
  bool binary(json_t::binary_t&) { return false; }  // only binary formats (CBOR, ...) have these

  bool start_object(std::size_t) {
    enter();
    if (seen_.size() < static_cast<std::size_t>(depth_)) seen_.resize(depth_);
    seen_[depth_ - 1].clear();
    h_.begin_object(base_ + read() - 1);
    return true;
  }
  bool key(json_t::string_t& k) {
    const std::size_t at = string_start();
    if (!seen_[depth_ - 1].insert(k)) fail(at, "duplicate key \"", printable(k), "\"");
    h_.key(std::move(k), base_ + at);
    return true;
  }
  bool end_object() {
    --depth_;
    h_.end_object();
    return true;
  }
  bool start_array(std::size_t) {
    enter();
    h_.begin_array(base_ + read() - 1);
    return true;
  }
  bool end_array() {
    --depth_;
    h_.end_array();
    return true;
  }

  bool parse_error(std::size_t position, const std::string&, const nlohmann::json::exception& ex) {
    // what(): "[json.exception.parse_error.101] parse error at line 1, column 12: <message>".
    std::string_view msg = ex.what();
    const auto npos = std::string_view::npos;
    if (msg.starts_with("[") && msg.find("] ") != npos) msg.remove_prefix(msg.find("] ") + 2);
    if (msg.starts_with("parse error") && msg.find(": ") != npos) msg.remove_prefix(msg.find(": ") + 2);
    const bool utf8 = msg.find("ill-formed UTF-8") != std::string_view::npos;
    // `position` counts the characters read: the last one read is where it went wrong.
    fail(position > 0 ? position - 1 : 0, utf8 ? "a string is not valid UTF-8 (" : "", printable(msg, 300),
         utf8 ? ")" : "");
  }

 private:
  template <class... Args>
  [[noreturn]] void fail(std::size_t at, const Args&... args) const {
    TG_FAIL("json: ", args..., " at byte ", base_ + at);
  }
  std::size_t read() const { return static_cast<std::size_t>(*read_to_ - text_.data()); }

  void enter() {
    if (++depth_ > kMaxDepth) fail(read() - 1, "nesting deeper than ", kMaxDepth, " levels");
  }

  // The opening quote of the string whose closing quote was the last character read: the
  // nearest earlier '"' preceded by an even number of backslashes (inside a JSON string
  // every other '"' is escaped). Linear in the string's length.
  std::size_t string_start() const {
    std::size_t j = read() - 1;
    while (j > 0) {
      --j;
      if (text_[j] != '"') continue;
      std::size_t slashes = 0;
      while (j > slashes && text_[j - 1 - slashes] == '\\') ++slashes;
      if (slashes % 2 == 0) return j;
    }
    return 0;
  }

  bool literal(Value::Kind kind, bool b, std::size_t length) {
    Value v;
    v.kind = kind;
    v.boolean = b;
    v.offset = base_ + read() - length;
    h_.scalar(std::move(v));
    return true;
  }

  // Integer literals are canonical (no '+', no leading zero) except "-0", which the library
  // reports as 0: recover the sign from the text so that "-0" is not taken for a size.
  bool integer(std::string literal, bool zero) {
    if (zero) {
      const std::size_t end = number_end(literal);
      if (end >= 2 && text_[end - 2] == '-') literal = "-0";
    }
    return number(literal);
  }
  bool number(const std::string& literal) {
    Value v;
    v.kind = Value::Kind::number;
    v.offset = base_ + number_end(literal) - literal.size();
    v.text = literal;
    h_.scalar(std::move(v));
    return true;
  }
  // The end of a number: one before what was read, unless the number ends the text (then
  // the lexer's look-ahead read nothing).
  std::size_t number_end(const std::string& literal) const {
    const std::size_t n = read();
    if (n == text_.size() && n >= literal.size() && text_.substr(n - literal.size()) == literal) return n;
    return n - 1;
  }

  std::string_view text_;
  std::size_t base_;
  Handler& h_;
  const char* const* read_to_;
  int depth_ = 0;
  std::vector<KeySet> seen_;  // keys of each open object, by depth
};

// Builds a Value tree. Pointers into the tree stay valid: a container's vector only grows
// once the child it last received is closed.
class TreeBuilder : public Handler {
 public:
  Value root;

  void begin_object(std::size_t at) override { open(Value::Kind::object, at); }
  void key(std::string&& name, std::size_t) override { key_ = std::move(name); }
  void end_object() override { stack_.pop_back(); }
  void begin_array(std::size_t at) override { open(Value::Kind::array, at); }
  void end_array() override { stack_.pop_back(); }
  void scalar(Value&& v) override { place(std::move(v)); }

 private:
  Value& place(Value&& v) {
    if (stack_.empty()) return root = std::move(v);
    Value& top = *stack_.back();
    if (top.is_array()) return top.items.emplace_back(std::move(v));
    return top.members.emplace_back(std::move(key_), std::move(v)).second;
  }
  void open(Value::Kind kind, std::size_t at) {
    Value v;
    v.kind = kind;
    v.offset = at;
    stack_.push_back(&place(std::move(v)));
  }

  std::vector<Value*> stack_;
  std::string key_;
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
  TG_CHECK(!text.empty() && text.find_first_not_of("0123456789") == std::string::npos, "json: ", what,
           " must be a non-negative integer, found ", printable(text, 40), " at byte ", base + offset);
  // Accumulate with an overflow check: a corrupt header may hold any number of digits.
  int64_t v = 0;
  for (char c : text) {
    int digit = c - '0';
    TG_CHECK(v <= (std::numeric_limits<int64_t>::max() - digit) / 10, "json: ", what, " ", printable(text, 40),
             " does not fit in int64 (the largest is ", std::numeric_limits<int64_t>::max(), ") at byte ", base + offset);
    v = v * 10 + digit;
  }
  return v;
}

void parse(std::string_view text, Handler& handler, std::size_t base) {
  const char* read_to = text.data();
  Sax sax(text, base, handler, &read_to);
  TrackingIterator first(text.data(), &read_to), last(text.data() + text.size(), &read_to);
  try {
    nlohmann::json::sax_parse(first, last, &sax);
  } catch (const nlohmann::json::exception& e) {
    // parse_error() turns the library's errors into tg::Error; this is for any other.
    TG_FAIL("json: ", printable(e.what(), 300), " at byte ", base + static_cast<std::size_t>(read_to - text.data()));
  }
}

Value parse(std::string_view text, std::size_t base) {
  TreeBuilder tree;
  parse(text, tree, base);
  return std::move(tree.root);
}

std::string printable(std::string_view s, std::size_t max) {
  static const char* hex = "0123456789abcdef";
  std::string out;
  for (std::size_t i = 0; i < s.size() && i < max; ++i) {
    unsigned char u = static_cast<unsigned char>(s[i]);
    if (u >= 0x20 && u < 0x7f) {
      out += static_cast<char>(u);
    } else {
      out += "\\x";
      out += hex[u >> 4];
      out += hex[u & 15];
    }
  }
  if (s.size() > max) out += "...";
  return out;
}

namespace {

// The length of the well-formed UTF-8 sequence starting at s[i], or 0 if there is none
// (a stray continuation byte, a truncated sequence, an overlong form, a UTF-16 surrogate,
// a code point past Unicode's last).
std::size_t utf8_sequence_length(std::string_view s, std::size_t i) {
  const unsigned char c = static_cast<unsigned char>(s[i]);
  if (c < 0x80) return 1;
  std::size_t len = 0;
  uint32_t cp = 0, min = 0;
  if ((c & 0xE0) == 0xC0) len = 2, cp = c & 0x1F, min = 0x80;
  else if ((c & 0xF0) == 0xE0) len = 3, cp = c & 0x0F, min = 0x800;
  else if ((c & 0xF8) == 0xF0) len = 4, cp = c & 0x07, min = 0x10000;
  bool ok = len > 0 && s.size() - i >= len;
  for (std::size_t k = 1; ok && k < len; ++k) {
    const unsigned char b = static_cast<unsigned char>(s[i + k]);
    ok = (b & 0xC0) == 0x80;
    cp = (cp << 6) | (b & 0x3F);
  }
  ok = ok && cp >= min && cp <= 0x10FFFF && !(cp >= 0xD800 && cp <= 0xDFFF);
  return ok ? len : 0;
}

}  // namespace

bool valid_utf8(std::string_view s, std::size_t* bad) {
  for (std::size_t i = 0; i < s.size();) {
    const std::size_t len = utf8_sequence_length(s, i);
    if (len == 0) {
      if (bad) *bad = i;
      return false;
    }
    i += len;
  }
  return true;
}

std::string with_replacement_characters(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (std::size_t i = 0; i < s.size();) {
    const std::size_t len = utf8_sequence_length(s, i);
    if (len == 0) {
      out += "\xEF\xBF\xBD";  // U+FFFD for the one byte that starts no sequence
      ++i;
    } else {
      out.append(s.substr(i, len));
      i += len;
    }
  }
  return out;
}

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
