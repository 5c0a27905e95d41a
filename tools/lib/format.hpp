// Numbers and sizes both ways, as the `deepio` command reads and prints them: sizes with
// 1024-based suffixes ("64K", "1G"), Python's float repr (ds_io prints it), fixed decimals,
// medians. Pure functions; nothing here prints or throws on bad input (nullopt instead).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace deepio::cli {

/// Parses "4096", "64K", "1M", "2G", "1T" (1024-based; ds_io accepts upper case only, we also
/// accept lower case and a trailing "iB"/"B"). Returns nullopt for anything else: "M", "",
/// "-1", "1.5M", overflow.
[[nodiscard]] std::optional<std::uint64_t> parse_size(std::string_view text);
/// Parses a non-negative decimal integer; nullopt for anything else.
[[nodiscard]] std::optional<std::uint64_t> parse_uint(std::string_view text);
/// "1G", "512M", "64K", "1000" — the shortest exact 1024-based spelling (as ds_io file names).
[[nodiscard]] std::string size_label(std::uint64_t nbytes);
/// "1.00 GiB", "512 MiB", "1.5 KiB", "100 B" — for people.
[[nodiscard]] std::string human_bytes(std::uint64_t nbytes);

/// Python's repr() of a float: shortest round-trip digits, "1.0" for integral values,
/// exponent form below 1e-4 and from 1e16 ("1e-05", "1e+16"), "inf", "nan".
[[nodiscard]] std::string py_float(double value);
/// printf("%.*f").
[[nodiscard]] std::string fixed(double value, int decimals);
/// Median of a vector (mean of the two middle values for even sizes); 0 if empty.
[[nodiscard]] double median(std::vector<double> values);

/// Python's repr() of a bool and of a str without quotes inside ("True", "'x'"): the
/// `args = Namespace(...)` line ds_io prints.
[[nodiscard]] inline std::string py_bool(bool b) { return b ? "True" : "False"; }
[[nodiscard]] inline std::string py_str(const std::string& s) { return "'" + s + "'"; }

}  // namespace deepio::cli
