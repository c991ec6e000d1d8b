#pragma once
/// The compact form of a kernel.json: the same text compressed with gzip (RFC 1952 members holding
/// DEFLATE data, RFC 1951), e.g. `gzip kernel.json` -> kernel.json.gz (docs/kernel-json.md, "Compressed
/// kernel.json"). Files are recognised by their first two bytes (1f 8b), not by their name. The inflater
/// is written here (nsim depends on no compression library); it reads untrusted input: every read is
/// bounds-checked and any defect is an Error(kBadCompression) naming the file, never a crash.
#include <string>
#include <string_view>

namespace nsim::frontend {

/// True when `bytes` start with the gzip magic number (1f 8b).
bool is_gzip(std::string_view bytes);

/// The uncompressed content of gzip data: one or more members, each checked against its CRC-32 and
/// length. Throws Error(kBadCompression) "`what`: gzip: ..." for a truncated or corrupt stream.
std::string gunzip(std::string_view bytes, const std::string& what);

/// The uncompressed content of a zlib stream (RFC 1950: a DEFLATE stream with a 2-byte header and its Adler-32),
/// e.g. a Perfetto trace's compressed packets. Throws Error(kBadCompression) "`what`: zlib: ..." when corrupt.
std::string zlib_inflate(std::string_view bytes, const std::string& what);

/// A kernel file's text: `bytes` as they are, or uncompressed when they are gzip data.
std::string kernel_text(std::string bytes, const std::string& what);

}  // namespace nsim::frontend
