#include "frontend/json.h"

#include <functional>
#include <memory>
#include <optional>

#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <limits>
#include <string>
#include <system_error>
#include <utility>

#include "sim/error.h"
#include "sim/text.h"

namespace nsim::frontend::json {

// ---------------------------------------------------------------- Value

Value Value::boolean(bool b) {
  Value v;
  v.type_ = Type::kBool;
  v.b_ = b;
  return v;
}

Value Value::number(double d) {
  Value v;
  v.type_ = Type::kNumber;
  v.d_ = d;
  // 2^63 is exactly representable; [-2^63, 2^63) converts to int64 without UB.
  if (std::isfinite(d) && d == std::floor(d) && !(d == 0.0 && std::signbit(d)) && d >= -9223372036854775808.0 && d < 9223372036854775808.0) {
    v.is_int_ = true;
    v.i_ = static_cast<int64_t>(d);
  }
  return v;
}

Value Value::integer(int64_t i) {
  Value v;
  v.type_ = Type::kNumber;
  v.is_int_ = true;
  v.i_ = i;
  v.d_ = static_cast<double>(i);
  return v;
}

Value Value::real(double d) {
  Value v;
  v.type_ = Type::kNumber;
  v.d_ = d;
  return v;
}

void Value::reserve(size_t n) {
  items_.reserve(n);
  if (type_ == Type::kObject) keys_.reserve(n);
}

Value Value::string(std::string s) {
  Value v;
  v.type_ = Type::kString;
  v.s_ = std::move(s);
  return v;
}

Value Value::array() {
  Value v;
  v.type_ = Type::kArray;
  return v;
}

Value Value::object() {
  Value v;
  v.type_ = Type::kObject;
  return v;
}

const std::string& Value::as_string() const { return s_; }

const Value* Value::find(std::string_view key) const {
  if (type_ != Type::kObject) return nullptr;
  for (size_t i = 0; i < keys_.size(); ++i)
    if (keys_[i] == key) return &items_[i];
  return nullptr;
}

Value& Value::push(Value v) {
  items_.push_back(std::move(v));
  return items_.back();
}

Value& Value::set(std::string key, Value v) {
  keys_.push_back(std::move(key));
  items_.push_back(std::move(v));
  return items_.back();
}

const char* Value::type_name(Type t) {
  switch (t) {
    case Type::kNull: return "null";
    case Type::kBool: return "a boolean";
    case Type::kNumber: return "a number";
    case Type::kString: return "a string";
    case Type::kArray: return "an array";
    case Type::kObject: return "an object";
  }
  return "?";
}

bool Value::operator==(const Value& o) const {
  if (type_ != o.type_) return false;
  switch (type_) {
    case Type::kNull: return true;
    case Type::kBool: return b_ == o.b_;
    case Type::kNumber:
      if (is_int_ != o.is_int_) return false;
      return is_int_ ? i_ == o.i_ : d_ == o.d_;
    case Type::kString: return s_ == o.s_;
    case Type::kArray: return items_ == o.items_;
    case Type::kObject: return keys_ == o.keys_ && items_ == o.items_;
  }
  return false;
}

// ---------------------------------------------------------------- parser

class Parser {
 public:
  Parser(std::string_view text, const std::string& filename) : t_(text), file_(filename) {}

  /// A leading UTF-8 BOM is ignored (columns count from after it), then whitespace.
  void skip_bom_and_ws() {
    if (t_.size() >= 3 && static_cast<unsigned char>(t_[0]) == 0xEF && static_cast<unsigned char>(t_[1]) == 0xBB &&
        static_cast<unsigned char>(t_[2]) == 0xBF) {
      p_ = 3;
      line_start_ = 3;
    }
    skip_ws();
  }

  Value run() {
    skip_bom_and_ws();
    if (p_ >= t_.size()) fail("empty input, expected a JSON value");
    Value v = value(0);
    skip_ws();
    if (p_ < t_.size()) fail(fmt::format("unexpected {} after the JSON value", describe_here()));
    return v;
  }

  // ---- streaming (json::Stream): the top-level object member by member, a member's value parsed
  // or skipped, an array's elements parsed one at a time.

