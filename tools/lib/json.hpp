// JSON both ways, as the `deepio` command needs it: a small streaming writer with indented,
// deterministic output (every --json report), and a parser for fio's --output-format=json and
// tune's --sweep_config. Numbers are written as Python's float repr (format.hpp), integers
// exactly; a non-finite double is written as null. Strings are escaped per RFC 8259 (", \,
// and control characters; other bytes, UTF-8 included, pass through).
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace deepio::cli {

/// A streaming JSON writer. A key is given for members of an object and left empty for
/// array elements and the top-level value. The caller keeps begin/end balanced; the document
/// ends with a newline once the outermost container is closed.
class Json {
 public:
  explicit Json(int indent = 2) : indent_(indent) {}
  Json& begin_object(std::string_view key = {});
  Json& end_object();
  Json& begin_array(std::string_view key = {});
  Json& end_array();
  Json& value(std::string_view key, std::string_view v);
  Json& value(std::string_view key, const char* v) { return value(key, std::string_view(v)); }
  Json& value(std::string_view key, const std::string& v) { return value(key, std::string_view(v)); }
  Json& value(std::string_view key, bool v);
  Json& value(std::string_view key, double v);
  Json& value(std::string_view key, std::uint64_t v);
  Json& value(std::string_view key, std::int64_t v);
  Json& value(std::string_view key, int v) { return value(key, static_cast<std::int64_t>(v)); }
  Json& null(std::string_view key);
  /// A double, or null when `present` is false (tune's unmeasured read/write).
  Json& value_or_null(std::string_view key, double v, bool present) { return present ? value(key, v) : null(key); }
  /// Array element forms (key empty).
  Json& item(double v) { return value({}, v); }
  Json& item(std::string_view v) { return value({}, v); }
  [[nodiscard]] const std::string& str() const noexcept { return out_; }

  /// `s` as a JSON string literal, quotes included.
  static std::string quote(std::string_view s);

 private:
  void key_prefix(std::string_view key);
  Json& open(std::string_view key, char bracket);
  Json& close(char bracket);
  void newline();
  std::string out_;
  std::vector<bool> first_;  // per open container: nothing written yet
  int indent_;
};

/// A parsed JSON document.
struct JsonValue {
  enum class Type { Null, Bool, Number, String, Array, Object } type = Type::Null;
  bool boolean = false;
  double number = 0.0;
  std::string string;
  std::vector<JsonValue> array;
  std::vector<std::pair<std::string, JsonValue>> object;

  /// Member lookup; nullptr when this is not an object or the key is absent.
  [[nodiscard]] const JsonValue* get(std::string_view key) const;
  /// Array element; nullptr when this is not an array or the index is out of range.
  [[nodiscard]] const JsonValue* at(std::size_t index) const;
  /// A numeric member, or `fallback` when absent or not a number.
  [[nodiscard]] double num(std::string_view key, double fallback = 0.0) const;
};

/// Parses one JSON document (at most 65 nested arrays/objects); on failure returns nullopt and sets
/// `error` to what went wrong and the byte offset.
std::optional<JsonValue> parse_json(std::string_view text, std::string* error = nullptr);

}  // namespace deepio::cli
