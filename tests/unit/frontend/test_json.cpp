// The small JSON library of the frontend (frontend/json.h): values, escapes, numbers, limits, errors.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <string>

#include "frontend/json.h"
#include "sim/error.h"

using namespace nsim;
namespace json = nsim::frontend::json;
using json::Value;

namespace {

/// The error of parsing `text` (fails the test when it parses).
Error parse_error(const std::string& text) {
  try {
    json::parse(text, "t.json");
  } catch (const Error& e) {
    return e;
  }
  FAIL("expected a JSON syntax error for: " << text);
  return Error(ErrorCode::kInternal, "unreachable");
}

}  // namespace

TEST_CASE("json: scalars and containers", "[json]") {
  CHECK(json::parse("null").is_null());
  CHECK(json::parse("true").as_bool());
  CHECK_FALSE(json::parse(" false ").as_bool());
  CHECK(json::parse("\"hi\"").as_string() == "hi");

  const Value v = json::parse(R"({"b": [1, 2.5, "x", null, true, {}], "a": {"z": 1, "y": []}})");
  REQUIRE(v.is_object());
  REQUIRE(v.size() == 2);
  CHECK(v.key(0) == "b");  // key order preserved
  CHECK(v.key(1) == "a");
  const Value& b = *v.find("b");
  REQUIRE(b.is_array());
  REQUIRE(b.size() == 6);
  CHECK(b[0].is_int());
  CHECK(b[0].as_int() == 1);
  CHECK_FALSE(b[1].is_int());
  CHECK(b[1].as_double() == 2.5);
  CHECK(b[2].as_string() == "x");
  CHECK(b[3].is_null());
  CHECK(b[4].as_bool());
  CHECK(b[5].is_object());
  CHECK(b[5].size() == 0);
  CHECK(v.find("a")->find("y")->is_array());
  CHECK(v.find("nope") == nullptr);
  CHECK(b.find("x") == nullptr);  // not an object
  // Wrong-type accessors are harmless.
  CHECK(b.as_int() == 0);
  CHECK(b[2].size() == 0);
}

TEST_CASE("json: positions of values", "[json]") {
  const Value v = json::parse("{\n  \"a\": [1,\n    2]\n}");
  CHECK(v.line() == 1);
  CHECK(v.column() == 1);
  const Value& a = *v.find("a");
  CHECK(a.line() == 2);
  CHECK(a.column() == 8);
  CHECK(a[1].line() == 3);
  CHECK(a[1].column() == 5);
}

TEST_CASE("json: numbers", "[json]") {
  CHECK(json::parse("0").as_int() == 0);
  CHECK(json::parse("-0").is_int());
  CHECK(json::parse("123456789012").as_int() == 123456789012);
  CHECK(json::parse("9223372036854775807").as_int() == INT64_MAX);
  CHECK(json::parse("-9223372036854775808").as_int() == INT64_MIN);
  // Integer text beyond int64: kept as a double only.
  const Value big = json::parse("9223372036854775808");
  CHECK(big.is_number());
  CHECK_FALSE(big.is_int());
  CHECK(big.as_double() == Approx(9.223372036854775808e18));
  CHECK(json::parse("1.5").as_double() == 1.5);
  CHECK(json::parse("-2.5e-3").as_double() == Approx(-0.0025));
  CHECK(json::parse("1E2").as_double() == 100.0);
  CHECK_FALSE(json::parse("1E2").is_int());  // exponent: not integer text
  CHECK(json::parse("1e308").as_double() == 1e308);

  for (const char* bad : {"01", "-", "1.", ".5", "1e", "1e+", "+1", "0x10", "1.e3", "--1", "NaN", "Infinity", "-Infinity"}) {
    INFO(bad);
    CHECK(parse_error(bad).code() == ErrorCode::kJsonSyntax);
  }
  // Out of the range of a double.
  const Error e = parse_error("[1e400]");
  CHECK(e.code() == ErrorCode::kJsonSyntax);
  CHECK_THAT(e.message(), Catch::Contains("range"));
  CHECK(parse_error("-1e999").code() == ErrorCode::kJsonSyntax);
}

