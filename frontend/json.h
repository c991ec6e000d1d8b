#pragma once
/// A small JSON library for kernel.json (docs/kernel-json.md): a value type, a strict RFC 8259
/// parser and a stable pretty-printer. No dependency besides the standard library and fmt.
///
/// The parser is meant for untrusted input: nesting deeper than kMaxDepth, numbers outside the range
/// of a double, control characters or invalid UTF-8 in strings, unpaired surrogate escapes, duplicate
/// object keys and trailing garbage are all rejected with nsim::Error(ErrorCode::kJsonSyntax) whose
/// message is "file:line:column: ...". It recurses at most kMaxDepth levels and never reads out of
/// bounds. A leading UTF-8 byte-order mark is skipped.
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace nsim::frontend::json {

/// Maximum nesting of arrays and objects accepted by parse().
inline constexpr int kMaxDepth = 256;

/// A JSON value. Numbers keep their double value and, when the text was an integer (no fraction,
/// no exponent) that fits in int64, the exact integer (is_int()). Objects keep their key order.
/// Every parsed value remembers the line and column (1-based, in bytes) where it starts.
class Value {
 public:
  enum class Type : uint8_t { kNull, kBool, kNumber, kString, kArray, kObject };

  Value() = default;  ///< null
  static Value null() { return Value(); }
  static Value boolean(bool b);
  static Value number(double d);  ///< is_int() when d is integral and fits in int64
  static Value integer(int64_t i);
  /// A number as the parser reads one written with a fraction or an exponent: never is_int().
  static Value real(double d);
  static Value string(std::string s);
  static Value array();
  static Value object();

  Type type() const { return type_; }
  bool is_null() const { return type_ == Type::kNull; }
  bool is_bool() const { return type_ == Type::kBool; }
  bool is_number() const { return type_ == Type::kNumber; }
  bool is_int() const { return type_ == Type::kNumber && is_int_; }
  bool is_string() const { return type_ == Type::kString; }
  bool is_array() const { return type_ == Type::kArray; }
  bool is_object() const { return type_ == Type::kObject; }

  // Accessors; calling one for the wrong type returns a zero/empty value (never UB).
  bool as_bool() const { return type_ == Type::kBool && b_; }
  double as_double() const { return type_ == Type::kNumber ? d_ : 0.0; }
  int64_t as_int() const { return is_int() ? i_ : 0; }  ///< the exact integer, see is_int()
  const std::string& as_string() const;  ///< the string (or its key-less empty value)

  /// Array elements or object member values, in order.
  size_t size() const { return (type_ == Type::kArray || type_ == Type::kObject) ? items_.size() : 0; }
  const Value& operator[](size_t i) const { return items_[i]; }  ///< precondition: i < size()
  const std::vector<Value>& items() const { return items_; }
  /// Object member names (parallel to items()).
  const std::string& key(size_t i) const { return keys_[i]; }  ///< precondition: is_object(), i < size()
  const std::vector<std::string>& keys() const { return keys_; }
  /// Object member by name; nullptr when absent or not an object.
  const Value* find(std::string_view key) const;

  /// Room for n elements or members (arrays and objects built in memory).
  void reserve(size_t n);
  /// Append to an array.
  Value& push(Value v);
  /// Append a member to an object (no duplicate check; the writer writes what is there).
  Value& set(std::string key, Value v);

  int line() const { return line_; }
  int column() const { return col_; }
  void set_pos(int line, int col) {
    line_ = line;
    col_ = col;
  }

  /// Human name of a type ("an object", "a string", ...) for messages.
  static const char* type_name(Type t);
  const char* type_name() const { return type_name(type_); }

  /// Structural equality (numbers compare by value and integer-ness; positions are ignored).
  bool operator==(const Value& o) const;

 private:
  friend class Parser;
  Type type_ = Type::kNull;
  bool b_ = false;
  bool is_int_ = false;
  int line_ = 0, col_ = 0;
  double d_ = 0.0;
  int64_t i_ = 0;
  std::string s_;
  std::vector<std::string> keys_;  ///< objects only
  std::vector<Value> items_;       ///< arrays and objects
};

/// Parse one JSON text (RFC 8259). `filename` prefixes error messages ("f.json:3:14: ...").
/// Throws nsim::Error(ErrorCode::kJsonSyntax).
Value parse(std::string_view text, const std::string& filename = "<json>");

/// A JSON text whose top level is an object, read member by member without building it whole: a
/// kernel.json body of millions of statements is parsed one statement at a time (issue 12), so no
/// per-statement DOM outlives its statement. Values keep their line and column.
class Stream {
 public:
  /// Where a value starts (byte offset, and the line it is on with that line's first byte).
  struct Mark {
    size_t pos = 0;
    int line = 1;
    size_t line_start = 0;
  };
  Stream(std::string_view text, const std::string& filename = "<json>");
  ~Stream();
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  /// Enters the top-level object; false (nothing read) when the text does not start with '{'.
  bool begin_object();
  /// Where the top-level object begins (after begin_object() returned true).
  int object_line() const;
  int object_column() const;
  /// The next member: its name and where its value starts (the value is skipped); false after the
  /// closing '}' (only whitespace may follow). Throws E-JsonSyntax as json::parse would.
  bool next_member(std::string& key, Mark& value);
  /// The value at `m` as a DOM (the stream's own position is kept).
  Value parse_at(const Mark& m);
  /// When the value at `m` is an array: calls fn(i, element) for each element in order, each parsed
  /// just before its call, and returns true; false (nothing called) when it is not an array.
  bool for_each_element(const Mark& m, const std::function<void(size_t, Value)>& fn);
  /// A body of statements read statement by statement, nested loops' bodies too: add_body(m) gives the token
  /// of the array at `m` (a member of the top-level object); for_each_statement(token, fn) is
  /// for_each_element of it, except that a loop statement's "body" is left out, an empty array at position
  /// (line -1, column t): for_each_statement(t, fn) reads it in turn, when the loop is read. parse_body(token)
  /// is the whole value (for the error of a body that is not an array).
  int add_body(const Mark& m);
  bool for_each_statement(int token, const std::function<void(size_t, Value)>& fn);
  Value parse_body(int token);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  bool first_ = true;
};

/// Write a value: 2-space indentation, members in stored order, one line for a container whose
/// compact form fits in the line (about 100 columns), "\n" at the end. Integers print exactly,
/// other numbers as the shortest text that reads back to the same double; non-finite numbers (which
/// JSON cannot express) print as null. Strings escape '"', '\\' and control characters; other
/// characters (UTF-8) are copied. The output of write() parses back to an equal Value.
std::string write(const Value& v);

/// `s` as a JSON string literal, with quotes.
std::string quote(std::string_view s);

}  // namespace nsim::frontend::json
