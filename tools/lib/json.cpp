#include "json.hpp"

#include <charconv>
#include <cmath>
#include <cstdio>
#include <system_error>

#include "format.hpp"

namespace deepio::cli {

// ---- writer ------------------------------------------------------------------------------

std::string Json::quote(std::string_view s) {
  std::string out = "\"";
  for (unsigned char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\t': out += "\\t"; break;
      case '\r': out += "\\r"; break;
      default:
        if (c < 0x20) {
          char b[8];
          std::snprintf(b, sizeof b, "\\u%04x", c);
          out += b;
        } else {
          out.push_back(static_cast<char>(c));
        }
    }
  }
  return out + "\"";
}

void Json::newline() {
  out_ += "\n";
  out_.append(first_.size() * static_cast<std::size_t>(indent_), ' ');
}

void Json::key_prefix(std::string_view key) {
  if (!first_.empty()) {
    if (!first_.back()) out_ += ",";
    first_.back() = false;
    newline();
  }
  if (!key.empty()) out_ += quote(key) + ": ";
}

Json& Json::open(std::string_view key, char bracket) {
  key_prefix(key);
  out_ += bracket;
  first_.push_back(true);
  return *this;
}

Json& Json::close(char bracket) {
  const bool empty = first_.back();
  first_.pop_back();
  if (!empty) newline();
  out_ += bracket;
  if (first_.empty()) out_ += "\n";
  return *this;
}

Json& Json::begin_object(std::string_view key) { return open(key, '{'); }
Json& Json::end_object() { return close('}'); }
Json& Json::begin_array(std::string_view key) { return open(key, '['); }
Json& Json::end_array() { return close(']'); }

Json& Json::value(std::string_view key, std::string_view v) {
  key_prefix(key);
  out_ += quote(v);
  return *this;
}

Json& Json::value(std::string_view key, bool v) {
  key_prefix(key);
  out_ += v ? "true" : "false";
  return *this;
}

Json& Json::value(std::string_view key, double v) {
  key_prefix(key);
  out_ += std::isfinite(v) ? py_float(v) : "null";
  return *this;
}

Json& Json::value(std::string_view key, std::uint64_t v) {
  key_prefix(key);
  out_ += std::to_string(v);
  return *this;
}

Json& Json::value(std::string_view key, std::int64_t v) {
  key_prefix(key);
  out_ += std::to_string(v);
  return *this;
}

Json& Json::null(std::string_view key) {
  key_prefix(key);
  out_ += "null";
  return *this;
}

// ---- parsed values -----------------------------------------------------------------------

const JsonValue* JsonValue::get(std::string_view key) const {
  if (type != Type::Object) return nullptr;
  for (const auto& [k, v] : object) {
    if (k == key) return &v;
  }
  return nullptr;
}

const JsonValue* JsonValue::at(std::size_t index) const {
  if (type != Type::Array || index >= array.size()) return nullptr;
  return &array[index];
}

double JsonValue::num(std::string_view key, double fallback) const {
  const JsonValue* v = get(key);
  return v != nullptr && v->type == Type::Number ? v->number : fallback;
}

// ---- parser ------------------------------------------------------------------------------

namespace {

void append_utf8(std::string& out, unsigned cp) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

class JsonParser {
 public:
  explicit JsonParser(std::string_view t) : t_(t) {}
  bool document(JsonValue& out) {
    if (!parse(out, 0)) return false;
    ws();
    if (i_ != t_.size()) return fail("unexpected text after the JSON value");
    return true;
  }
  std::string error;