  Stream::Mark mark() const { return {p_, line_, line_start_}; }
  void seek(const Stream::Mark& m) {
    p_ = m.pos;
    line_ = m.line;
    line_start_ = m.line_start;
  }
  /// After an optional BOM and whitespace: '{' consumed, true; anything else: false (nothing consumed).
  bool begin_object() {
    skip_bom_and_ws();
    if (p_ >= t_.size() || t_[p_] != '{') return false;
    object_line_ = line_, object_col_ = col_at(p_);
    ++p_;
    return true;
  }
  int object_line_ = 0, object_col_ = 0;  ///< where the top-level object begins (begin_object)
  /// The next member of the top-level object: its name and where its value starts; the value is
  /// skipped (lexically: strings and brackets; it is checked when parsed). False after the closing
  /// '}', when only whitespace may follow. Errors as Parser::object gives them.
  bool next_member(bool first, std::string& key, Stream::Mark& value) {
    skip_ws();
    if (first && p_ < t_.size() && t_[p_] == '}') return end_object();
    if (!first) {
      if (p_ >= t_.size()) fail("unexpected end of input in an object, expected ',' or '}'");
      if (t_[p_] == '}') return end_object();
      if (t_[p_] != ',') fail(fmt::format("unexpected {} in an object, expected ',' or '}}'", describe_here()));
      ++p_;
      skip_ws();
    }
    if (p_ >= t_.size()) fail("unexpected end of input in an object, expected a member name");
    if (t_[p_] != '"') fail(fmt::format("unexpected {} in an object, expected a member name in double quotes", describe_here()));
    key = string();
    skip_ws();
    if (p_ >= t_.size() || t_[p_] != ':') fail(fmt::format("unexpected {} after a member name, expected ':'", describe_here()));
    ++p_;
    skip_ws();
    if (p_ >= t_.size()) fail("unexpected end of input, expected a value");
    value = mark();
    skip_value();
    return true;
  }
  /// The value at the current position, as a DOM, nested `depth` levels deep; the position is left after it.
  Value parse_value(int depth) { return value(depth); }
  /// Where a loop statement's body starts, and the depth of that array (Stream::for_each_statement).
  using Bodies = std::vector<std::pair<Stream::Mark, int>>;
  /// value(depth) for a statement of a body read statement by statement, except that a loop statement
  /// ({"loop": {..., "body": [...], ...}}) has its body skipped: in its place an empty array at position
  /// (-1, t), the body's start in bodies[t], read when the loop is (no DOM of a whole loop body is held).
  /// Anything else, and anything unusual in a loop statement (another member, a duplicate name, a syntax
  /// error, nesting too deep), is parsed by value() from the start, which reports it as it always has.
  Value statement(int depth, Bodies& bodies) {
    const Stream::Mark start = mark();
    const size_t nb = bodies.size();
    try {
      if (std::optional<Value> v = loop_statement(depth, bodies)) return std::move(*v);
    } catch (const Error&) {  // value() reports it, in its order
    }
    bodies.resize(nb);
    seek(start);
    return value(depth);
  }
  /// At an array: '[' consumed, true; else false (nothing consumed).
  bool begin_array() {
    if (p_ >= t_.size() || t_[p_] != '[') return false;
    ++p_;
    skip_ws();
    return true;
  }
  /// Before each element of an array begun with begin_array(): true with the position at the element,
  /// false after the closing ']'.
  bool next_element(bool first) {
    skip_ws();
    if (p_ >= t_.size()) fail(first ? "unexpected end of input, expected a value" : "unexpected end of input in an array, expected ',' or ']'");
    if (t_[p_] == ']' && first) {
      ++p_;
      return false;
    }
    if (!first) {
      if (t_[p_] == ']') {
        ++p_;
        return false;
      }
      if (t_[p_] != ',') fail(fmt::format("unexpected {} in an array, expected ',' or ']'", describe_here()));
      ++p_;
      skip_ws();
    }
    return true;
  }

