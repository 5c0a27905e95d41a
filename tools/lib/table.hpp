// Text report tables, laid out as printf's "%-Ns" / "%Ns" would: each column padded to its
// width, left or right aligned, never cut (a longer cell pushes the rest of its row right),
// columns separated by `gap` spaces, every row indented by `indent` spaces. The last column
// is usually width 0: unpadded.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

namespace deepio::cli {

enum class Align { Left, Right };

struct Column {
  std::size_t width = 0;
  Align align = Align::Left;
  std::size_t gap = 1;  ///< spaces before this column (ignored for the first)
};

class Table {
 public:
  explicit Table(std::vector<Column> columns, std::size_t indent = 0) : columns_(std::move(columns)), indent_(indent) {}
  /// Adds a row; missing cells are empty, extra cells are an error (std::invalid_argument).
  Table& row(std::vector<std::string> cells);
  /// Every row, each ending with "\n".
  [[nodiscard]] std::string str() const;
  /// One row on its own.
  [[nodiscard]] std::string format_row(const std::vector<std::string>& cells) const;

 private:
  std::vector<Column> columns_;
  std::size_t indent_;
  std::vector<std::vector<std::string>> rows_;
};

/// `cell` padded to `width` as printf("%-*s") / printf("%*s") does.
[[nodiscard]] std::string pad(const std::string& cell, std::size_t width, Align align);
/// "name ......" : the name, a space, then dots up to `width` (ds_report's leader lines).
[[nodiscard]] std::string dots(const std::string& name, std::size_t width);

}  // namespace deepio::cli
