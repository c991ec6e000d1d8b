#pragma once
/// The JSON documents nsim writes (stats, trace events, analysis report, run comparison) are built as
/// nlohmann::ordered_json values, whose members keep the order they were added in, and serialized by
/// nlohmann/json. Reading kernel.json and stats files stays with frontend/json.h (line:column errors).
#include <nlohmann/json.hpp>

#include <string>

namespace nsim::sim {

using Json = nlohmann::ordered_json;

/// `v` as a JSON number: an integral value below 2^53 in magnitude as an integer (prints without a
/// fraction), a non-finite one as null (JSON has no NaN or infinity), any other as a double (printed as
/// the shortest text that reads back to the same double).
Json json_number(double v);
/// Whether json_number(v) is an integer.
bool json_integral(double v);

/// A time in ns rounded to the ps (3 decimals, as the text outputs print times), via json_number().
Json json_ns(double ns);

/// `j` as text: compact on one line (indent < 0) or indented by `indent` spaces. Bytes that are not
/// UTF-8 are replaced by U+FFFD rather than throwing.
std::string dump_json(const Json& j, int indent = -1);

}  // namespace nsim::sim