 private:
  /// statement()'s loop statement, or nullopt (the position anywhere: statement() starts again).
  std::optional<Value> loop_statement(int depth, Bodies& bodies) {
    // Depths as value(depth) gives them: the statement's members at depth + 1, the loop's at depth + 2, the
    // body's elements at depth + 3.
    if (depth + 3 > kMaxDepth || p_ >= t_.size() || t_[p_] != '{') return std::nullopt;
    const int line = line_, col = col_at(p_);
    ++p_;
    skip_ws();
    if (p_ >= t_.size() || t_[p_] != '"' || string() != "loop") return std::nullopt;
    skip_ws();
    if (p_ >= t_.size() || t_[p_] != ':') return std::nullopt;
    ++p_;
    skip_ws();
    if (p_ >= t_.size() || t_[p_] != '{') return std::nullopt;
    Value loop = Value::object();
    loop.set_pos(line_, col_at(p_));
    ++p_;
    bool body = false;
    for (bool first = true;; first = false) {
      skip_ws();
      if (p_ >= t_.size()) return std::nullopt;
      if (t_[p_] == '}' && !first) break;
      if (!first) {
        if (t_[p_] != ',') return std::nullopt;
        ++p_;
        skip_ws();
      }
      if (p_ >= t_.size() || t_[p_] != '"') return std::nullopt;
      std::string key = string();
      if (loop.find(key)) return std::nullopt;  // a duplicate name
      skip_ws();
      if (p_ >= t_.size() || t_[p_] != ':') return std::nullopt;
      ++p_;
      skip_ws();
      if (key == "body" && p_ < t_.size() && t_[p_] == '[') {
        Value marker = Value::array();
        marker.set_pos(-1, static_cast<int>(bodies.size()));
        bodies.emplace_back(mark(), depth + 2);
        skip_value();
        loop.set(std::move(key), std::move(marker));
        body = true;
      } else {
        loop.set(std::move(key), value(depth + 2));
      }
    }
    ++p_;  // the loop's }
    skip_ws();
    if (!body || p_ >= t_.size() || t_[p_] != '}') return std::nullopt;
    ++p_;
    Value st = Value::object();
    st.set_pos(line, col);
    st.set("loop", std::move(loop));
    return st;
  }

  bool end_object() {
    ++p_;  // }
    skip_ws();
    if (p_ < t_.size()) fail(fmt::format("unexpected {} after the JSON value", describe_here()));
    return false;
  }

  /// Past one value without building it: strings (with escapes) and bracket nesting, counting lines.
  void skip_value() {
    int depth = 0;
    for (;;) {
      if (p_ >= t_.size()) fail("unexpected end of input, expected a value");
      const char c = t_[p_];
      if (c == '"') {
        ++p_;
        while (p_ < t_.size() && t_[p_] != '"') {
          if (t_[p_] == '\\') ++p_;
          else if (t_[p_] == '\n') ++line_, line_start_ = p_ + 1;
          ++p_;
        }
        if (p_ < t_.size()) ++p_;  // the closing quote
        if (depth == 0) return;
        continue;
      }
      if (c == '{' || c == '[') {
        ++depth;
      } else if (c == '}' || c == ']') {
        if (depth == 0) return;
        if (--depth == 0) {
          ++p_;
          return;
        }
      } else if (c == ',') {
        if (depth == 0) return;
      } else if (c == '\n') {
        ++line_;
        line_start_ = p_ + 1;
      } else if (depth == 0 && (c == ' ' || c == '\t' || c == '\r')) {
        return;
      }
      ++p_;
    }
  }

  std::string_view t_;
  const std::string& file_;
  size_t p_ = 0;
  int line_ = 1;
  size_t line_start_ = 0;
  // Members of the arrays and objects being parsed, one list per nesting depth, reused: each array or
  // object then gets its vectors in one allocation of the exact size instead of growing them (growing
  // was a third of parsing a kernel.json, in malloc/free and moves).
  std::vector<std::vector<Value>> items_scratch_ = std::vector<std::vector<Value>>(kMaxDepth + 2);
  std::vector<std::vector<std::string>> keys_scratch_ = std::vector<std::vector<std::string>>(kMaxDepth + 2);

  template <typename T>
  static void take(std::vector<T>& dst, std::vector<T>& scratch) {
    dst.reserve(scratch.size());
    for (T& x : scratch) dst.push_back(std::move(x));
    scratch.clear();
  }