TEST_CASE("json: string escapes and UTF-8", "[json]") {
  CHECK(json::parse(R"("a\"b\\c\/d\b\f\n\r\t")").as_string() == "a\"b\\c/d\b\f\n\r\t");
  CHECK(json::parse(R"("\u0041\u00e9\u20AC")").as_string() == "A\xC3\xA9\xE2\x82\xAC");
  // Surrogate pair: U+1F600.
  CHECK(json::parse(R"("\ud83d\ude00")").as_string() == "\xF0\x9F\x98\x80");
  CHECK(json::parse(R"("\u0000")").as_string() == std::string(1, '\0'));
  // Raw UTF-8 passes through.
  CHECK(json::parse("\"caf\xC3\xA9 \xF0\x9F\x98\x80\"").as_string() == "caf\xC3\xA9 \xF0\x9F\x98\x80");

  for (const char* bad : {R"("\ud83d")", R"("\ud83dx")", R"("\ud83d\u0041")", R"("\ude00")", R"("\u12")", R"("\u12g4")",
                          R"("\x")", R"("\)", "\"abc", "\"a\nb\"", "\"a\tb\"", "\"\x01\""}) {
    INFO(bad);
    CHECK(parse_error(bad).code() == ErrorCode::kJsonSyntax);
  }
  // Invalid UTF-8: lone continuation, overlong, surrogate encoded, truncated, > U+10FFFF.
  for (const char* bad : {"\"\x80\"", "\"\xC0\xAF\"", "\"\xED\xA0\x80\"", "\"\xE2\x82\"", "\"\xF4\x90\x80\x80\"", "\"\xFF\""}) {
    CHECK(parse_error(bad).code() == ErrorCode::kJsonSyntax);
  }
}

TEST_CASE("json: structural errors carry line:column", "[json]") {
  Error e = parse_error("{\n  \"a\": 1,\n  \"b\" 2\n}");
  CHECK_THAT(e.message(), Catch::StartsWith("t.json:3:7:"));
  CHECK_THAT(e.message(), Catch::Contains("':'"));

  e = parse_error("[1, 2,]");
  CHECK_THAT(e.message(), Catch::StartsWith("t.json:1:7:"));
  e = parse_error("{\"a\": 1,}");
  CHECK(e.code() == ErrorCode::kJsonSyntax);
  e = parse_error("[1] x");
  CHECK_THAT(e.message(), Catch::StartsWith("t.json:1:5:"));
  CHECK_THAT(e.message(), Catch::Contains("after the JSON value"));
  e = parse_error("");
  CHECK_THAT(e.message(), Catch::Contains("empty"));
  e = parse_error("  \n ");
  CHECK(e.code() == ErrorCode::kJsonSyntax);
  e = parse_error("[1, 2");
  CHECK_THAT(e.message(), Catch::Contains("end of input"));
  e = parse_error("{\"a\": 1, \"a\": 2}");
  CHECK_THAT(e.message(), Catch::Contains("duplicate"));
  CHECK(parse_error("tru").code() == ErrorCode::kJsonSyntax);
  CHECK(parse_error("nul").code() == ErrorCode::kJsonSyntax);
  CHECK(parse_error("{1: 2}").code() == ErrorCode::kJsonSyntax);
  CHECK(parse_error("// c\n1").code() == ErrorCode::kJsonSyntax);
  CHECK(parse_error("'a'").code() == ErrorCode::kJsonSyntax);
  CHECK(parse_error(std::string("[1]\0", 4)).code() == ErrorCode::kJsonSyntax);
  // what() has the code.
  CHECK_THAT(std::string(e.what()), Catch::StartsWith("NSIM-E401"));
}

TEST_CASE("json: duplicate keys in a large object", "[json]") {
  std::string s = "{";
  for (int i = 0; i < 100; ++i) s += "\"k" + std::to_string(i) + "\": " + std::to_string(i) + ", ";
  s += "\"k42\": 0}";
  const Error e = parse_error(s);
  CHECK_THAT(e.message(), Catch::Contains("duplicate member name \"k42\""));
}

TEST_CASE("json: nesting depth limit", "[json]") {
  const int ok = json::kMaxDepth;
  const std::string fine = std::string(static_cast<size_t>(ok), '[') + std::string(static_cast<size_t>(ok), ']');
  CHECK(json::parse(fine).is_array());
  const std::string deep = std::string(static_cast<size_t>(ok + 1), '[') + std::string(static_cast<size_t>(ok + 1), ']');
  const Error e = parse_error(deep);
  CHECK_THAT(e.message(), Catch::Contains("nesting deeper than 256"));
  // Very deep hostile input fails fast without recursion blowup.
  CHECK(parse_error(std::string(1000000, '[')).code() == ErrorCode::kJsonSyntax);
  std::string objs;
  for (int i = 0; i < 100000; ++i) objs += "{\"a\":";
  CHECK(parse_error(objs).code() == ErrorCode::kJsonSyntax);
}

TEST_CASE("json: large inputs", "[json]") {
  std::string s = "[";
  for (int i = 0; i < 200000; ++i) {
    if (i) s += ',';
    s += std::to_string(i);
  }
  s += "]";
  const Value v = json::parse(s);
  REQUIRE(v.size() == 200000);
  CHECK(v[199999].as_int() == 199999);
  std::string big_string(5000002, 'x');
  big_string.front() = '"';
  big_string.back() = '"';
  CHECK(json::parse(big_string).as_string().size() == 5000000);
}

