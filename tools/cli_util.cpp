#include "cli_util.hpp"

#include "deepio/gpu.hpp"

#include <fcntl.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/statvfs.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <system_error>

namespace deepio::cli {

// ---- sizes -------------------------------------------------------------------------------

std::optional<std::uint64_t> parse_uint(std::string_view text) {
  if (text.empty()) return std::nullopt;
  std::uint64_t v = 0;
  const auto* end = text.data() + text.size();
  auto [p, ec] = std::from_chars(text.data(), end, v);
  if (ec != std::errc() || p != end) return std::nullopt;
  return v;
}

std::optional<std::uint64_t> parse_size(std::string_view text) {
  std::string_view digits = text;
  std::uint64_t mult = 1;
  // Optional "B" / "iB" after the unit letter: 1M, 1MB, 1MiB.
  if (digits.size() >= 2 && (digits.ends_with("iB") || digits.ends_with("ib"))) {
    digits.remove_suffix(2);
    if (digits.empty() || std::string_view("KkMmGgTt").find(digits.back()) == std::string_view::npos) {
      return std::nullopt;
    }
  } else if (digits.size() >= 2 && (digits.back() == 'B' || digits.back() == 'b') &&
             std::string_view("KkMmGgTt").find(digits[digits.size() - 2]) != std::string_view::npos) {
    digits.remove_suffix(1);
  }
  if (!digits.empty()) {
    switch (digits.back()) {
      case 'K': case 'k': mult = 1ULL << 10; break;
      case 'M': case 'm': mult = 1ULL << 20; break;
      case 'G': case 'g': mult = 1ULL << 30; break;
      case 'T': case 't': mult = 1ULL << 40; break;
      default: break;
    }
    if (mult != 1) digits.remove_suffix(1);
  }
  auto n = parse_uint(digits);
  if (!n) return std::nullopt;
  if (*n != 0 && mult > UINT64_MAX / *n) return std::nullopt;
  return *n * mult;
}

std::string size_label(std::uint64_t nbytes) {
  static constexpr struct { std::uint64_t unit; char suffix; } kUnits[] = {
      {1ULL << 40, 'T'}, {1ULL << 30, 'G'}, {1ULL << 20, 'M'}, {1ULL << 10, 'K'}};
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

// ---- numbers -----------------------------------------------------------------------------

std::string py_float(double value) {
  if (std::isnan(value)) return "nan";
  if (std::isinf(value)) return value > 0 ? "inf" : "-inf";
  if (value == 0.0) return std::signbit(value) ? "-0.0" : "0.0";
  char buf[64];
  auto [end, ec] = std::to_chars(buf, buf + sizeof buf, value, std::chars_format::scientific);
  if (ec != std::errc()) return "nan";
  std::string_view s(buf, static_cast<std::size_t>(end - buf));
  std::string out;
  if (s.front() == '-') {
    out.push_back('-');
    s.remove_prefix(1);
  }
  const auto epos = s.find('e');
  std::string digits;
  for (char c : s.substr(0, epos)) {
    if (c != '.') digits.push_back(c);
  }
  int exp10 = 0;
  std::from_chars(s.data() + epos + 1 + (s[epos + 1] == '+' ? 1 : 0), s.data() + s.size(), exp10);
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
    out += digits.substr(0, static_cast<std::size_t>(decpt)) + "." +
           digits.substr(static_cast<std::size_t>(decpt));
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

// ---- JSON --------------------------------------------------------------------------------

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

Json& Json::begin_object(std::string_view key) {
  key_prefix(key);
  out_ += "{";
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

Json& Json::end_object() { return close('}'); }

Json& Json::begin_array(std::string_view key) {
  key_prefix(key);
  out_ += "[";
  first_.push_back(true);
  return *this;
}

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

// ---- argument parsing --------------------------------------------------------------------

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
  specs_.push_back({std::move(name), ArgKind::Flag, {}, std::move(help), {}, hidden});
}

void ArgParser::value(std::string name, std::string metavar, std::string help,
                      std::string default_text, bool hidden) {
  specs_.push_back({std::move(name), ArgKind::Value, std::move(metavar), std::move(help),
                    std::move(default_text), hidden});
}

void ArgParser::list(std::string name, std::string metavar, std::string help) {
  specs_.push_back({std::move(name), ArgKind::List, std::move(metavar), std::move(help), {}, false});
}

const ArgSpec* ArgParser::find(std::string_view name) const {
  for (const auto& s : specs_) {
    if (s.name == name) return &s;
  }
  return nullptr;
}

ParsedArgs ArgParser::parse(int argc, char** argv, int first, std::vector<std::string>& errors,
                            bool allow_positional) const {
  ParsedArgs out;
  auto is_flag_word = [](std::string_view w) { return w.size() > 2 && w.starts_with("--"); };
  for (int i = first; i < argc; ++i) {
    std::string_view word = argv[i];
    if (word == "-h" || word == "--help") {
      out.values["--help"];
      continue;
    }
    if (!is_flag_word(word)) {
      if (allow_positional) {
        out.positional.emplace_back(word);
      } else {
        errors.push_back("unexpected argument '" + std::string(word) + "'");
      }
      continue;
    }
    std::string name(word);
    std::optional<std::string> inline_value;
    if (auto eq = name.find('='); eq != std::string::npos) {
      inline_value = name.substr(eq + 1);
      name.resize(eq);
    }
    const ArgSpec* spec = find(name);
    if (spec == nullptr) {
      errors.push_back("unknown flag " + name + " (see --help)");
      // Skip the values an unknown flag might have taken, so one typo gives one error.
      while (i + 1 < argc && !is_flag_word(argv[i + 1]) && !allow_positional) ++i;
      continue;
    }
    switch (spec->kind) {
      case ArgKind::Flag:
        if (inline_value) errors.push_back(name + " takes no value");
        out.values[name];
        break;
      case ArgKind::Value:
        if (inline_value) {
          out.values[name].push_back(*inline_value);
        } else if (i + 1 < argc && !is_flag_word(argv[i + 1])) {
          out.values[name].push_back(argv[++i]);
        } else {
          errors.push_back(name + " needs a value (" + spec->metavar + ")");
        }
        break;
      case ArgKind::List: {
        auto& v = out.values[name];
        if (!v.empty()) errors.push_back(name + " given more than once");
        if (inline_value) v.push_back(*inline_value);
        while (i + 1 < argc && !is_flag_word(argv[i + 1])) v.emplace_back(argv[++i]);
        if (v.empty()) errors.push_back(name + " needs at least one value (" + spec->metavar + ")");
        break;
      }
    }
  }
  return out;
}

std::string ArgParser::help() const {
  std::string h = "usage: " + prog_ + " [options]\n\n" + summary_ + "\n\noptions:\n";
  h += "  -h, --help                    show this help and exit\n";
  for (const auto& s : specs_) {
    if (s.hidden) continue;
    std::string left = "  " + s.name;
    if (s.kind == ArgKind::Value) left += " " + s.metavar;
    if (s.kind == ArgKind::List) left += " " + s.metavar + " [" + s.metavar + " ...]";
    if (left.size() < 32) {
      left.resize(32, ' ');
    } else {
      left += "\n" + std::string(32, ' ');
    }
    h += left + s.help;
    if (!s.default_text.empty()) h += " (default: " + s.default_text + ")";
    h += "\n";
  }
  if (!epilog_.empty()) h += "\n" + epilog_ + "\n";
  return h;
}

std::string gpu_problem(const char* gpu_flag, const char* gds_flag, bool gds) {
  const GpuInfo g = gpu_info();
  if (!g.cuda_found) return std::string(gpu_flag) + ": no usable CUDA driver: " + g.cuda_reason;
  if (gds && !g.cufile_found) return std::string(gds_flag) + ": no cuFile: " + g.cufile_reason;
  return std::string(gpu_flag) + ": GPU runs are not in the deepio command yet (CUDA " +
         std::to_string(g.driver_version) + ", " + std::to_string(g.device_count) +
         " device(s), GDS mode " + g.gds_mode +
         "); use examples/file_access/*_gpu_tensor.py (see docs/gpu.md)";
}

int print_errors(const std::string& prog, const std::vector<std::string>& errors) {
  for (const auto& e : errors) std::fprintf(stderr, "%s: error: %s\n", prog.c_str(), e.c_str());
  return 2;
}

std::optional<std::uint64_t> size_arg(const ParsedArgs& a, const std::string& flag,
                                      std::vector<std::string>& errors) {
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

std::optional<std::uint64_t> count_arg(const ParsedArgs& a, const std::string& flag,
                                       std::vector<std::string>& errors, bool allow_zero) {
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

std::string folder_problem(const std::string& folder) {
  struct stat st {};
  if (::stat(folder.c_str(), &st) != 0) {
    return "folder '" + folder + "' " +
           (errno == ENOENT ? std::string("does not exist") : std::string(std::strerror(errno)));
  }
  if (!S_ISDIR(st.st_mode)) return "'" + folder + "' is not a folder";
  if (::access(folder.c_str(), W_OK | X_OK) != 0) {
    return "folder '" + folder + "' is not writable (" + std::strerror(errno) + ")";
  }
  // access() says yes to root everywhere; creating a file is the real test (read-only
  // mounts, /proc, quota, ...).
  const std::string probe = folder + "/.deepio-write-test-" + std::to_string(::getpid());
  const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) return "folder '" + folder + "' is not writable (" + std::strerror(errno) + ")";
  ::close(fd);
  ::unlink(probe.c_str());
  return {};
}

// ---- clocks, CPU, files ------------------------------------------------------------------

double now_seconds() noexcept {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

namespace {
double rusage_seconds(int who) noexcept {
  rusage ru{};
  if (::getrusage(who, &ru) != 0) return 0.0;
  auto tv = [](const timeval& t) { return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_usec) * 1e-6; };
  return tv(ru.ru_utime) + tv(ru.ru_stime);
}
}  // namespace

double process_cpu_seconds() noexcept { return rusage_seconds(RUSAGE_SELF); }
double children_cpu_seconds() noexcept { return rusage_seconds(RUSAGE_CHILDREN); }

bool drop_page_cache(const std::string& path) noexcept {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  ::fsync(fd);
  ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  ::close(fd);
  return true;
}

std::uint64_t free_disk_bytes(const std::string& path) noexcept {
  struct statvfs sv {};
  if (::statvfs(path.c_str(), &sv) != 0) return 0;
  return static_cast<std::uint64_t>(sv.f_bavail) * sv.f_frsize;
}

std::uint64_t physical_memory_bytes() noexcept {
  const long pages = ::sysconf(_SC_PHYS_PAGES);
  const long page = ::sysconf(_SC_PAGESIZE);
  if (pages <= 0 || page <= 0) return 0;
  return static_cast<std::uint64_t>(pages) * static_cast<std::uint64_t>(page);
}

std::string filesystem_of(const std::string& path) {
  struct statfs sf {};
  if (::statfs(path.c_str(), &sf) != 0) return "unknown";
  static constexpr struct { unsigned long magic; const char* name; } kNames[] = {
      {0xEF53, "ext4"},       {0x58465342, "xfs"},   {0x9123683E, "btrfs"},
      {0x01021994, "tmpfs"},  {0x858458f6, "ramfs"}, {0x794c7630, "overlay"},
      {0x6969, "nfs"},        {0x65735546, "fuse"},  {0x2fc12fc1, "zfs"},
      {0xF2F52010, "f2fs"},   {0x01021997, "9p"},    {0x0BD00BD0, "lustre"},
      {0x47504653, "gpfs"},   {0x73717368, "squashfs"}, {0x4d44, "vfat"}};
  const auto magic = static_cast<unsigned long>(sf.f_type) & 0xffffffffUL;
  for (const auto& n : kNames) {
    if (n.magic == magic) return n.name;
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, "0x%lx", magic);
  return buf;
}

bool is_memory_filesystem(const std::string& path) noexcept {
  struct statfs sf {};
  if (::statfs(path.c_str(), &sf) != 0) return false;
  const auto magic = static_cast<unsigned long>(sf.f_type) & 0xffffffffUL;
  return magic == 0x01021994UL || magic == 0x858458f6UL;
}

std::string find_on_path(const std::string& name) {
  const char* path = std::getenv("PATH");
  if (path == nullptr) return {};
  std::string_view rest(path);
  while (!rest.empty()) {
    const auto colon = rest.find(':');
    const std::string_view dir = rest.substr(0, colon);
    rest = colon == std::string_view::npos ? std::string_view{} : rest.substr(colon + 1);
    // Built by appending: GCC 12 warns (-Wrestrict, a false positive) on `dir = "."`.
    std::string cand(dir.empty() ? std::string_view(".") : dir);
    cand += '/';
    cand += name;
    if (::access(cand.c_str(), X_OK) == 0) return cand;
  }
  return {};
}

bool stderr_is_tty() noexcept { return ::isatty(STDERR_FILENO) == 1; }

int run_capture(const std::vector<std::string>& argv, std::string& out, std::string* err) {
  int po[2], pe[2];
  if (::pipe2(po, O_CLOEXEC) != 0) return -1;
  if (::pipe2(pe, O_CLOEXEC) != 0) {
    ::close(po[0]);
    ::close(po[1]);
    return -1;
  }
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  const pid_t pid = ::fork();
  if (pid < 0) {
    for (int fd : {po[0], po[1], pe[0], pe[1]}) ::close(fd);
    return -1;
  }
  if (pid == 0) {
    ::dup2(po[1], STDOUT_FILENO);
    ::dup2(pe[1], STDERR_FILENO);
    ::execvp(args[0], args.data());
    _exit(127);
  }
  ::close(po[1]);
  ::close(pe[1]);
  pollfd fds[2] = {{po[0], POLLIN, 0}, {pe[0], POLLIN, 0}};
  int open_fds = 2;
  char buf[65536];
  while (open_fds > 0) {
    if (::poll(fds, 2, -1) < 0) {
      if (errno == EINTR) continue;
      break;
    }
    for (int k = 0; k < 2; ++k) {
      if (fds[k].fd < 0 || fds[k].revents == 0) continue;
      const ssize_t n = ::read(fds[k].fd, buf, sizeof buf);
      if (n > 0) {
        if (k == 0) out.append(buf, static_cast<std::size_t>(n));
        else if (err != nullptr) err->append(buf, static_cast<std::size_t>(n));
      } else if (n == 0 || errno != EINTR) {
        ::close(fds[k].fd);
        fds[k].fd = -1;
        --open_fds;
      }
    }
  }
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {}
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return -1;
}

}  // namespace deepio::cli

namespace deepio::cli {

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

namespace {

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
  bool literal(std::string_view word) {
    if (t_.substr(i_, word.size()) != word) return fail("invalid literal");
    i_ += word.size();
    return true;
  }
  bool str(std::string& out) {
    ++i_;  // opening quote
    while (i_ < t_.size() && t_[i_] != '"') {
      char c = t_[i_++];
      if (c != '\\') {
        out.push_back(c);
        continue;
      }
      if (i_ >= t_.size()) break;
      c = t_[i_++];
      switch (c) {
        case 'n': out.push_back('\n'); break;
        case 't': out.push_back('\t'); break;
        case 'r': out.push_back('\r'); break;
        case 'b': out.push_back('\b'); break;
        case 'f': out.push_back('\f'); break;
        case 'u': {
          if (i_ + 4 > t_.size()) return fail("bad \\u escape");
          unsigned cp = 0;
          auto [p, ec] = std::from_chars(t_.data() + i_, t_.data() + i_ + 4, cp, 16);
          if (ec != std::errc() || p != t_.data() + i_ + 4) return fail("bad \\u escape");
          i_ += 4;
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
          break;
        }
        default: out.push_back(c);
      }
    }
    if (i_ >= t_.size()) return fail("unterminated string");
    ++i_;
    return true;
  }
  bool parse(JsonValue& v, int depth) {
    if (depth > 64) return fail("nesting too deep");
    ws();
    if (i_ >= t_.size()) return fail("unexpected end");
    const char c = t_[i_];
    if (c == '{') {
      v.type = JsonValue::Type::Object;
      ++i_;
      ws();
      if (i_ < t_.size() && t_[i_] == '}') { ++i_; return true; }
      while (true) {
        ws();
        if (i_ >= t_.size() || t_[i_] != '"') return fail("expected a string key");
        std::string key;
        if (!str(key)) return false;
        ws();
        if (i_ >= t_.size() || t_[i_] != ':') return fail("expected ':'");
        ++i_;
        JsonValue member;
        if (!parse(member, depth + 1)) return false;
        v.object.emplace_back(std::move(key), std::move(member));
        ws();
        if (i_ < t_.size() && t_[i_] == ',') { ++i_; continue; }
        if (i_ < t_.size() && t_[i_] == '}') { ++i_; return true; }
        return fail("expected ',' or '}'");
      }
    }
    if (c == '[') {
      v.type = JsonValue::Type::Array;
      ++i_;
      ws();
      if (i_ < t_.size() && t_[i_] == ']') { ++i_; return true; }
      while (true) {
        JsonValue item;
        if (!parse(item, depth + 1)) return false;
        v.array.push_back(std::move(item));
        ws();
        if (i_ < t_.size() && t_[i_] == ',') { ++i_; continue; }
        if (i_ < t_.size() && t_[i_] == ']') { ++i_; return true; }
        return fail("expected ',' or ']'");
      }
    }
    if (c == '"') {
      v.type = JsonValue::Type::String;
      return str(v.string);
    }
    if (c == 't') { v.type = JsonValue::Type::Bool; v.boolean = true; return literal("true"); }
    if (c == 'f') { v.type = JsonValue::Type::Bool; return literal("false"); }
    if (c == 'n') { v.type = JsonValue::Type::Null; return literal("null"); }
    // Number: from_chars does not take a leading '+', JSON has none either.
    v.type = JsonValue::Type::Number;
    auto [p, ec] = std::from_chars(t_.data() + i_, t_.data() + t_.size(), v.number);
    if (ec != std::errc()) return fail("invalid value");
    i_ = static_cast<std::size_t>(p - t_.data());
    return true;
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