  int col_at(size_t pos) const {
    const size_t c = pos - line_start_ + 1;
    return c > static_cast<size_t>(std::numeric_limits<int>::max()) ? std::numeric_limits<int>::max()
                                                                    : static_cast<int>(c);
  }

  [[noreturn]] void fail_at(size_t pos, const std::string& msg) const {
    throw Error(ErrorCode::kJsonSyntax, fmt::format("{}:{}:{}: JSON syntax error: {}", file_, line_, col_at(pos), msg));
  }
  [[noreturn]] void fail(const std::string& msg) const { fail_at(p_, msg); }

  std::string describe_here() const {
    if (p_ >= t_.size()) return "end of input";
    const unsigned char c = static_cast<unsigned char>(t_[p_]);
    if (c >= 0x21 && c < 0x7f) return fmt::format("character '{}'", static_cast<char>(c));
    return fmt::format("byte 0x{:02x}", c);
  }

  void skip_ws() {
    while (p_ < t_.size()) {
      const char c = t_[p_];
      if (c == ' ' || c == '\t' || c == '\r') {
        ++p_;
      } else if (c == '\n') {
        ++p_;
        ++line_;
        line_start_ = p_;
      } else {
        break;
      }
    }
  }

  bool match_word(std::string_view w) {
    if (t_.substr(p_, w.size()) != w) return false;
    p_ += w.size();
    return true;
  }

  Value value(int depth) {
    if (p_ >= t_.size()) fail("unexpected end of input, expected a value");
    const int line = line_, col = col_at(p_);
    Value v;
    const char c = t_[p_];
    switch (c) {
      case '{': v = object(depth + 1); break;
      case '[': v = array(depth + 1); break;
      case '"': v = Value::string(string()); break;
      case 't':
        if (!match_word("true")) fail("invalid literal, expected 'true'");
        v = Value::boolean(true);
        break;
      case 'f':
        if (!match_word("false")) fail("invalid literal, expected 'false'");
        v = Value::boolean(false);
        break;
      case 'n':
        if (!match_word("null")) fail("invalid literal, expected 'null'");
        break;
      default:
        if (c == '-' || (c >= '0' && c <= '9')) {
          v = number();
        } else {
          fail(fmt::format("unexpected {}, expected a value", describe_here()));
        }
    }
    v.set_pos(line, col);
    return v;
  }

  void check_depth(int depth) const {
    if (depth > kMaxDepth) fail(fmt::format("nesting deeper than {} levels", kMaxDepth));
  }

  Value array(int depth) {
    check_depth(depth);
    Value v = Value::array();
    ++p_;  // [
    skip_ws();
    if (p_ < t_.size() && t_[p_] == ']') {
      ++p_;
      return v;
    }
    std::vector<Value>& items = items_scratch_[static_cast<size_t>(depth)];
    items.clear();
    for (;;) {
      skip_ws();
      items.push_back(value(depth));
      skip_ws();
      if (p_ >= t_.size()) fail("unexpected end of input in an array, expected ',' or ']'");
      if (t_[p_] == ',') {
        ++p_;
        continue;
      }
      if (t_[p_] == ']') {
        ++p_;
        take(v.items_, items);
        return v;
      }
      fail(fmt::format("unexpected {} in an array, expected ',' or ']'", describe_here()));
    }
  }

