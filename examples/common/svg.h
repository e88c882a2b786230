// A tiny SVG line-chart writer: enough to plot training curves without a plotting library.
// Several charts are laid out side by side in one file.
#pragma once
#include <string>
#include <vector>

namespace ex::svg {

struct Series {
  std::string name;
  std::vector<double> x, y;
  std::string color = "#1f77b4";
};

struct Chart {
  std::string title, x_label, y_label;
  std::vector<Series> series;
  bool y_from_zero = false;  // start the y axis at 0 (accuracy) instead of the data's minimum
};

// Writes the charts into `path`; throws tg::Error if the file cannot be written.
void write(const std::string& path, const std::vector<Chart>& charts);

// The SVG text itself (what write() stores), for tests.
std::string render(const std::vector<Chart>& charts);

}  // namespace ex::svg