 private:
  bool fail(const std::string& what) {
    if (error.empty()) error = what + " at offset " + std::to_string(i_);
    return false;
  }
  void ws() {
    while (i_ < t_.size() && (t_[i_] == ' ' || t_[i_] == '\n' || t_[i_] == '\t' || t_[i_] == '\r')) ++i_;
  }
  bool peek(char c) const { return i_ < t_.size() && t_[i_] == c; }
  bool literal(std::string_view word) {
    if (t_.substr(i_, word.size()) != word) return fail("invalid literal");
    i_ += word.size();
    return true;
  }
  bool unicode_escape(std::string& out) {
    if (i_ + 4 > t_.size()) return fail("bad \\u escape");
    unsigned cp = 0;
    auto [p, ec] = std::from_chars(t_.data() + i_, t_.data() + i_ + 4, cp, 16);
    if (ec != std::errc() || p != t_.data() + i_ + 4) return fail("bad \\u escape");
    i_ += 4;
    append_utf8(out, cp);
    return true;
  }
  bool escape(std::string& out) {
    const char c = t_[i_++];
    switch (c) {
      case 'n': out.push_back('\n'); return true;
      case 't': out.push_back('\t'); return true;
      case 'r': out.push_back('\r'); return true;
      case 'b': out.push_back('\b'); return true;
      case 'f': out.push_back('\f'); return true;
      case 'u': return unicode_escape(out);
      default: out.push_back(c); return true;
    }
  }
  bool str(std::string& out) {
    ++i_;  // opening quote
    while (i_ < t_.size() && t_[i_] != '"') {
      const char c = t_[i_++];
      if (c != '\\') {
        out.push_back(c);
      } else if (i_ >= t_.size()) {
        break;
      } else if (!escape(out)) {
        return false;
      }
    }
    if (i_ >= t_.size()) return fail("unterminated string");
    ++i_;
    return true;
  }
  bool object(JsonValue& v, int depth) {
    v.type = JsonValue::Type::Object;
    ++i_;
    ws();
    if (peek('}')) {
      ++i_;
      return true;
    }
    while (true) {
      ws();
      if (!peek('"')) return fail("expected a string key");
      std::string key;
      if (!str(key)) return false;
      ws();
      if (!peek(':')) return fail("expected ':'");
      ++i_;
      JsonValue member;
      if (!parse(member, depth + 1)) return false;
      v.object.emplace_back(std::move(key), std::move(member));
      ws();
      if (peek(',')) {
        ++i_;
        continue;
      }
      if (peek('}')) {
        ++i_;
        return true;
      }
      return fail("expected ',' or '}'");
    }
  }
  bool array(JsonValue& v, int depth) {
    v.type = JsonValue::Type::Array;
    ++i_;
    ws();
    if (peek(']')) {
      ++i_;
      return true;
    }
    while (true) {
      JsonValue item;
      if (!parse(item, depth + 1)) return false;
      v.array.push_back(std::move(item));
      ws();
      if (peek(',')) {
        ++i_;
        continue;
      }
      if (peek(']')) {
        ++i_;
        return true;
      }
      return fail("expected ',' or ']'");
    }
  }
  bool number(JsonValue& v) {
    // from_chars does not take a leading '+'; JSON has none either.
    v.type = JsonValue::Type::Number;
    auto [p, ec] = std::from_chars(t_.data() + i_, t_.data() + t_.size(), v.number);
    if (ec != std::errc()) return fail("invalid value");
    i_ = static_cast<std::size_t>(p - t_.data());
    return true;
  }
  bool parse(JsonValue& v, int depth) {
    if (depth > 64) return fail("nesting too deep");
    ws();
    if (i_ >= t_.size()) return fail("unexpected end");
    switch (t_[i_]) {
      case '{': return object(v, depth);
      case '[': return array(v, depth);
      case '"': v.type = JsonValue::Type::String; return str(v.string);
      case 't':
        v.type = JsonValue::Type::Bool;
        v.boolean = true;
        return literal("true");
      case 'f': v.type = JsonValue::Type::Bool; return literal("false");
      case 'n': v.type = JsonValue::Type::Null; return literal("null");
      default: return number(v);
    }
  }
  std::string_view t_;
  std::size_t i_ = 0;
};

}  // namespace

std::optional<JsonValue> parse_json(std::string_view text, std::string* error) {
  JsonParser p(text);
  JsonValue v;
  if (!p.document(v)) {
    if (error != nullptr) *error = p.error;
    return std::nullopt;
  }
  return v;
}

}  // namespace deepio::cli