  Value object(int depth) {
    check_depth(depth);
    Value v = Value::object();
    ++p_;  // {
    skip_ws();
    if (p_ < t_.size() && t_[p_] == '}') {
      ++p_;
      return v;
    }
    std::vector<Value>& items = items_scratch_[static_cast<size_t>(depth)];
    std::vector<std::string>& keys = keys_scratch_[static_cast<size_t>(depth)];
    items.clear();
    keys.clear();
    for (;;) {
      skip_ws();
      if (p_ >= t_.size()) fail("unexpected end of input in an object, expected a member name");
      if (t_[p_] != '"') fail(fmt::format("unexpected {} in an object, expected a member name in double quotes", describe_here()));
      const size_t key_pos = p_;
      const int key_line = line_;
      std::string key = string();
      // Duplicate names: linear for small objects, a sorted index for large ones (no quadratic blowup).
      if (keys.size() < 16) {
        for (const std::string& k : keys)
          if (k == key) fail_dup(key, key_line, key_pos);
      }
      skip_ws();
      if (p_ >= t_.size() || t_[p_] != ':') fail(fmt::format("unexpected {} after a member name, expected ':'", describe_here()));
      ++p_;
      skip_ws();
      keys.push_back(std::move(key));
      items.push_back(value(depth));
      skip_ws();
      if (p_ >= t_.size()) fail("unexpected end of input in an object, expected ',' or '}'");
      if (t_[p_] == ',') {
        ++p_;
        continue;
      }
      if (t_[p_] == '}') {
        ++p_;
        take(v.keys_, keys);
        take(v.items_, items);
        break;
      }
      fail(fmt::format("unexpected {} in an object, expected ',' or '}}'", describe_here()));
    }
    if (v.keys_.size() >= 16) {
      std::vector<size_t> idx(v.keys_.size());
      for (size_t i = 0; i < idx.size(); ++i) idx[i] = i;
      std::stable_sort(idx.begin(), idx.end(), [&](size_t a, size_t b) { return v.keys_[a] < v.keys_[b]; });
      for (size_t i = 1; i < idx.size(); ++i) {
        if (v.keys_[idx[i]] == v.keys_[idx[i - 1]]) {
          const Value& second = v.items_[idx[i]];
          throw Error(ErrorCode::kJsonSyntax,
                      fmt::format("{}:{}:{}: JSON syntax error: duplicate member name {}", file_, second.line(),
                                  second.column(), short_quote(v.keys_[idx[i]])));
        }
      }
    }
    return v;
  }

  static std::string short_quote(const std::string& s) {
    if (s.size() <= 64) return quote(s);
    return quote(sim::clip_utf8(s, 64)) + "...";
  }

  [[noreturn]] void fail_dup(const std::string& key, int line, size_t pos) const {
    // `pos` is on line `line`; line_start_ may have moved if the key contained no newline (it cannot).
    throw Error(ErrorCode::kJsonSyntax, fmt::format("{}:{}:{}: JSON syntax error: duplicate member name {}", file_, line,
                                                    col_at(pos), short_quote(key)));
  }

  static int hex(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  }

  unsigned read_hex4() {
    // p_ is after "\u"
    if (t_.size() - p_ < 4) fail_at(p_ - 2, "truncated \\u escape, expected 4 hex digits");
    unsigned v = 0;
    for (int i = 0; i < 4; ++i) {
      const int h = hex(t_[p_ + static_cast<size_t>(i)]);
      if (h < 0) fail_at(p_ - 2, "invalid \\u escape, expected 4 hex digits");
      v = v * 16 + static_cast<unsigned>(h);
    }
    p_ += 4;
    return v;
  }

