#include "args.hpp"

#include <cstdio>

#include "format.hpp"

namespace deepio::cli {

std::string ParsedArgs::get(const std::string& name, const std::string& fallback) const {
  auto it = values.find(name);
  if (it == values.end() || it->second.empty()) return fallback;
  return it->second.back();
}

const std::vector<std::string>& ParsedArgs::list(const std::string& name) const {
  static const std::vector<std::string> kEmpty;
  auto it = values.find(name);
  return it == values.end() ? kEmpty : it->second;
}

void ArgParser::flag(std::string name, std::string help, bool hidden) {
  specs_.push_back({std::move(name), ArgKind::Flag, {}, std::move(help), {}, hidden, {}});
}

void ArgParser::value(std::string name, std::string metavar, std::string help, std::string default_text, bool hidden) {
  specs_.push_back(
      {std::move(name), ArgKind::Value, std::move(metavar), std::move(help), std::move(default_text), hidden, {}});
}

void ArgParser::list(std::string name, std::string metavar, std::string help) {
  specs_.push_back({std::move(name), ArgKind::List, std::move(metavar), std::move(help), {}, false, {}});
}

void ArgParser::alias(std::string old_name, const std::string& canonical) {
  const ArgSpec* target = find(canonical);
  ArgSpec s = target != nullptr ? *target : ArgSpec{};
  s.name = std::move(old_name);
  s.hidden = true;
  s.alias_of = canonical;
  specs_.push_back(std::move(s));
}

const ArgSpec* ArgParser::find(std::string_view name) const {
  for (const auto& s : specs_) {
    if (s.name == name) return &s;
  }
  return nullptr;
}

namespace {

bool is_flag_word(std::string_view w) { return w.size() > 2 && w.starts_with("--"); }

/// The words of one command line and a cursor over them.
struct Words {
  const std::vector<std::string>& w;
  std::size_t i = 0;
  [[nodiscard]] bool next_is_value() const { return i + 1 < w.size() && !is_flag_word(w[i + 1]); }
  const std::string& take_next() { return w[++i]; }
};

/// Stores one known flag's value(s) from `words` (cursor on the flag word).
void take_flag(const ArgSpec& spec, const std::string& name, const std::optional<std::string>& inline_value,
               Words& words, ParsedArgs& out, std::vector<std::string>& errors) {
  switch (spec.kind) {
    case ArgKind::Flag:
      if (inline_value) errors.push_back(name + " takes no value");
      out.values[name];
      break;
    case ArgKind::Value:
      if (inline_value) {
        out.values[name].push_back(*inline_value);
      } else if (words.next_is_value()) {
        out.values[name].push_back(words.take_next());
      } else {
        errors.push_back(name + " needs a value (" + spec.metavar + ")");
      }
      break;
    case ArgKind::List: {
      auto& v = out.values[name];
      if (!v.empty()) errors.push_back(name + " given more than once");
      if (inline_value) v.push_back(*inline_value);
      while (words.next_is_value()) v.push_back(words.take_next());
      if (v.empty()) errors.push_back(name + " needs at least one value (" + spec.metavar + ")");
      break;
    }
  }
}

}  // namespace

ParsedArgs ArgParser::parse(const std::vector<std::string>& argv, std::vector<std::string>& errors,
                            bool allow_positional) const {
  ParsedArgs out;
  for (Words words{argv}; words.i < argv.size(); ++words.i) {
    const std::string& word = argv[words.i];
    if (word == "-h" || word == "--help") {
      out.values["--help"];
    } else if (!is_flag_word(word)) {
      if (allow_positional) out.positional.push_back(word);
      else errors.push_back("unexpected argument '" + word + "'");
    } else {
      std::string name = word;
      std::optional<std::string> inline_value;
      if (auto eq = name.find('='); eq != std::string::npos) {
        inline_value = name.substr(eq + 1);
        name.resize(eq);
      }
      if (const ArgSpec* spec = find(name)) {
        take_flag(*spec, spec->alias_of.empty() ? name : spec->alias_of, inline_value, words, out, errors);
      } else {
        errors.push_back("unknown flag " + name + " (see --help)");
        // Skip the values an unknown flag might have taken, so one typo gives one error.
        while (!allow_positional && words.next_is_value()) words.take_next();
      }
    }
  }
  return out;
}

ParsedArgs ArgParser::parse(int argc, char** argv, int first, std::vector<std::string>& errors,
                            bool allow_positional) const {
  std::vector<std::string> words;
  for (int i = first; i < argc; ++i) words.emplace_back(argv[i]);
  return parse(words, errors, allow_positional);
}

std::string ArgParser::help() const {
  constexpr std::size_t kColumn = 32;
  std::string h = "usage: " + prog_ + " [options]\n\n" + summary_ + "\n\noptions:\n";
  h += "  -h, --help                    show this help and exit\n";
  for (const auto& s : specs_) {
    if (s.hidden) continue;
    std::string left = "  " + s.name;
    if (s.kind == ArgKind::Value) left += " " + s.metavar;
    if (s.kind == ArgKind::List) left += " " + s.metavar + " [" + s.metavar + " ...]";
    if (left.size() < kColumn) {
      left.resize(kColumn, ' ');
    } else {
      left += "\n" + std::string(kColumn, ' ');
    }
    h += left + s.help;
    if (!s.default_text.empty()) h += " (default: " + s.default_text + ")";
    h += "\n";
  }
  if (!epilog_.empty()) h += "\n" + epilog_ + "\n";
  return h;
}

bool parse_or_help(const ArgParser& parser, int argc, char** argv, ParsedArgs& out, std::vector<std::string>& errors) {
  out = parser.parse(argc, argv, 1, errors);
  if (!out.has("--help")) return false;
  std::fputs(parser.help().c_str(), stdout);
  return true;
}

int print_errors(const std::string& prog, const std::vector<std::string>& errors) {
  for (const auto& e : errors) std::fprintf(stderr, "%s: error: %s\n", prog.c_str(), e.c_str());
  return 2;
}

std::optional<std::uint64_t> size_arg(const ParsedArgs& a, const std::string& flag, std::vector<std::string>& errors) {
  if (!a.has(flag)) return std::nullopt;
  const std::string text = a.get(flag);
  auto v = parse_size(text);
  if (!v) {
    errors.push_back(flag + ": '" + text +
                     "' is not a size (a number of bytes with an optional K, M, G or T suffix, e.g. 1M)");
  } else if (*v == 0) {
    errors.push_back(flag + ": must be greater than 0");
    return std::nullopt;
  }
  return v;
}

std::optional<std::uint64_t> count_arg(const ParsedArgs& a, const std::string& flag, std::vector<std::string>& errors,
                                       bool allow_zero) {
  if (!a.has(flag)) return std::nullopt;
  const std::string text = a.get(flag);
  auto v = parse_uint(text);
  if (!v || v > 1'000'000'000) {
    errors.push_back(flag + ": '" + text + "' is not a whole number");
    return std::nullopt;
  }
  if (*v == 0 && !allow_zero) {
    errors.push_back(flag + ": must be at least 1");
    return std::nullopt;
  }
  return v;
}

}  // namespace deepio::cli
