#include "common/svg.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <iomanip>
#include <limits>
#include <sstream>

#include "core/error.h"

namespace ex::svg {
namespace {

constexpr double kWidth = 440, kHeight = 320;                        // one panel
constexpr double kLeft = 64, kRight = 16, kTop = 52, kBottom = 48;   // margins around the plot area

std::string escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '<') out += "&lt;";
    else if (c == '>') out += "&gt;";
    else if (c == '&') out += "&amp;";
    else out += c;
  }
  return out;
}

// A "nice" tick step (1, 2 or 5 times a power of ten) giving about `count` ticks.
double tick_step(double span, int count) {
  if (!(span > 0)) return 1;
  double raw = span / count, mag = std::pow(10.0, std::floor(std::log10(raw))), f = raw / mag;
  return (f < 1.5 ? 1 : f < 3.5 ? 2 : f < 7.5 ? 5 : 10) * mag;
}

std::string number(double v) {
  std::ostringstream os;
  os << std::setprecision(4) << (std::abs(v) < 1e-12 ? 0.0 : v);
  return os.str();
}

void panel(std::ostringstream& os, const Chart& c, double ox) {
  double x0 = std::numeric_limits<double>::infinity(), x1 = -x0, y0 = x0, y1 = -x0;
  for (const Series& s : c.series) {
    for (double v : s.x) x0 = std::min(x0, v), x1 = std::max(x1, v);
    for (double v : s.y)
      if (std::isfinite(v)) y0 = std::min(y0, v), y1 = std::max(y1, v);
  }
  if (!std::isfinite(x0)) x0 = 0, x1 = 1, y0 = 0, y1 = 1;
  if (c.y_from_zero) y0 = std::min(0.0, y0);
  if (x1 <= x0) x1 = x0 + 1;
  if (y1 <= y0) y1 = y0 + 1;
  const double ystep = tick_step(y1 - y0, 5), xstep = tick_step(x1 - x0, 6);
  y0 = std::floor(y0 / ystep) * ystep;
  y1 = std::ceil(y1 / ystep) * ystep;

  const double pw = kWidth - kLeft - kRight, ph = kHeight - kTop - kBottom;
  auto px = [&](double x) { return ox + kLeft + (x - x0) / (x1 - x0) * pw; };
  auto py = [&](double y) { return kTop + (1 - (y - y0) / (y1 - y0)) * ph; };

  os << "<text x='" << ox + kWidth / 2 << "' y='22' text-anchor='middle' font-size='15'>" << escape(c.title)
     << "</text>\n";
  for (double y = y0; y <= y1 + ystep / 2; y += ystep) {  // horizontal grid and y ticks
    os << "<line x1='" << px(x0) << "' x2='" << px(x1) << "' y1='" << py(y) << "' y2='" << py(y)
       << "' stroke='#ddd'/>\n<text x='" << px(x0) - 6 << "' y='" << py(y) + 4
       << "' text-anchor='end' font-size='11'>" << number(y) << "</text>\n";
  }
  for (double x = std::ceil(x0 / xstep) * xstep; x <= x1 + xstep / 2; x += xstep) {
    os << "<text x='" << px(x) << "' y='" << py(y0) + 16 << "' text-anchor='middle' font-size='11'>" << number(x)
       << "</text>\n";
  }
  os << "<rect x='" << px(x0) << "' y='" << py(y1) << "' width='" << pw << "' height='" << ph
     << "' fill='none' stroke='#333'/>\n";
  os << "<text x='" << ox + kLeft + pw / 2 << "' y='" << kHeight - 10 << "' text-anchor='middle' font-size='12'>"
     << escape(c.x_label) << "</text>\n";
  os << "<text transform='translate(" << ox + 16 << "," << kTop + ph / 2
     << ") rotate(-90)' text-anchor='middle' font-size='12'>" << escape(c.y_label) << "</text>\n";

  for (size_t k = 0; k < c.series.size(); ++k) {
    const Series& s = c.series[k];
    os << "<polyline fill='none' stroke='" << s.color << "' stroke-width='2' points='";
    for (size_t i = 0; i < s.x.size() && i < s.y.size(); ++i)
      if (std::isfinite(s.y[i])) os << px(s.x[i]) << "," << py(s.y[i]) << " ";
    os << "'/>\n";
    // The legend runs in one row above the plot, where no curve can hide it.
    const double lx = ox + kLeft + 110 * static_cast<double>(k), ly = kTop - 10;
    os << "<line x1='" << lx << "' x2='" << lx + 20 << "' y1='" << ly - 4 << "' y2='" << ly - 4 << "' stroke='"
       << s.color << "' stroke-width='2'/>\n<text x='" << lx + 25 << "' y='" << ly << "' font-size='11'>"
       << escape(s.name) << "</text>\n";
  }
}

}  // namespace

std::string render(const std::vector<Chart>& charts) {
  std::ostringstream os;
  os << std::fixed << std::setprecision(1);
  const double width = kWidth * static_cast<double>(std::max<size_t>(1, charts.size()));
  os << "<svg xmlns='http://www.w3.org/2000/svg' width='" << width << "' height='" << kHeight
     << "' font-family='sans-serif'>\n<rect width='100%' height='100%' fill='white'/>\n";
  for (size_t i = 0; i < charts.size(); ++i) panel(os, charts[i], kWidth * static_cast<double>(i));
  os << "</svg>\n";
  return os.str();
}

void write(const std::string& path, const std::vector<Chart>& charts) {
  std::ofstream f(path);
  TG_CHECK(f.good(), "svg::write: cannot open '", path, "' for writing");
  f << render(charts);
  TG_CHECK(f.good(), "svg::write: failed writing '", path, "'");
}

}  // namespace ex::svg