  static void put_utf8(std::string& out, uint32_t cp) {
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

  /// Length of the valid UTF-8 sequence at p_ (>= 2 bytes, lead byte >= 0x80), or 0 if invalid.
  size_t utf8_len() const {
    const auto b = [&](size_t i) { return static_cast<unsigned char>(t_[p_ + i]); };
    const unsigned char c = b(0);
    const size_t avail = t_.size() - p_;
    const auto cont = [&](size_t i) { return i < avail && (b(i) & 0xC0) == 0x80; };
    if (c >= 0xC2 && c <= 0xDF) return cont(1) ? 2 : 0;
    if (c >= 0xE0 && c <= 0xEF) {
      if (!cont(1) || !cont(2)) return 0;
      if (c == 0xE0 && b(1) < 0xA0) return 0;   // overlong
      if (c == 0xED && b(1) >= 0xA0) return 0;  // surrogates
      return 3;
    }
    if (c >= 0xF0 && c <= 0xF4) {
      if (!cont(1) || !cont(2) || !cont(3)) return 0;
      if (c == 0xF0 && b(1) < 0x90) return 0;  // overlong
      if (c == 0xF4 && b(1) >= 0x90) return 0; // > U+10FFFF
      return 4;
    }
    return 0;
  }

  std::string string() {
    const size_t open = p_;
    ++p_;  // "
    std::string out;
    for (;;) {
      // Copy a run of plain bytes at once.
      size_t q = p_;
      while (q < t_.size()) {
        const unsigned char c = static_cast<unsigned char>(t_[q]);
        if (c == '"' || c == '\\' || c < 0x20 || c >= 0x80) break;
        ++q;
      }
      out.append(t_.data() + p_, q - p_);
      p_ = q;
      if (p_ >= t_.size()) fail_at(open, "unterminated string");
      const unsigned char c = static_cast<unsigned char>(t_[p_]);
      if (c == '"') {
        ++p_;
        return out;
      }
      if (c < 0x20) {
        fail(c == '\n' ? std::string("unterminated string (raw newline in a string; use \\n)")
                       : fmt::format("control character 0x{:02x} in a string must be escaped", c));
      }
      if (c >= 0x80) {
        const size_t n = utf8_len();
        if (n == 0) fail(fmt::format("invalid UTF-8 byte 0x{:02x} in a string", c));
        out.append(t_.data() + p_, n);
        p_ += n;
        continue;
      }
      // backslash
      if (p_ + 1 >= t_.size()) fail_at(open, "unterminated string");
      const char e = t_[p_ + 1];
      p_ += 2;
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
          uint32_t cp = read_hex4();
          if (cp >= 0xD800 && cp <= 0xDBFF) {
            if (t_.size() - p_ < 2 || t_[p_] != '\\' || t_[p_ + 1] != 'u')
              fail_at(p_ - 6, "unpaired high surrogate in a \\u escape");
            p_ += 2;
            const uint32_t lo = read_hex4();
            if (lo < 0xDC00 || lo > 0xDFFF) fail_at(p_ - 6, "a high surrogate must be followed by a low surrogate \\uDC00..\\uDFFF");
            cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
          } else if (cp >= 0xDC00 && cp <= 0xDFFF) {
            fail_at(p_ - 6, "unpaired low surrogate in a \\u escape");
          }
          put_utf8(out, cp);
          break;
        }
        default:
          p_ -= 1;
          fail_at(p_ - 1, fmt::format("invalid escape '\\{}'", (static_cast<unsigned char>(e) >= 0x21 && static_cast<unsigned char>(e) < 0x7f) ? std::string(1, e) : fmt::format("x{:02x}", static_cast<unsigned char>(e))));
      }
    }
  }

  Value number() {
    const size_t start = p_;
    bool is_integer = true;
    if (t_[p_] == '-') ++p_;
    if (p_ >= t_.size() || !(t_[p_] >= '0' && t_[p_] <= '9')) fail("invalid number: expected a digit");
    if (t_[p_] == '0') {
      ++p_;
      if (p_ < t_.size() && t_[p_] >= '0' && t_[p_] <= '9') fail_at(start, "invalid number: leading zeros are not allowed");
    } else {
      while (p_ < t_.size() && t_[p_] >= '0' && t_[p_] <= '9') ++p_;
    }
    if (p_ < t_.size() && t_[p_] == '.') {
      is_integer = false;
      ++p_;
      if (p_ >= t_.size() || !(t_[p_] >= '0' && t_[p_] <= '9')) fail("invalid number: expected a digit after '.'");
      while (p_ < t_.size() && t_[p_] >= '0' && t_[p_] <= '9') ++p_;
    }
    if (p_ < t_.size() && (t_[p_] == 'e' || t_[p_] == 'E')) {
      is_integer = false;
      ++p_;
      if (p_ < t_.size() && (t_[p_] == '+' || t_[p_] == '-')) ++p_;
      if (p_ >= t_.size() || !(t_[p_] >= '0' && t_[p_] <= '9')) fail("invalid number: expected a digit in the exponent");
      while (p_ < t_.size() && t_[p_] >= '0' && t_[p_] <= '9') ++p_;
    }
    const char* b = t_.data() + start;
    const char* e = t_.data() + p_;
    Value v;
    v.type_ = Value::Type::kNumber;
    double d = 0.0;
    const auto rd = std::from_chars(b, e, d);
    if (rd.ec == std::errc::result_out_of_range) {
      fail_at(start, fmt::format("number {} is out of the range of a double", std::string_view(b, std::min<size_t>(static_cast<size_t>(e - b), 40))));
    }
    if (rd.ec != std::errc() || rd.ptr != e) fail_at(start, "invalid number");
    v.d_ = d;
    if (is_integer) {
      int64_t i = 0;
      const auto ri = std::from_chars(b, e, i);
      if (ri.ec == std::errc() && ri.ptr == e) {
        v.is_int_ = true;
        v.i_ = i;
      }
    }
    return v;
  }
};

