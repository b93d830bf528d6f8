#include "examples/study/plot.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include <fmt/format.h>

#include "report/report.h"

namespace tg::study {
namespace {

// Per model: a colour that is the same in every plot, and a line width and
// point type that keep a model visible when another's line lies on top of it
// (the LSTM's thick line under GPT's thin one when both recall perfectly).
struct Look {
  const char* colour;
  double width;
  int point;
};
Look look(const std::string& model) {
  if (model == "rnn") return {"#1f77b4", 2, 7};
  if (model == "lstm") return {"#ff7f0e", 5, 5};
  if (model == "gru") return {"#9467bd", 3.5, 9};
  if (model == "gpt") return {"#2ca02c", 2, 7};
  return {"#555555", 2, 7};
}

// gnuplot titles are single-quoted: a quote inside is doubled.
std::string quoted(const std::string& s) {
  std::string out = "'";
  for (char ch : s) out += ch == '\'' ? std::string("''") : std::string(1, ch);
  return out + "'";
}

bool has_bars(const Series& s) { return !s.ylo.empty() && s.ylo.size() == s.y.size() && s.yhi.size() == s.y.size(); }

// A line (or dashed line) with a spread is drawn over a band; points get
// error bars, linepoints error bars joined by lines.
bool has_band(const Series& s) { return has_bars(s) && (s.style == Series::line || s.style == Series::dashed); }

std::string style_of(const Series& s) {
  const Look l = look(s.model);
  const std::string lc = fmt::format("lc rgb '{}'", l.colour);
  if (has_bars(s) && !has_band(s))  // columns x y ylo yhi
    return s.style == Series::points ? fmt::format("with yerrorbars pt {} ps 1.0 lw 1.5 {}", l.point, lc)
                                     : fmt::format("with yerrorlines pt {} ps 0.6 lw {} {}", l.point, l.width, lc);
  switch (s.style) {  // a band's line: columns 1:2 of its four
    case Series::line: return fmt::format("{}with lines lw {} {}", has_band(s) ? "using 1:2 " : "", l.width, lc);
    case Series::points: return fmt::format("with points pt {} ps 1.0 {}", l.point, lc);
    case Series::dashed:
      return fmt::format("{}with lines lw {} dt 2 {}", has_band(s) ? "using 1:2 " : "", l.width, lc);
    case Series::linepoints: break;
  }
  return fmt::format("with linespoints pt {} ps 0.6 lw {} {}", l.point, l.width, lc);
}

// For the shell: 'a'\''b' is a'b.
std::string shell_quoted(const std::string& s) {
  std::string out = "'";
  for (char ch : s) out += ch == '\'' ? std::string("'\\''") : std::string(1, ch);
  return out + "'";
}

// Explicit ticks for a log axis ('x' or 'y') at 1, 2, 5 times powers of ten,
// more of them when the data span less than a factor of 20 (1, 1.5, 2, 3, 5,
// 7) or 5 (every digit and the halves below 3): gnuplot's own log ticks are at
// powers of the base only, so a narrow range would show one label or none.
std::string log_ticks(const Panel& p, char axis) {
  double lo = INFINITY, hi = 0;
  for (const Series& s : p.series)
    for (double v : axis == 'x' ? s.x : s.y)
      if (std::isfinite(v) && v > 0) lo = std::min(lo, v), hi = std::max(hi, v);
  if (!(hi > lo) || hi / lo > 1e6) return {};
  const std::vector<double> mantissas = hi / lo < 5    ? std::vector<double>{1, 1.5, 2, 2.5, 3, 4, 5, 6, 7, 8, 9}
                                        : hi / lo < 20 ? std::vector<double>{1, 1.5, 2, 3, 5, 7}
                                                       : std::vector<double>{1, 2, 5};
  std::vector<std::string> ticks;
  for (int e = static_cast<int>(std::floor(std::log10(lo))); e <= static_cast<int>(std::ceil(std::log10(hi))); ++e)
    for (double m : mantissas) {
      const double v = m * std::pow(10.0, e);
      if (v >= lo / 1.3 && v <= hi * 1.3) ticks.push_back(fmt::format("{:g}", v));
    }
  return ticks.size() < 2 ? std::string() : fmt::format("set {}tics ({})\n", axis, fmt::join(ticks, ", "));
}

}  // namespace

std::string plot(const std::string& png, const std::vector<Panel>& panels, int width, int height) {
  if (std::system("command -v gnuplot >/dev/null 2>&1") != 0)
    return "gnuplot is not installed (apt-get install gnuplot-nox)";
  const std::string stem = png.ends_with(".png") ? png.substr(0, png.size() - 4) : png;
  std::string dat, gp = fmt::format(
      "set terminal pngcairo size {},{} font 'sans,10' noenhanced\nset output {}\n", width, height, quoted(png));
  if (panels.size() > 1) gp += fmt::format("set multiplot layout 1,{}\n", panels.size());
  int block = 0;  // gnuplot's data block index
  for (const Panel& p : panels) {
    gp += "reset\nset grid\n";
    gp += fmt::format("set title {}\nset xlabel {}\nset ylabel {}\nset key {}\n", quoted(p.title), quoted(p.xlabel),
                      quoted(p.ylabel), p.key);
    if (p.logx)  // base 10: ticks at 1, 2, 5; base 2 (context lengths): gnuplot's powers of two
      gp += fmt::format("set logscale x {}\nset format x '%g'\n", p.xbase) + (p.xbase == 10 ? log_ticks(p, 'x') : "");
    else
      gp += "unset logscale x\n";
    if (!p.xtics.empty()) gp += fmt::format("set xtics ({})\n", fmt::join(p.xtics, ", "));
    // The data's own range plus a margin (not gnuplot's widening to whole tick intervals, which
    // on a log axis can add decades of empty space).
    gp += "set autoscale xfix\nset autoscale yfix\nset offsets graph 0.03, graph 0.03, graph 0.08, graph 0.08\n";
    gp += p.logy ? "set logscale y\nset format y '%g'\n" + log_ticks(p, 'y') : "unset logscale y\n";
    if (!std::isnan(p.ymin) || !std::isnan(p.ymax))
      gp += fmt::format("set yrange [{}:{}]\n", std::isnan(p.ymin) ? "*" : fmt::format("{}", p.ymin),
                        std::isnan(p.ymax) ? "*" : fmt::format("{}", p.ymax));
    // Markers outside the data's x range would land in the next panel (labels are not clipped).
    double lo = INFINITY, hi = -INFINITY;
    for (const Series& s : p.series)
      for (double x : s.x) lo = std::min(lo, x), hi = std::max(hi, x);
    // A marker's label goes on the side of its line with more room: left of a
    // line in the right part of the panel, so it does not run off the frame.
    for (size_t m = 0; m < p.markers.size(); ++m) {
      const double x = p.markers[m].x;
      if (!(x >= lo && x <= hi)) continue;
      const double at = p.logx ? std::log(x / lo) / std::log(hi / lo) : (x - lo) / (hi - lo);
      gp += fmt::format(
          "set arrow {0} from {1},graph 0 to {1},graph 1 nohead dt 3 lw 1.5 lc rgb '#444444'\n"
          "set label {0} {2} at {1},graph {3} {4} textcolor rgb '#444444'\n",
          m + 1, x, quoted(p.markers[m].label), 0.96 - 0.06 * static_cast<double>(m),
          at > 0.5 ? "right offset -0.5,0" : "left offset 0.5,0");
    }
    std::vector<std::string> items;
    for (const Series& s : p.series) {
      dat += fmt::format("# {}\n", s.title);
      for (size_t i = 0; i < s.x.size() && i < s.y.size(); ++i)
        if (std::isfinite(s.x[i]) && std::isfinite(s.y[i]) && !(p.logy && s.y[i] <= 0)) {
          // On a log axis a spread down to 0 (or below) is drawn down to the value itself.
          const double lo = has_bars(s) && p.logy && !(s.ylo[i] > 0) ? s.y[i] : has_bars(s) ? s.ylo[i] : 0;
          dat += has_bars(s) ? fmt::format("{:.9g} {:.9g} {:.9g} {:.9g}\n", s.x[i], s.y[i], lo, s.yhi[i])
                             : fmt::format("{:.9g} {:.9g}\n", s.x[i], s.y[i]);
        }
      dat += "\n\n";  // gnuplot separates data blocks by two blank lines
      if (has_band(s))
        items.push_back(fmt::format("{} index {} using 1:3:4 with filledcurves fs transparent solid 0.18 noborder "
                                    "lc rgb '{}' notitle", quoted(stem + ".dat"), block, look(s.model).colour));
      items.push_back(fmt::format("{} index {} {} {}", quoted(stem + ".dat"), block++, style_of(s),
                                  s.title.empty() ? "notitle" : "title " + quoted(s.title)));
    }
    if (p.hline != 0) items.push_back(fmt::format("{} with lines dt 3 lw 1.5 lc rgb '#888888' title {}", p.hline,
                                                  quoted(p.hline_label)));
    gp += "plot ";
    for (size_t i = 0; i < items.size(); ++i) gp += (i ? ", \\\n     " : "") + items[i];
    gp += "\n";
  }
  if (panels.size() > 1) gp += "unset multiplot\n";
  report::write_file(stem + ".dat", dat);
  report::write_file(stem + ".gp", gp);
  const std::string log = stem + ".gnuplot.log";
  if (std::system(fmt::format("gnuplot {} 2>{}", shell_quoted(stem + ".gp"), shell_quoted(log)).c_str()) != 0)
    return fmt::format("gnuplot failed on {}.gp (see {})", stem, log);
  std::remove(log.c_str());
  return {};
}

}  // namespace tg::study
