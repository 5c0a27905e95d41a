// What the benchmark programs share: CPU time of the whole process, and a small reader for
// "--flag value" command lines that exits with status 2 and a message on bad input.
#pragma once

#include <sys/resource.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

namespace deepio::bench {

/// User + system seconds of every thread of this process so far (workers included).
inline double cpu_seconds() {
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  auto tv = [](timeval t) { return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_usec) * 1e-6; };
  return tv(ru.ru_utime) + tv(ru.ru_stime);
}

/// Walks argv; `flag()` is the current argument, `value()` consumes the next one (exiting with
/// a message when it is missing), `number()` parses it as an unsigned integer.
class Args {
 public:
  Args(const char* program, int argc, char** argv) : program_(program), argc_(argc), argv_(argv) {}
  bool next() { return ++i_ < argc_; }
  [[nodiscard]] std::string_view flag() const { return argv_[i_]; }
  std::string value() {
    if (i_ + 1 >= argc_) fail(std::string(argv_[i_]) + " needs a value");
    return argv_[++i_];
  }
  std::size_t number() {
    const std::string v = value();
    char* end = nullptr;
    const unsigned long long n = std::strtoull(v.c_str(), &end, 10);
    if (v.empty() || *end != '\0') fail(std::string(argv_[i_ - 1]) + " needs a number, not '" + v + "'");
    return static_cast<std::size_t>(n);
  }
  [[noreturn]] void fail(const std::string& message) const {
    std::fprintf(stderr, "%s: %s\n", program_, message.c_str());
    std::exit(2);
  }
  [[noreturn]] void unknown() const { fail(std::string("unknown argument ") + argv_[i_]); }

 private:
  const char* program_;
  int argc_;
  char** argv_;
  int i_ = 0;
};

}  // namespace deepio::bench
