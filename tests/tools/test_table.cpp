// Report tables: the same layout printf("%-6s %-30s %8s ...") gives, without its buffer.
#include <cstdio>
#include <random>
#include <stdexcept>

#include <gtest/gtest.h>

#include "table.hpp"

namespace deepio::cli {
namespace {

TEST(Table, PadsLikePrintfAndNeverCuts) {
  EXPECT_EQ(pad("ab", 5, Align::Left), "ab   ");
  EXPECT_EQ(pad("ab", 5, Align::Right), "   ab");
  EXPECT_EQ(pad("abcdef", 3, Align::Left), "abcdef");
  EXPECT_EQ(pad("", 0, Align::Right), "");
}

TEST(Table, RowsMatchTheEquivalentPrintfFormat) {
  const Table t({{6}, {30}, {8, Align::Right}, {9, Align::Right}, {0, Align::Left, 2}});
  std::mt19937 rng(3);
  auto word = [&](std::size_t max) {
    std::string s(rng() % (max + 1), 'x');
    for (auto& c : s) c = static_cast<char>('a' + rng() % 26);
    return s;
  };
  for (int i = 0; i < 200; ++i) {
    // Cells sometimes wider than their column: both push the rest of the row right.
    const std::vector<std::string> cells = {word(9), word(40), word(11), word(12), word(20)};
    char expect[256];
    std::snprintf(expect, sizeof expect, "%-6s %-30s %8s %9s  %s\n", cells[0].c_str(), cells[1].c_str(),
                  cells[2].c_str(), cells[3].c_str(), cells[4].c_str());
    EXPECT_EQ(t.format_row(cells), expect);
  }
}

TEST(Table, IndentMissingCellsAndTooManyCells) {
  Table t({{3}, {4, Align::Right}, {0}}, 2);
  t.row({"a", "1", "x"}).row({"bb"});
  EXPECT_EQ(t.str(), "  a      1 x\n  bb       \n");  // empty cells are padded too
  EXPECT_THROW(t.row({"1", "2", "3", "4"}), std::invalid_argument);
}

TEST(Table, DotLeaders) {
  EXPECT_EQ(dots("async_io", 24), "async_io ...............");
  EXPECT_EQ(dots("async_io", 24).size(), 24U);
  EXPECT_EQ(dots("a_name_longer_than_the_width", 10), "a_name_longer_than_the_width ");
}

}  // namespace
}  // namespace deepio::cli
