// The subprocess runner on real programs: exit statuses, signals, both streams, a missing
// program, output large enough to fill both pipes at once.
#include <sys/stat.h>

#include <cerrno>
#include <fstream>

#include <gtest/gtest.h>

#include "common/support.hpp"
#include "process.hpp"

namespace deepio::cli {
namespace {

TEST(Process, ExitStatuses) {
  EXPECT_EQ(run_process({"true"}).status, 0);
  EXPECT_TRUE(run_process({"true"}).ok());
  const ProcessResult f = run_process({"false"});
  EXPECT_EQ(f.status, 1);
  EXPECT_TRUE(f.started());
  EXPECT_FALSE(f.ok());
  EXPECT_EQ(run_process({"sh", "-c", "exit 3"}).status, 3);
  EXPECT_EQ(run_process({"sh", "-c", "kill -TERM $$"}).status, 128 + 15);
}

TEST(Process, CapturesStdoutAndStderrApart) {
  const ProcessResult r = run_process({"sh", "-c", "echo out; echo err >&2; printf 'no newline'"});
  EXPECT_EQ(r.status, 0);
  EXPECT_EQ(r.out, "out\nno newline");
  EXPECT_EQ(r.err, "err\n");
}

TEST(Process, ArgumentsAreNeitherSplitNorExpanded) {
  const ProcessResult r = run_process({"printf", "%s|", "a b", "$HOME", "*", ""});
  EXPECT_EQ(r.out, "a b|$HOME|*||");
}

TEST(Process, BothPipesFullDoNotDeadlock) {
  // 1 MiB on each stream, interleaved: more than a pipe holds, so the runner must read both.
  const ProcessResult r = run_process(
      {"sh", "-c",
       "i=0; while [ $i -lt 16 ]; do head -c 65536 /dev/zero; head -c 65536 /dev/zero >&2; i=$((i+1)); done"});
  EXPECT_EQ(r.status, 0);
  EXPECT_EQ(r.out.size(), 1U << 20);
  EXPECT_EQ(r.err.size(), 1U << 20);
}

TEST(Process, AMissingProgramIsNotStarted) {
  const ProcessResult r = run_process({"deepio-no-such-program-3141"});
  EXPECT_FALSE(r.started());
  EXPECT_EQ(r.spawn_errno, ENOENT);
  EXPECT_EQ(r.status, -1);
  EXPECT_FALSE(r.ok());
  const ProcessResult empty = run_process({});
  EXPECT_EQ(empty.spawn_errno, EINVAL);
}

TEST(Process, AFileThatIsNotExecutable) {
  test::TempDir dir;
  const std::string f = dir.file("not-a-program");
  std::ofstream(f) << "#!/bin/sh\necho hi\n";
  ::chmod(f.c_str(), 0644);
  const ProcessResult r = run_process({f});
  EXPECT_FALSE(r.started());
  EXPECT_EQ(r.spawn_errno, EACCES);
  ::chmod(f.c_str(), 0755);
  EXPECT_EQ(run_process({f}).out, "hi\n");
}

TEST(Process, FindOnPath) {
  const std::string sh = find_on_path("sh");
  ASSERT_FALSE(sh.empty());
  EXPECT_EQ(sh.back(), 'h');
  EXPECT_TRUE(run_process({sh, "-c", "exit 0"}).ok());
  EXPECT_TRUE(find_on_path("deepio-no-such-program-3141").empty());
}

}  // namespace
}  // namespace deepio::cli
