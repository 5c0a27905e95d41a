#include "table.hpp"

#include <stdexcept>

namespace deepio::cli {

std::string pad(const std::string& cell, std::size_t width, Align align) {
  if (cell.size() >= width) return cell;
  const std::string fill(width - cell.size(), ' ');
  return align == Align::Left ? cell + fill : fill + cell;
}

std::string dots(const std::string& name, std::size_t width) {
  std::string s = name + " ";
  if (s.size() < width) s.append(width - s.size(), '.');
  return s;
}

Table& Table::row(std::vector<std::string> cells) {
  if (cells.size() > columns_.size()) {
    throw std::invalid_argument("table row has " + std::to_string(cells.size()) + " cells for " +
                                std::to_string(columns_.size()) + " columns");
  }
  cells.resize(columns_.size());
  rows_.push_back(std::move(cells));
  return *this;
}

std::string Table::format_row(const std::vector<std::string>& cells) const {
  std::string line(indent_, ' ');
  for (std::size_t c = 0; c < columns_.size(); ++c) {
    if (c > 0) line.append(columns_[c].gap, ' ');
    const std::string empty;
    line += pad(c < cells.size() ? cells[c] : empty, columns_[c].width, columns_[c].align);
  }
  return line + "\n";
}

std::string Table::str() const {
  std::string out;
  for (const auto& r : rows_) out += format_row(r);
  return out;
}

}  // namespace deepio::cli
