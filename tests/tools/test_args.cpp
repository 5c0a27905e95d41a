// The argument parser: good and bad flags, sizes, and every problem collected in one pass.
#include <gtest/gtest.h>

#include "args.hpp"
#include "format.hpp"

namespace deepio::cli {
namespace {

ArgParser sample_parser() {
  ArgParser p("deepio demo", "A demo command.");
  p.value("--folder", "FOLDER", "Folder for I/O files");
  p.list("--nvme_dir", "DIR", "Folders");
  p.value("--io_size", "SIZE", "Bytes per process", "400M");
  p.value("--loops", "N", "Loops", "3");
  p.flag("--read", "Read test");
  p.flag("--secret", "Not shown", true);
  p.value("--a_really_long_option_name", "VALUE", "Wraps to the next line");
  p.flag("--use_gds", "GPUDirect Storage");
  p.alias("--gds", "--use_gds");
  p.value("--direct_io", "MODE", "O_DIRECT", "auto");
  p.alias("--direct", "--direct_io");
  return p;
}

ParsedArgs parse(const std::vector<std::string>& words, std::vector<std::string>& errors, bool positional = false) {
  return sample_parser().parse(words, errors, positional);
}

TEST(Args, GoodFlagsInEveryForm) {
  std::vector<std::string> errors;
  const ParsedArgs a = parse(
      {"--folder", "/x", "--io_size=1G", "--read", "--nvme_dir", "a", "b", "c", "--loops", "2", "--loops", "5"},
      errors);
  EXPECT_TRUE(errors.empty()) << errors.front();
  EXPECT_EQ(a.get("--folder"), "/x");
  EXPECT_EQ(a.get("--io_size"), "1G");
  EXPECT_TRUE(a.has("--read"));
  EXPECT_FALSE(a.has("--secret"));
  EXPECT_EQ(a.list("--nvme_dir"), (std::vector<std::string>{"a", "b", "c"}));
  EXPECT_EQ(a.get("--loops"), "5") << "the last value wins";
  EXPECT_EQ(a.get("--absent", "fallback"), "fallback");
  EXPECT_TRUE(a.list("--absent").empty());
}

// An old spelling parses as the flag it names, in every form, and stays out of --help.
TEST(Args, AliasesAreTheSameFlag) {
  std::vector<std::string> errors;
  ParsedArgs a = parse({"--gds", "--direct", "off"}, errors);
  EXPECT_TRUE(errors.empty()) << errors.front();
  EXPECT_TRUE(a.has("--use_gds"));
  EXPECT_FALSE(a.has("--gds"));
  EXPECT_EQ(a.get("--direct_io"), "off");
  a = parse({"--direct=on", "--direct_io", "auto"}, errors);
  EXPECT_EQ(a.get("--direct_io"), "auto") << "the last value wins across spellings";
  a = parse({"--use_gds", "--direct_io=off"}, errors);
  EXPECT_TRUE(errors.empty()) << errors.front();
  EXPECT_TRUE(a.has("--use_gds"));
  EXPECT_EQ(a.get("--direct_io"), "off");
  (void)parse({"--gds=1", "--direct"}, errors);
  EXPECT_EQ(errors, (std::vector<std::string>{"--use_gds takes no value", "--direct_io needs a value (MODE)"}));
  const std::string help = sample_parser().help();
  EXPECT_NE(help.find("--use_gds"), std::string::npos);
  EXPECT_EQ(help.find("--gds "), std::string::npos) << help;
  EXPECT_EQ(help.find("--direct "), std::string::npos) << help;
}

TEST(Args, HelpAnywhereAndValuesThatLookLikeShortFlags) {
  std::vector<std::string> errors;
  ParsedArgs a = parse({"--read", "-h"}, errors);
  EXPECT_TRUE(a.has("--help"));
  a = parse({"--folder", "-x"}, errors);  // one dash: a value, as argparse would not take it
  EXPECT_EQ(a.get("--folder"), "-x");
  EXPECT_TRUE(errors.empty());
}

TEST(Args, EveryProblemIsCollectedInOrder) {
  std::vector<std::string> errors;
  const ParsedArgs a = parse(
      {"stray", "--nope", "v1", "v2", "--read=yes", "--nvme_dir", "a", "--nvme_dir", "b", "--loops", "--folder"},
      errors);
  EXPECT_EQ(errors, (std::vector<std::string>{
                        "unexpected argument 'stray'",
                        "unknown flag --nope (see --help)",  // one error: its values are skipped
                        "--read takes no value",
                        "--nvme_dir given more than once",
                        "--loops needs a value (N)",
                        "--folder needs a value (FOLDER)",
                    }));
  EXPECT_TRUE(a.has("--read"));
}

TEST(Args, EmptyListAndPositionalWords) {
  std::vector<std::string> errors;
  parse({"--nvme_dir", "--read"}, errors);
  EXPECT_EQ(errors, (std::vector<std::string>{"--nvme_dir needs at least one value (DIR)"}));
  errors.clear();
  const ParsedArgs a = parse({"one", "--read", "two"}, errors, true);
  EXPECT_TRUE(errors.empty());
  EXPECT_EQ(a.positional, (std::vector<std::string>{"one", "two"}));
}

TEST(Args, ArgvFormSkipsTheWordsBeforeFirst) {
  const char* words[] = {"deepio", "demo", "--folder", "/d", "--read"};
  std::vector<std::string> errors;
  const ParsedArgs a = sample_parser().parse(5, const_cast<char**>(words), 2, errors);
  EXPECT_TRUE(errors.empty());
  EXPECT_EQ(a.get("--folder"), "/d");
  EXPECT_TRUE(a.has("--read"));
}

TEST(Args, ParseOrHelpPrintsTheHelpOnly) {
  const ArgParser p = sample_parser();
  const char* with_help[] = {"demo", "--bogus", "--help"};
  std::vector<std::string> errors;
  ParsedArgs a;
  testing::internal::CaptureStdout();
  EXPECT_TRUE(parse_or_help(p, 3, const_cast<char**>(with_help), a, errors));
  EXPECT_EQ(testing::internal::GetCapturedStdout(), p.help()) << "--help wins over a bad flag";
  const char* without[] = {"demo", "--read"};
  errors.clear();
  testing::internal::CaptureStdout();
  EXPECT_FALSE(parse_or_help(p, 2, const_cast<char**>(without), a, errors));
  EXPECT_EQ(testing::internal::GetCapturedStdout(), "");
  EXPECT_TRUE(a.has("--read"));
}

TEST(Args, SizesWithSuffixes) {
  EXPECT_EQ(parse_size("4096"), 4096U);
  EXPECT_EQ(parse_size("64K"), 64U << 10);
  EXPECT_EQ(parse_size("64k"), 64U << 10);
  EXPECT_EQ(parse_size("1M"), 1U << 20);
  EXPECT_EQ(parse_size("1MB"), 1U << 20);
  EXPECT_EQ(parse_size("1MiB"), 1U << 20);
  EXPECT_EQ(parse_size("1G"), 1ULL << 30);
  EXPECT_EQ(parse_size("2t"), 2ULL << 40);
  EXPECT_EQ(parse_size("0"), 0U);
  EXPECT_EQ(parse_size("16777215T"), 16777215ULL << 40);
  for (const char* bad : {"", "M", "-1", "1.5M", "1X", "1iB", "iB", "1 M", "+1", "16777216T", "99999999999999999999"}) {
    EXPECT_FALSE(parse_size(bad).has_value()) << bad;
  }
  EXPECT_EQ(parse_uint("18446744073709551615"), UINT64_MAX);
  EXPECT_FALSE(parse_uint("18446744073709551616").has_value());
  EXPECT_FALSE(parse_uint("1K").has_value());
}

TEST(Args, SizeAndCountFlagsExplainWhatIsWrong) {
  std::vector<std::string> errors;
  ArgParser p("t", "");
  p.value("--size", "SIZE", "");
  p.value("--n", "N", "");
  const ParsedArgs good = p.parse({"--size", "64K", "--n", "0"}, errors);
  EXPECT_EQ(size_arg(good, "--size", errors), 64U << 10);
  EXPECT_EQ(count_arg(good, "--n", errors, true), 0U);
  EXPECT_FALSE(size_arg(good, "--absent", errors).has_value());
  EXPECT_TRUE(errors.empty());

  const ParsedArgs bad = p.parse({"--size", "1X", "--n", "0"}, errors);
  EXPECT_FALSE(size_arg(bad, "--size", errors).has_value());
  EXPECT_FALSE(count_arg(bad, "--n", errors).has_value());
  const ParsedArgs zero = p.parse({"--size", "0", "--n", "1000000001"}, errors);
  EXPECT_FALSE(size_arg(zero, "--size", errors).has_value());
  EXPECT_FALSE(count_arg(zero, "--n", errors).has_value());
  EXPECT_EQ(errors, (std::vector<std::string>{
                        "--size: '1X' is not a size (a number of bytes with an optional K, M, G or T suffix, e.g. 1M)",
                        "--n: must be at least 1",
                        "--size: must be greater than 0",
                        "--n: '1000000001' is not a whole number",
                    }));
}

TEST(Args, HelpLayout) {
  const std::string h = sample_parser().help();
  EXPECT_EQ(h.substr(0, h.find("options:")), "usage: deepio demo [options]\n\nA demo command.\n\n");
  // Descriptions start in column 33; defaults follow them; hidden flags are absent.
  EXPECT_NE(h.find("\n  --folder FOLDER               Folder for I/O files\n"), std::string::npos) << h;
  EXPECT_NE(h.find("\n  --io_size SIZE                Bytes per process (default: 400M)\n"), std::string::npos) << h;
  EXPECT_NE(h.find("\n  --nvme_dir DIR [DIR ...]      Folders\n"), std::string::npos) << h;
  EXPECT_NE(h.find("\n  --a_really_long_option_name VALUE\n" + std::string(32, ' ') + "Wraps to the next line\n"),
            std::string::npos)
      << h;
  EXPECT_EQ(h.find("--secret"), std::string::npos);
}

}  // namespace
}  // namespace deepio::cli
