#include "format.hpp"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <system_error>

namespace deepio::cli {

std::optional<std::uint64_t> parse_uint(std::string_view text) {
  if (text.empty()) return std::nullopt;
  std::uint64_t v = 0;
  const auto* end = text.data() + text.size();
  auto [p, ec] = std::from_chars(text.data(), end, v);
  if (ec != std::errc() || p != end) return std::nullopt;
  return v;
}

namespace {

bool is_unit_letter(char c) { return std::string_view("KkMmGgTt").find(c) != std::string_view::npos; }

/// Removes an optional "B" / "iB" after the unit letter (1M, 1MB, 1MiB); false when "iB"
/// follows no unit letter.
bool strip_byte_suffix(std::string_view& digits) {
  if (digits.size() >= 2 && (digits.ends_with("iB") || digits.ends_with("ib"))) {
    digits.remove_suffix(2);
    return !digits.empty() && is_unit_letter(digits.back());
  }
  if (digits.size() >= 2 && (digits.back() == 'B' || digits.back() == 'b') &&
      is_unit_letter(digits[digits.size() - 2])) {
    digits.remove_suffix(1);
  }
  return true;
}

/// Removes a trailing unit letter and returns its multiplier (1 without one).
std::uint64_t strip_unit(std::string_view& digits) {
  if (digits.empty()) return 1;
  std::uint64_t mult = 1;
  switch (digits.back()) {
    case 'K':
    case 'k': mult = 1ULL << 10; break;
    case 'M':
    case 'm': mult = 1ULL << 20; break;
    case 'G':
    case 'g': mult = 1ULL << 30; break;
    case 'T':
    case 't': mult = 1ULL << 40; break;
    default: break;
  }
  if (mult != 1) digits.remove_suffix(1);
  return mult;
}

}  // namespace

std::optional<std::uint64_t> parse_size(std::string_view text) {
  std::string_view digits = text;
  if (!strip_byte_suffix(digits)) return std::nullopt;
  const std::uint64_t mult = strip_unit(digits);
  auto n = parse_uint(digits);
  if (!n) return std::nullopt;
  if (*n != 0 && mult > UINT64_MAX / *n) return std::nullopt;
  return *n * mult;
}

std::string size_label(std::uint64_t nbytes) {
  static constexpr struct {
    std::uint64_t unit;
    char suffix;
  } kUnits[] = {{1ULL << 40, 'T'}, {1ULL << 30, 'G'}, {1ULL << 20, 'M'}, {1ULL << 10, 'K'}};
  for (const auto& u : kUnits) {
    if (nbytes >= u.unit && nbytes % u.unit == 0) return std::to_string(nbytes / u.unit) + u.suffix;
  }
  return std::to_string(nbytes);
}

std::string human_bytes(std::uint64_t nbytes) {
  const double b = static_cast<double>(nbytes);
  if (nbytes >= (1ULL << 30)) return fixed(b / (1ULL << 30), 2) + " GiB";
  if (nbytes >= (1ULL << 20)) return fixed(b / (1ULL << 20), nbytes % (1ULL << 20) ? 1 : 0) + " MiB";
  if (nbytes >= (1ULL << 10)) return fixed(b / (1ULL << 10), nbytes % (1ULL << 10) ? 1 : 0) + " KiB";
  return std::to_string(nbytes) + " B";
}

namespace {

/// The shortest round-trip digits of |value| ("15" for 1.5) and its decimal exponent; false
/// when the value cannot be written (not for a finite double).
bool shortest_digits(double value, std::string& digits, int& exp10) {
  char buf[64];
  auto [end, ec] = std::to_chars(buf, buf + sizeof buf, std::fabs(value), std::chars_format::scientific);
  if (ec != std::errc()) return false;
  const std::string_view s(buf, static_cast<std::size_t>(end - buf));
  const auto epos = s.find('e');
  if (epos == std::string_view::npos || epos + 1 >= s.size()) return false;
  digits.clear();
  for (char c : s.substr(0, epos)) {
    if (c != '.') digits.push_back(c);
  }
  exp10 = 0;
  std::from_chars(s.data() + epos + 1 + (s[epos + 1] == '+' ? 1 : 0), s.data() + s.size(), exp10);
  return true;
}

}  // namespace

std::string py_float(double value) {
  if (std::isnan(value)) return "nan";
  if (std::isinf(value)) return value > 0 ? "inf" : "-inf";
  if (value == 0.0) return std::signbit(value) ? "-0.0" : "0.0";
  std::string digits;
  int exp10 = 0;
  if (!shortest_digits(value, digits, exp10)) return "nan";
  std::string out = value < 0 ? "-" : "";
  const int decpt = exp10 + 1;  // value = 0.DIGITS x 10^decpt
  const int nd = static_cast<int>(digits.size());
  if (decpt <= -4 || decpt > 16) {
    out += digits.substr(0, 1);
    if (nd > 1) out += "." + digits.substr(1);
    char e[16];
    std::snprintf(e, sizeof e, "e%c%02d", exp10 < 0 ? '-' : '+', std::abs(exp10));
    out += e;
  } else if (decpt <= 0) {
    out += "0." + std::string(static_cast<std::size_t>(-decpt), '0') + digits;
  } else if (decpt >= nd) {
    out += digits + std::string(static_cast<std::size_t>(decpt - nd), '0') + ".0";
  } else {
    out += digits.substr(0, static_cast<std::size_t>(decpt)) + "." + digits.substr(static_cast<std::size_t>(decpt));
  }
  return out;
}

std::string fixed(double value, int decimals) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", decimals, value);
  return buf;
}

double median(std::vector<double> values) {
  if (values.empty()) return 0.0;
  std::sort(values.begin(), values.end());
  const std::size_t n = values.size();
  return n % 2 ? values[n / 2] : (values[n / 2 - 1] + values[n / 2]) / 2.0;
}

}  // namespace deepio::cli