Value parse(std::string_view text, const std::string& filename) { return Parser(text, filename).run(); }

struct Stream::Impl {
  std::string file;  // the parser refers to it: a copy, so a temporary name given to Stream is fine
  Parser parser;
  Parser::Bodies bodies;  // for_each_statement's bodies by token
  Impl(std::string_view text, const std::string& filename) : file(filename), parser(text, file) {}
};

Stream::Stream(std::string_view text, const std::string& filename) : impl_(std::make_unique<Impl>(text, filename)) {}
Stream::~Stream() = default;
bool Stream::begin_object() { return impl_->parser.begin_object(); }
int Stream::object_line() const { return impl_->parser.object_line_; }
int Stream::object_column() const { return impl_->parser.object_col_; }
bool Stream::next_member(std::string& key, Mark& value) {
  const bool more = impl_->parser.next_member(first_, key, value);
  first_ = false;
  return more;
}
Value Stream::parse_at(const Mark& m) {
  const Mark here = impl_->parser.mark();
  impl_->parser.seek(m);
  Value v = impl_->parser.parse_value(1);  // a member of the top-level object
  impl_->parser.seek(here);
  return v;
}
bool Stream::for_each_element(const Mark& m, const std::function<void(size_t, Value)>& fn) {
  Parser& p = impl_->parser;
  const Mark here = p.mark();
  p.seek(m);
  if (!p.begin_array()) {
    p.seek(here);
    return false;
  }
  for (size_t i = 0; p.next_element(i == 0); ++i) fn(i, p.parse_value(2));  // in a member's array
  p.seek(here);
  return true;
}

int Stream::add_body(const Mark& m) {
  impl_->bodies.emplace_back(m, 1);  // a member of the top-level object
  return static_cast<int>(impl_->bodies.size() - 1);
}
bool Stream::for_each_statement(int token, const std::function<void(size_t, Value)>& fn) {
  Parser& p = impl_->parser;
  const auto [m, depth] = impl_->bodies.at(static_cast<size_t>(token));
  const Mark here = p.mark();
  p.seek(m);
  if (!p.begin_array()) {
    p.seek(here);
    return false;
  }
  for (size_t i = 0; p.next_element(i == 0); ++i) {
    Value v = p.statement(depth + 1, impl_->bodies);  // (may add bodies: `m` and `depth` are copies)
    const Mark after = p.mark();
    fn(i, std::move(v));  // (may read a loop's body, which moves the position)
    p.seek(after);
  }
  p.seek(here);
  return true;
}
Value Stream::parse_body(int token) {
  const auto [m, depth] = impl_->bodies.at(static_cast<size_t>(token));
  const Mark here = impl_->parser.mark();
  impl_->parser.seek(m);
  Value v = impl_->parser.parse_value(depth);
  impl_->parser.seek(here);
  return v;
}

// ---------------------------------------------------------------- writer

namespace {

void append_quoted(std::string& out, std::string_view s) {
  out += '"';
  size_t i = 0;
  while (i < s.size()) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    if (c < 0x80) {
      switch (c) {
        case '"': out += "\\\""; break;
        case '\\': out += "\\\\"; break;
        case '\n': out += "\\n"; break;
        case '\r': out += "\\r"; break;
        case '\t': out += "\\t"; break;
        case '\b': out += "\\b"; break;
        case '\f': out += "\\f"; break;
        default:
          if (c < 0x20 || c == 0x7f) {
            out += fmt::format("\\u{:04x}", c);
          } else {
            out += static_cast<char>(c);
          }
      }
      ++i;
      continue;
    }
    // Copy valid UTF-8 sequences; replace invalid bytes by U+FFFD.
    size_t n = 0;
    const size_t avail = s.size() - i;
    const auto b = [&](size_t k) { return static_cast<unsigned char>(s[i + k]); };
    const auto cont = [&](size_t k) { return k < avail && (b(k) & 0xC0) == 0x80; };
    if (c >= 0xC2 && c <= 0xDF && cont(1)) {
      n = 2;
    } else if (c >= 0xE0 && c <= 0xEF && cont(1) && cont(2) && !(c == 0xE0 && b(1) < 0xA0) &&
               !(c == 0xED && b(1) >= 0xA0)) {
      n = 3;
    } else if (c >= 0xF0 && c <= 0xF4 && cont(1) && cont(2) && cont(3) && !(c == 0xF0 && b(1) < 0x90) &&
               !(c == 0xF4 && b(1) >= 0x90)) {
      n = 4;
    }
    if (n == 0) {
      out += "\xEF\xBF\xBD";
      ++i;
    } else {
      out.append(s.data() + i, n);
      i += n;
    }
  }
  out += '"';
}

