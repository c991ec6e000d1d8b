// The error-code table (sim/errors.def): unique codes and names, complete rows, codes in their family's
// hundreds range, and the enum, the code strings and the Error text all taken from it.
#include <catch2/catch.hpp>
#include <map>
#include <set>
#include <string>

#include "sim/error.h"

using namespace nsim;

TEST_CASE("errors: every row has a unique code and name, a meaning and a hint", "[errors]") {
  std::set<int> numbers;
  std::set<std::string_view> names;
  REQUIRE(!error_table().empty());
  for (const ErrorInfo& e : error_table()) {
    INFO(e.name);
    CHECK(numbers.insert(static_cast<int>(e.code)).second);
    CHECK(names.insert(e.name).second);
    CHECK(!e.meaning.empty());
    CHECK(!e.hint.empty());
    CHECK(e.meaning.find('|') == std::string_view::npos);  // the rows become Markdown table cells
    CHECK(e.hint.find('|') == std::string_view::npos);
    CHECK(&error_info(e.code) == &e);
  }
}

TEST_CASE("errors: each code lies in its family's hundreds range", "[errors]") {
  const std::map<ErrorFamily, int> hundreds = {{ErrorFamily::config, 1},   {ErrorFamily::access, 2},
                                               {ErrorFamily::operand, 3},  {ErrorFamily::kernel, 4},
                                               {ErrorFamily::not_supported, 4}, {ErrorFamily::internal, 9}};
  for (const ErrorInfo& e : error_table()) {
    INFO(e.name);
    CHECK(static_cast<int>(e.code) / 100 == hundreds.at(e.family));
  }
}

TEST_CASE("errors: code strings and messages come from the table", "[errors]") {
  CHECK(error_code_str(ErrorCode::kSbufOverflow) == "NSIM-E204");
  CHECK(error_code_str(ErrorCode::kWrongType) == "NSIM-E404");
  CHECK(error_info(ErrorCode::kBadReshape).name == "BadReshape");
  CHECK(error_family_name(error_info(ErrorCode::kNotSupported).family) == "not_supported");
  const Error e(ErrorCode::kBadStatsFile, std::string("x"), SourceLoc{std::string("k.py"), 3, {}});
  CHECK(std::string(e.what()) == "NSIM-E445: x [at k.py:3]");
}
