// The machine as the command sees it: one file-system name table with the platform, folder
// checks, the default folder, and the size a comparison picks.
#include <sys/stat.h>
#include <sys/statfs.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "common/support.hpp"
#include "compare.hpp"
#include "platform/sys.hpp"
#include "system.hpp"

namespace deepio::cli {
namespace {

TEST(FileSystems, OneTableForTheEngineAndTheCommand) {
  test::TempDir dir;
  // What `deepio info` and the bench print for a folder is what DirectIoInfo says.
  EXPECT_EQ(filesystem_of(dir.path().string()), probe_direct_io(dir.path().string()).filesystem);
  for (const char* path : {"/", "/proc", "/dev", "/dev/shm", "/sys"}) {
    struct statfs sf {};
    if (::statfs(path, &sf) != 0) continue;
    EXPECT_EQ(filesystem_of(path), detail::filesystem_type_name(static_cast<std::uint64_t>(sf.f_type))) << path;
  }
  EXPECT_EQ(filesystem_of("/no/such/folder"), "unknown");
}

TEST(FileSystems, TheTable) {
  const std::pair<std::uint64_t, const char*> known[] = {
      {0xEF53, "ext4"},      {0x58465342, "xfs"},       {0x9123683E, "btrfs"}, {0x01021994, "tmpfs"},
      {0x858458f6, "ramfs"}, {0x794c7630, "overlayfs"}, {0x6969, "nfs"},       {0x65735546, "fuse"},
      {0x2fc12fc1, "zfs"},   {0xF2F52010, "f2fs"},      {0x01021997, "9p"},    {0x0BD00BD0, "lustre"},
      {0x47504653, "gpfs"},  {0x73717368, "squashfs"},  {0x4d44, "vfat"},
  };
  for (const auto& [magic, name] : known) EXPECT_EQ(detail::filesystem_type_name(magic), name) << name;
  EXPECT_EQ(detail::filesystem_type_name(0xFFFFFFFFF2F52010ULL), "f2fs") << "sign-extended f_type";
  EXPECT_EQ(detail::filesystem_type_name(0x1234), "0x1234");
}

TEST(FileSystems, MemoryFolders) {
  struct statfs sf {};
  if (::statfs("/dev/shm", &sf) != 0 || filesystem_of("/dev/shm") != "tmpfs") GTEST_SKIP() << "no tmpfs at /dev/shm";
  EXPECT_TRUE(is_memory_filesystem("/dev/shm"));
  test::TempDir dir;
  EXPECT_EQ(is_memory_filesystem(dir.path().string()), filesystem_of(dir.path().string()) == "tmpfs");
}

TEST(Folders, Problems) {
  test::TempDir dir;
  EXPECT_EQ(folder_problem(dir.path().string()), "");
  EXPECT_EQ(folder_problem(dir.file("absent")), "folder '" + dir.file("absent") + "' does not exist");
  std::ofstream(dir.file("f")) << "x";
  EXPECT_EQ(folder_problem(dir.file("f")), "'" + dir.file("f") + "' is not a folder");
  const std::string proc = folder_problem("/proc");  // root may write anywhere but here
  EXPECT_EQ(proc.rfind("folder '/proc' is not writable (", 0), 0U) << proc;
  EXPECT_FALSE(std::filesystem::exists(dir.file(".deepio-write-test-" + std::to_string(::getpid()))))
      << "the probe file is removed";
}

TEST(Folders, DefaultFolderHonoursTheEnvironmentAndSkipsMemory) {
  test::TempDir dir;
  const char* old = std::getenv("DEEPIO_BENCH_DIR");
  const std::string saved = old != nullptr ? old : "";
  ::setenv("DEEPIO_BENCH_DIR", dir.path().c_str(), 1);
  std::string why;
  const std::string picked = pick_disk_folder(&why);
  if (is_memory_filesystem(dir.path().string())) {
    EXPECT_NE(picked, dir.path().string());
  } else {
    EXPECT_EQ(picked, dir.path().string());
  }
  ::setenv("DEEPIO_BENCH_DIR", dir.file("absent").c_str(), 1);
  const std::string next = pick_disk_folder(&why);
  EXPECT_NE(next, dir.file("absent"));
  if (old != nullptr) ::setenv("DEEPIO_BENCH_DIR", saved.c_str(), 1);
  else ::unsetenv("DEEPIO_BENCH_DIR");
}

TEST(Folders, TemporaryFoldersAreRemoved) {
  test::TempDir dir;
  const std::string t = make_temp_dir(dir.path().string(), "unit");
  EXPECT_EQ(t.rfind(dir.file("deepio-unit-"), 0), 0U) << t;
  register_temp_file(t + "/a.bin");
  std::ofstream(t + "/a.bin") << "data";
  remove_temp_dir();
  EXPECT_FALSE(std::filesystem::exists(t));
  EXPECT_THROW(make_temp_dir(dir.file("absent"), "unit"), std::runtime_error);
}

// --keep: what was registered is forgotten, so no way out (remove_temp_dir, exit) removes it.
TEST(Folders, KeptFoldersStay) {
  test::TempDir dir;
  const std::string t = make_temp_dir(dir.path().string(), "unit");
  register_temp_file(t + "/a.bin");
  std::ofstream(t + "/a.bin") << "data";
  keep_temp_files();
  remove_temp_dir();
  EXPECT_TRUE(std::filesystem::exists(t + "/a.bin"));
}

// Several folders at once (bench and tune): each one usable, none twice; two on one file
// system give a note, not an error.
TEST(Folders, SetOfFoldersChecked) {
  test::TempDir dir;
  const std::string a = dir.file("a"), b = dir.file("b");
  std::filesystem::create_directories(a);
  std::filesystem::create_directories(b);
  EXPECT_TRUE(folder_set_problems({a, b}, "--folder").empty());
  EXPECT_EQ(folder_set_problems({a, b, a + "/."}, "--folder"),
            std::vector<std::string>{"--folder: folder '" + a + "/.' is given twice (the same folder as '" + a + "')"});
  const std::vector<std::string> missing = folder_set_problems({a, dir.file("absent"), dir.file("absent")}, "--x");
  ASSERT_EQ(missing.size(), 2U) << "each missing one named, once each";
  EXPECT_EQ(missing[0], "folder '" + dir.file("absent") + "' does not exist");

  const std::string note = same_device_note({a, b});
  EXPECT_EQ(note, "'" + a + "' and '" + b +
                      "' are on the same file system (one device): the aggregate is not a sum of drives");
  EXPECT_EQ(same_device_note({a}), "");
  struct stat sa {
  }, sp{};
  ASSERT_EQ(::stat(a.c_str(), &sa), 0);
  if (::stat("/proc", &sp) == 0 && sp.st_dev != sa.st_dev) {
    EXPECT_EQ(same_device_note({a, "/proc"}), "");
  }
}

TEST(CompareSize, ChosenFromDiskAndMemory) {
  constexpr std::uint64_t G = 1ULL << 30, M = 1ULL << 20;
  SizeChoice c = choose_size(std::nullopt, 100 * G, 64 * G, 1 << 20, "/d");
  EXPECT_EQ(c.nbytes, G);
  EXPECT_EQ(c.reason, "1 GiB");
  c = choose_size(std::nullopt, 4 * G, 64 * G, 1 << 20, "/d");
  EXPECT_EQ(c.nbytes, 512 * M);
  EXPECT_EQ(c.reason, "1/8 of free disk");
  c = choose_size(std::nullopt, 100 * G, 2 * G + 5 * M, 8 << 20, "/d");
  EXPECT_EQ(c.nbytes, 256 * M) << "1/8 of RAM in whole 8 MiB blocks";
  EXPECT_EQ(c.reason, "1/8 of RAM");
  EXPECT_TRUE(c.error.empty());
  c = choose_size(std::nullopt, 100 * M, 64 * G, 1 << 20, "/d");
  EXPECT_EQ(c.error, "not enough room for a meaningful run in /d (100 MiB free disk, 64.00 GiB RAM); give --size");
  c = choose_size(1000, 100 * G, 64 * G, 1 << 20, "/d");
  EXPECT_EQ(c.nbytes, 4096U) << "rounded up to whole O_DIRECT blocks";
  EXPECT_EQ(c.reason, "--size");
  c = choose_size(G, 2 * G, 64 * G, 1 << 20, "/d");
  EXPECT_EQ(c.error, "not enough free space in /d: need 3.00 GiB for 3 files, 2.00 GiB free");
}

}  // namespace
}  // namespace deepio::cli