TEST_CASE("json: BOM is skipped", "[json]") { CHECK(json::parse("\xEF\xBB\xBF{\"a\": 1}").find("a")->as_int() == 1); }

TEST_CASE("json: writer round trip and layout", "[json]") {
  const std::string text =
      R"({"name": "k\"\n\u0001", "n": [1, -2, 2.5, -0.0, 1e300, 0.1, 9223372036854775807], "t": true, "f": false,
          "z": null, "e": {}, "ea": [], "nested": {"a": [[1, 2], {"b": "\u20ac\ud83d\ude00"}]}})";
  const Value v = json::parse(text);
  const std::string out = json::write(v);
  const Value back = json::parse(out);
  CHECK(back == v);
  CHECK(json::write(back) == out);  // stable
  CHECK(out.back() == '\n');
  CHECK_THAT(out, Catch::Contains("\\u0001"));
  CHECK_THAT(out, Catch::Contains("-0.0"));
  CHECK_THAT(out, Catch::Contains("2.5"));
  CHECK(std::signbit(back.find("n")->operator[](3).as_double()));

  // Short containers on one line, long ones broken with 2-space indentation.
  Value o = Value::object();
  o.set("shape", Value::array());
  o.set("x", Value::integer(1));
  CHECK(json::write(o) == "{\"shape\": [], \"x\": 1}\n");
  Value big = Value::array();
  for (int i = 0; i < 60; ++i) big.push(Value::integer(i));
  const std::string bs = json::write(big);
  CHECK_THAT(bs, Catch::StartsWith("[\n  0,\n  1,\n"));
  CHECK(json::parse(bs) == big);

  // Doubles keep their non-integer-ness; non-finite values become null.
  CHECK(json::write(Value::number(2.0)) == "2\n");
  CHECK(json::write(Value::number(0.5)) == "0.5\n");
  CHECK(json::write(Value::number(INFINITY)) == "null\n");
  CHECK(json::quote("a\"b") == "\"a\\\"b\"");
  // Invalid UTF-8 in a C++ string is replaced, so the output stays valid JSON.
  CHECK(json::parse(json::write(Value::string("a\xFF" "b"))).as_string() == "a\xEF\xBF\xBD" "b");
}

TEST_CASE("json: Stream reads a top-level object member by member with the parser's positions", "[json]") {
  // Members in any order; a member's value parsed on demand (positions as json::parse gives them);
  // an array's elements handed over one at a time.
  const std::string text = "\xEF\xBB\xBF  {\"body\": [{\"a\": 1},\n  {\"b\": \"x\\\"]}\"}, [2]],\n \"stacks\": [\"s\"], \"n\": 5}\n";
  json::Stream st(text, "t.json");
  REQUIRE(st.begin_object());
  const Value whole = json::parse(text, "t.json");
  CHECK(st.object_line() == whole.line());
  CHECK(st.object_column() == whole.column());  // 3: columns count from the end of the BOM
  std::string key;
  json::Stream::Mark body, stacks, n;
  REQUIRE(st.next_member(key, body));
  CHECK(key == "body");
  REQUIRE(st.next_member(key, stacks));
  CHECK(key == "stacks");
  REQUIRE(st.next_member(key, n));
  CHECK(key == "n");
  CHECK_FALSE(st.next_member(key, n));
  CHECK(st.parse_at(stacks) == json::parse("[\"s\"]"));
  // The same elements, lines and columns as the whole-document parse.
  const Value& wb = *whole.find("body");
  std::vector<Value> got;
  REQUIRE(st.for_each_element(body, [&](size_t i, Value v) {
    CHECK(i == got.size());
    got.push_back(std::move(v));
  }));
  REQUIRE(got.size() == wb.size());
  for (size_t i = 0; i < got.size(); ++i) {
    CHECK(got[i] == wb[i]);
    CHECK(got[i].line() == wb[i].line());
    CHECK(got[i].column() == wb[i].column());
  }
  CHECK_FALSE(st.for_each_element(n, [](size_t, Value) { FAIL("not an array"); }));
}

TEST_CASE("json: Stream reports syntax errors where json::parse does", "[json]") {
  for (const std::string& text : {std::string("{\"a\": 1 \"b\": 2}"), std::string("{\"a\": 1,"), std::string("{\"a\" 1}"),
                                 std::string("{\"a\": 1} x"), std::string("{\"a\": [1, 2}")}) {
    INFO(text);
    const std::string want = parse_error(text).message();
    std::string got;
    try {
      json::Stream st(text, "t.json");
      REQUIRE(st.begin_object());
      std::string key;
      json::Stream::Mark m;
      while (st.next_member(key, m)) st.parse_at(m);
    } catch (const Error& e) {
      got = e.message();
    }
    CHECK(got == want);
  }
}