void append_number(std::string& out, const Value& v) {
  char buf[64];
  if (v.is_int()) {
    const auto r = std::to_chars(buf, buf + sizeof buf, v.as_int());
    out.append(buf, r.ptr);
    return;
  }
  const double d = v.as_double();
  if (!std::isfinite(d)) {
    out += "null";
    return;
  }
  const auto r = std::to_chars(buf, buf + sizeof buf, d);
  std::string_view s(buf, static_cast<size_t>(r.ptr - buf));
  out.append(s);
  // Keep non-integers non-integer on re-read: "1e+20" is fine (exponent), "3" is not.
  if (s.find_first_of(".eE") == std::string_view::npos && s != "null") out += ".0";
}

void append_scalar(std::string& out, const Value& v) {
  switch (v.type()) {
    case Value::Type::kNull: out += "null"; break;
    case Value::Type::kBool: out += v.as_bool() ? "true" : "false"; break;
    case Value::Type::kNumber: append_number(out, v); break;
    case Value::Type::kString: append_quoted(out, v.as_string()); break;
    default: break;
  }
}

constexpr size_t kLineWidth = 100;

/// Compact one-line form of v appended to out, unless it would make out longer than `limit`
/// (returns false then; out is left partially written).
bool append_compact(std::string& out, const Value& v, size_t limit) {
  if (v.is_array() || v.is_object()) {
    out += v.is_array() ? '[' : '{';
    for (size_t i = 0; i < v.size(); ++i) {
      if (i) out += ", ";
      if (v.is_object()) {
        append_quoted(out, v.key(i));
        out += ": ";
      }
      if (out.size() > limit) return false;
      if (!append_compact(out, v[i], limit)) return false;
    }
    out += v.is_array() ? ']' : '}';
  } else {
    append_scalar(out, v);
  }
  return out.size() <= limit;
}

void append_pretty(std::string& out, const Value& v, size_t indent, size_t column) {
  if (!(v.is_array() || v.is_object())) {
    append_scalar(out, v);
    return;
  }
  if (v.size() == 0) {
    out += v.is_array() ? "[]" : "{}";
    return;
  }
  {
    std::string one;
    // column + the text must fit; trailing ',' counted.
    const size_t budget = kLineWidth > column + 1 ? kLineWidth - column - 1 : 0;
    if (append_compact(one, v, budget)) {
      out += one;
      return;
    }
  }
  out += v.is_array() ? '[' : '{';
  const std::string pad(indent + 2, ' ');
  for (size_t i = 0; i < v.size(); ++i) {
    out += '\n';
    out += pad;
    size_t col = pad.size();
    if (v.is_object()) {
      const size_t before = out.size();
      append_quoted(out, v.key(i));
      out += ": ";
      col += out.size() - before;
    }
    append_pretty(out, v[i], indent + 2, col);
    if (i + 1 < v.size()) out += ',';
  }
  out += '\n';
  out.append(indent, ' ');
  out += v.is_array() ? ']' : '}';
}

}  // namespace

std::string quote(std::string_view s) {
  std::string out;
  append_quoted(out, s);
  return out;
}

std::string write(const Value& v) {
  std::string out;
  append_pretty(out, v, 0, 0);
  out += '\n';
  return out;
}

}  // namespace nsim::frontend::json
