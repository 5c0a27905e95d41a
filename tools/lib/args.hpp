// The argument parser of every `deepio` subcommand. It collects every problem before the
// command gives up, as ds_io does: errors come back as strings in a vector, one per problem,
// and parsing goes on. It accepts "--name value", "--name=value", lists ("--name a b c", up
// to the next "--flag") and "-h"/"--help" anywhere. It never prints (print_errors does, on
// request) and never throws on bad input.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace deepio::cli {

enum class ArgKind { Flag, Value, List };

struct ArgSpec {
  std::string name;  ///< "--io_size"
  ArgKind kind = ArgKind::Flag;
  std::string metavar;
  std::string help;
  std::string default_text;  ///< shown in --help; "" = none
  bool hidden = false;       ///< accepted, not shown in --help
  std::string alias_of;      ///< not empty: an old spelling, parsed as this flag (and hidden)
};

/// The parsed command line: flags present, values given (last one wins for Value, all of them
/// for List), and positional words. "--help" is present when -h or --help was given.
struct ParsedArgs {
  std::map<std::string, std::vector<std::string>> values;
  std::vector<std::string> positional;
  [[nodiscard]] bool has(const std::string& name) const { return values.count(name) != 0; }
  /// The last value given for `name`, or `fallback` when it was not given (or had none).
  [[nodiscard]] std::string get(const std::string& name, const std::string& fallback = {}) const;
  /// Every value given for `name` (empty when absent).
  [[nodiscard]] const std::vector<std::string>& list(const std::string& name) const;
};

class ArgParser {
 public:
  ArgParser(std::string prog, std::string summary) : prog_(std::move(prog)), summary_(std::move(summary)) {}
  void flag(std::string name, std::string help, bool hidden = false);
  void value(std::string name, std::string metavar, std::string help, std::string default_text = {},
             bool hidden = false);
  void list(std::string name, std::string metavar, std::string help);
  /// `old_name` is another spelling of the flag `canonical` (added before): accepted, stored
  /// under `canonical` (ParsedArgs::has(canonical) is true), not shown in --help. For the
  /// spellings DeepSpeed's scripts use (ds_nvme_tune's --gds) and renamed flags.
  void alias(std::string old_name, const std::string& canonical);
  void epilog(std::string text) { epilog_ = std::move(text); }

  /// Parses argv[first..argc). Unknown flags (once each, with the words that followed them),
  /// missing values, values given to a plain flag, repeated lists and stray positional words
  /// (unless allow_positional) are appended to `errors`; parsing continues.
  ParsedArgs parse(int argc, char** argv, int first, std::vector<std::string>& errors,
                   bool allow_positional = false) const;
  /// The same over a vector of words (tests, and callers that build argv themselves).
  ParsedArgs parse(const std::vector<std::string>& words, std::vector<std::string>& errors,
                   bool allow_positional = false) const;
  /// argparse-style help: usage line, summary, one line per visible option (description in
  /// column 33, on the next line when the option is wider), then the epilog.
  [[nodiscard]] std::string help() const;
  [[nodiscard]] const std::vector<ArgSpec>& specs() const noexcept { return specs_; }
  [[nodiscard]] const std::string& prog() const noexcept { return prog_; }

 private:
  [[nodiscard]] const ArgSpec* find(std::string_view name) const;
  std::string prog_;
  std::string summary_;
  std::string epilog_;
  std::vector<ArgSpec> specs_;
};

/// The start of every subcommand: parses argv[1..argc) (argv[0] is the subcommand's name)
/// into `out`, appending problems to `errors`. Returns true when -h/--help was given: the
/// help has then been printed on stdout, and the command exits 0 whatever else was wrong.
bool parse_or_help(const ArgParser& parser, int argc, char** argv, ParsedArgs& out, std::vector<std::string>& errors);

/// Prints each error as one line "<prog>: error: <msg>" on stderr; returns the exit status 2.
int print_errors(const std::string& prog, const std::vector<std::string>& errors);

/// Reads a size flag ("64K", "1G"); nullopt when absent. Appends "<flag>: '<text>' is not a
/// size ..." when malformed (and returns nullopt), "<flag>: must be greater than 0" for 0.
std::optional<std::uint64_t> size_arg(const ParsedArgs& a, const std::string& flag, std::vector<std::string>& errors);
/// Reads a whole-number flag (at most 10^9); nullopt when absent or bad. Appends an error
/// when malformed, or when zero unless allow_zero.
std::optional<std::uint64_t> count_arg(const ParsedArgs& a, const std::string& flag, std::vector<std::string>& errors,
                                       bool allow_zero = false);

}  // namespace deepio::cli
