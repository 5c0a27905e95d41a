// Small pieces every `deepio` subcommand shares: the argument parser (collects every error
// before the command gives up, as ds_io does), size parsing and printing, Python-compatible
// float formatting (ds_io prints Python's float repr), a JSON writer, clocks and CPU time.
//
// Nothing here prints on its own except print_errors(); nothing throws on bad user input:
// problems come back as strings so the caller can collect them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace deepio::cli {

// ---- sizes -------------------------------------------------------------------------------

/// Parses "4096", "64K", "1M", "2G", "1T" (1024-based; ds_io accepts upper case only, we also
/// accept lower case and a trailing "iB"/"B"). Returns nullopt for anything else: "M", "",
/// "-1", "1.5M", overflow.
[[nodiscard]] std::optional<std::uint64_t> parse_size(std::string_view text);
/// Parses a non-negative decimal integer; nullopt for anything else.
[[nodiscard]] std::optional<std::uint64_t> parse_uint(std::string_view text);
/// "1G", "512M", "64K", "1000" — the shortest exact 1024-based spelling (as ds_io file names).
[[nodiscard]] std::string size_label(std::uint64_t nbytes);
/// "1.00 GiB", "512 MiB" — for people.
[[nodiscard]] std::string human_bytes(std::uint64_t nbytes);

// ---- numbers -----------------------------------------------------------------------------

/// Python's repr() of a float: shortest round-trip digits, "1.0" for integral values,
/// exponent form below 1e-4 and from 1e16 ("1e-05", "1e+16"), "inf", "nan".
[[nodiscard]] std::string py_float(double value);
/// printf("%.*f").
[[nodiscard]] std::string fixed(double value, int decimals);
/// Median of a non-empty vector (mean of the two middle values for even sizes); 0 if empty.
[[nodiscard]] double median(std::vector<double> values);

// ---- JSON --------------------------------------------------------------------------------

/// A minimal streaming JSON writer producing indented, deterministic output.
class Json {
 public:
  explicit Json(int indent = 2) : indent_(indent) {}
  Json& begin_object(std::string_view key = {});
  Json& end_object();
  Json& begin_array(std::string_view key = {});
  Json& end_array();
  Json& value(std::string_view key, std::string_view v);
  Json& value(std::string_view key, const char* v) { return value(key, std::string_view(v)); }
  Json& value(std::string_view key, bool v);
  Json& value(std::string_view key, double v);
  Json& value(std::string_view key, std::uint64_t v);
  Json& value(std::string_view key, std::int64_t v);
  Json& value(std::string_view key, int v) { return value(key, static_cast<std::int64_t>(v)); }
  Json& null(std::string_view key);
  /// Array element forms (key empty).
  Json& item(double v) { return value({}, v); }
  Json& item(std::string_view v) { return value({}, v); }
  [[nodiscard]] const std::string& str() const noexcept { return out_; }

  static std::string quote(std::string_view s);

 private:
  void key_prefix(std::string_view key);
  Json& close(char bracket);
  void newline();
  std::string out_;
  std::vector<bool> first_;  // per open container: nothing written yet
  int indent_;
};

// ---- argument parsing --------------------------------------------------------------------

enum class ArgKind { Flag, Value, List };

struct ArgSpec {
  std::string name;  ///< "--io_size"
  ArgKind kind = ArgKind::Flag;
  std::string metavar;
  std::string help;
  std::string default_text;  ///< shown in --help and the Namespace line; "" = None
  bool hidden = false;
};

/// The parsed command line: flags present, values given (last one wins for Value, all of them
/// for List), and positional words.
struct ParsedArgs {
  std::map<std::string, std::vector<std::string>> values;
  std::vector<std::string> positional;
  [[nodiscard]] bool has(const std::string& name) const { return values.count(name) != 0; }
  [[nodiscard]] std::string get(const std::string& name, const std::string& fallback = {}) const;
  [[nodiscard]] const std::vector<std::string>& list(const std::string& name) const;
};

class ArgParser {
 public:
  ArgParser(std::string prog, std::string summary) : prog_(std::move(prog)), summary_(std::move(summary)) {}
  void flag(std::string name, std::string help, bool hidden = false);
  void value(std::string name, std::string metavar, std::string help, std::string default_text = {},
             bool hidden = false);
  void list(std::string name, std::string metavar, std::string help);
  void epilog(std::string text) { epilog_ = std::move(text); }

