#include "examples/study/plot.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>

#include <fmt/format.h>

#include "examples/common/report.h"

namespace tg::study {
namespace {

std::string colour(const std::string& model) {
  if (model == "rnn") return "#1f77b4";
  if (model == "lstm") return "#ff7f0e";
  if (model == "gru") return "#9467bd";
  if (model == "gpt") return "#2ca02c";
  return "#555555";
}

// gnuplot titles are single-quoted: a quote inside is doubled.
std::string quoted(const std::string& s) {
  std::string out = "'";
  for (char ch : s) out += ch == '\'' ? std::string("''") : std::string(1, ch);
  return out + "'";
}

std::string style_of(const Series& s) {
  const std::string lc = fmt::format("lc rgb '{}'", colour(s.model));
  switch (s.style) {
    case Series::line: return "with lines lw 2 " + lc;
    case Series::points: return "with points pt 7 ps 1.0 " + lc;
    case Series::dashed: return "with lines lw 2 dt 2 " + lc;
    case Series::linepoints: break;
  }
  return "with linespoints pt 7 ps 0.5 lw 2 " + lc;
}

// For the shell: 'a'\''b' is a'b.
std::string shell_quoted(const std::string& s) {
  std::string out = "'";
  for (char ch : s) out += ch == '\'' ? std::string("'\\''") : std::string(1, ch);
  return out + "'";
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
    gp += p.logx ? "set logscale x 2\n" : "unset logscale x\n";
    gp += p.logy ? "set logscale y\nset format y '%g'\n" : "unset logscale y\n";
    for (size_t m = 0; m < p.markers.size(); ++m)
      gp += fmt::format(
          "set arrow {0} from {1},graph 0 to {1},graph 1 nohead dt 3 lw 1.5 lc rgb '#444444'\n"
          "set label {0} {2} at {1},graph {3} left offset 0.5,0 textcolor rgb '#444444'\n",
          m + 1, p.markers[m].x, quoted(p.markers[m].label), 0.96 - 0.06 * static_cast<double>(m));
    std::vector<std::string> items;
    for (const Series& s : p.series) {
      dat += fmt::format("# {}\n", s.title);
      for (size_t i = 0; i < s.x.size() && i < s.y.size(); ++i)
        if (std::isfinite(s.x[i]) && std::isfinite(s.y[i]) && !(p.logy && s.y[i] <= 0)) dat += fmt::format("{:.9g} {:.9g}\n", s.x[i], s.y[i]);
      dat += "\n\n";  // gnuplot separates data blocks by two blank lines
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
  examples::write_file(stem + ".dat", dat);
  examples::write_file(stem + ".gp", gp);
  const std::string log = stem + ".gnuplot.log";
  if (std::system(fmt::format("gnuplot {} 2>{}", shell_quoted(stem + ".gp"), shell_quoted(log)).c_str()) != 0)
    return fmt::format("gnuplot failed on {}.gp (see {})", stem, log);
  std::remove(log.c_str());
  return {};
}

}  // namespace tg::study