  /// Parses argv[first..argc). "--name value", "--name=value", lists take words up to the next
  /// "--flag". Unknown flags, missing values, repeated lists and stray positional words
  /// (unless allow_positional) are appended to `errors`; parsing continues.
  ParsedArgs parse(int argc, char** argv, int first, std::vector<std::string>& errors,
                   bool allow_positional = false) const;
  [[nodiscard]] std::string help() const;
  [[nodiscard]] const std::vector<ArgSpec>& specs() const noexcept { return specs_; }
  [[nodiscard]] const std::string& prog() const noexcept { return prog_; }

 private:
  const ArgSpec* find(std::string_view name) const;
  std::string prog_;
  std::string summary_;
  std::string epilog_;
  std::vector<ArgSpec> specs_;
};

/// Prints each error as one line "<prog>: error: <msg>" on stderr; returns the exit status 2.
/// Why `--gpu` (and `--use_gds` / `--gds` when `gds`) cannot run here, as one line naming the
/// flag and the cause (no usable CUDA driver, no cuFile); the GPU modes of bench and tune
/// are not in the command yet, so with CUDA present it says that and where to go instead.
std::string gpu_problem(const char* gpu_flag, const char* gds_flag, bool gds);
int print_errors(const std::string& prog, const std::vector<std::string>& errors);

/// Reads a size flag; appends "<flag>: '<text>' is not a size ..." to errors when malformed.
std::optional<std::uint64_t> size_arg(const ParsedArgs& a, const std::string& flag,
                                      std::vector<std::string>& errors);
/// Reads a positive integer flag; appends an error when malformed or zero.
std::optional<std::uint64_t> count_arg(const ParsedArgs& a, const std::string& flag,
                                       std::vector<std::string>& errors, bool allow_zero = false);

/// Checks that `folder` exists, is a directory and is writable; returns the problem or "".
[[nodiscard]] std::string folder_problem(const std::string& folder);

// ---- clocks, CPU, files ------------------------------------------------------------------

[[nodiscard]] double now_seconds() noexcept;       ///< steady clock
[[nodiscard]] double process_cpu_seconds() noexcept;  ///< getrusage(SELF) user + system
[[nodiscard]] double children_cpu_seconds() noexcept; ///< getrusage(CHILDREN) user + system

/// fsync()s the file and asks the kernel to drop its pages (posix_fadvise DONTNEED), so the
/// next read comes from the device. Returns false if the file cannot be opened.
bool drop_page_cache(const std::string& path) noexcept;
/// Free bytes for unprivileged users on the filesystem holding `path`; 0 on error.
[[nodiscard]] std::uint64_t free_disk_bytes(const std::string& path) noexcept;
/// Physical memory in bytes; 0 on error.
[[nodiscard]] std::uint64_t physical_memory_bytes() noexcept;
/// Filesystem type name for statfs(2) magic numbers we know ("ext4", "xfs", "tmpfs", ...).
[[nodiscard]] std::string filesystem_of(const std::string& path);
/// True when the folder lives in memory (tmpfs, ramfs): no device to measure there.
[[nodiscard]] bool is_memory_filesystem(const std::string& path) noexcept;
/// Finds `name` on PATH; empty when absent.
[[nodiscard]] std::string find_on_path(const std::string& name);
/// True when stderr is a terminal (progress output goes there only then).
[[nodiscard]] bool stderr_is_tty() noexcept;

/// Runs argv (no shell), capturing stdout; returns the exit status (-1 when it could not
/// start, 128+signal when killed). stderr is captured into `err` when given.
int run_capture(const std::vector<std::string>& argv, std::string& out, std::string* err = nullptr);

}  // namespace deepio::cli

namespace deepio::cli {

/// A parsed JSON document (for fio's --output-format=json and tune's --sweep_config).
struct JsonValue {
  enum class Type { Null, Bool, Number, String, Array, Object } type = Type::Null;
  bool boolean = false;
  double number = 0.0;
  std::string string;
  std::vector<JsonValue> array;
  std::vector<std::pair<std::string, JsonValue>> object;

  /// Member lookup; nullptr when this is not an object or the key is absent.
  [[nodiscard]] const JsonValue* get(std::string_view key) const;
  /// Follows a path of keys ("jobs" is an array: use at()).
  [[nodiscard]] const JsonValue* at(std::size_t index) const;
  [[nodiscard]] double num(std::string_view key, double fallback = 0.0) const;
};

/// Parses one JSON document; on failure returns nullopt and sets `error` to what and where.
std::optional<JsonValue> parse_json(std::string_view text, std::string* error = nullptr);

}  // namespace deepio::cli
