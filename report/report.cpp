#include "report/report.h"

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <ctime>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <stdexcept>

#include <fmt/format.h>

#include "autograd/atomic_file.h"
#include "build_commit.h"  // generated: TG_BUILD_COMMIT

namespace tg::report {
namespace {

std::vector<size_t> widths(const Table& t) {
  std::vector<size_t> w(t.header.size(), 0);
  for (size_t c = 0; c < t.header.size(); ++c) w[c] = t.header[c].size();
  for (auto& r : t.rows)
    for (size_t c = 0; c < r.size() && c < w.size(); ++c) w[c] = std::max(w[c], r[c].size());
  return w;
}

std::string row_text(const std::vector<std::string>& r, const std::vector<size_t>& w, const char* sep) {
  std::string out;
  for (size_t c = 0; c < w.size(); ++c) {
    std::string cell = c < r.size() ? r[c] : "";
    // First column left-aligned (names), the rest right-aligned (numbers).
    out += c == 0 ? fmt::format("{:<{}}", cell, w[c]) : fmt::format("{:>{}}", cell, w[c]);
    if (c + 1 < w.size()) out += sep;
  }
  return out;
}

}  // namespace

std::string Table::text() const {
  auto w = widths(*this);
  std::string out = row_text(header, w, "  ") + "\n";
  size_t total = 0;
  for (size_t x : w) total += x + 2;
  out += std::string(total - 2, '-') + "\n";
  for (auto& r : rows) out += row_text(r, w, "  ") + "\n";
  return out;
}

std::string Table::markdown() const {
  auto w = widths(*this);
  std::string out = "| " + row_text(header, w, " | ") + " |\n|";
  for (size_t c = 0; c < w.size(); ++c) out += c == 0 ? std::string(w[c] + 2, '-') + "|" : std::string(w[c] + 1, '-') + ":|";
  out += "\n";
  for (auto& r : rows) out += "| " + row_text(r, w, " | ") + " |\n";
  return out;
}

void write_file(const std::string& path, const std::string& text) {
  tg::detail::AtomicFile f(path, [](const std::string& message) { throw std::runtime_error(message); });
  f.write(text.data(), text.size());
  f.commit();
}

std::string plot_lines(const std::string& png, const std::string& title, const std::string& xlabel,
                       const std::string& ylabel, const std::vector<Series>& series, bool logx) {
  if (std::system("command -v gnuplot >/dev/null 2>&1") != 0)
    return "gnuplot is not installed (apt-get install gnuplot-nox); the CSV has the same numbers";
  std::string stem = png.size() > 4 && png.ends_with(".png") ? png.substr(0, png.size() - 4) : png;
  std::string dat, plot;
  for (size_t s = 0; s < series.size(); ++s) {
    dat += fmt::format("# {}\n", series[s].name);
    for (size_t i = 0; i < series[s].x.size(); ++i) dat += fmt::format("{} {}\n", series[s].x[i], series[s].y[i]);
    dat += "\n\n";  // gnuplot data blocks are separated by two blank lines
    plot += fmt::format("{}'{}.dat' index {} with linespoints pt 7 ps 0.4 lw 2 title '{}'", s ? ", " : "", stem, s,
                        series[s].name);
  }
  write_file(stem + ".dat", dat);
  std::string gp = fmt::format(
      "set terminal pngcairo size 900,560 font 'sans,11' noenhanced\n"
      "set output '{}'\nset title '{}'\nset xlabel '{}'\nset ylabel '{}'\nset grid\nset key top right\n{}"
      "plot {}\n",
      png, title, xlabel, ylabel, logx ? "set logscale x\n" : "", plot);
  write_file(stem + ".gp", gp);
  std::string cmd = fmt::format("gnuplot '{}.gp' 2>'{}.gnuplot.log'", stem, stem);
  if (std::system(cmd.c_str()) != 0) {
    // Some gnuplot builds lack pngcairo; fall back to the plain png terminal.
    gp.replace(gp.find("pngcairo"), 8, "png");
    write_file(stem + ".gp", gp);
    if (std::system(cmd.c_str()) != 0) return fmt::format("gnuplot failed (see {}.gnuplot.log)", stem);
  }
  std::remove((stem + ".gnuplot.log").c_str());
  return {};
}

double peak_rss_mib() {
  std::ifstream status("/proc/self/status");
  for (std::string line; std::getline(status, line);)
    if (line.starts_with("VmHWM:")) return std::stod(line.substr(6)) / 1024.0;
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  return static_cast<double>(ru.ru_maxrss) / 1024.0;
}


std::string provenance() {
  std::string cpu = "unknown CPU", flags;
  std::ifstream info("/proc/cpuinfo");
  for (std::string line; std::getline(info, line);) {
    const std::string key = line.substr(0, line.find(':'));
    const std::string value = line.find(": ") == std::string::npos ? "" : line.substr(line.find(": ") + 2);
    if (key.starts_with("model name") && cpu == "unknown CPU") cpu = value;
    if (key.starts_with("flags")) {
      flags = " " + value + " ";
      break;
    }
  }
  std::string isa;
  for (auto [flag, name] : {std::pair{"avx512f", "AVX-512"}, {"avx512_bf16", "AVX512_BF16"}, {"amx_bf16", "AMX-BF16"}})
    if (flags.find(fmt::format(" {} ", flag)) != std::string::npos) isa += (isa.empty() ? "" : ", ") + std::string(name);
  if (isa.empty()) isa = "no AVX-512";

  std::string commit = TG_BUILD_COMMIT;
  if (commit.ends_with("-dirty")) commit = commit.substr(0, commit.size() - 6) + " with uncommitted changes";

  std::ifstream cmdline("/proc/self/cmdline", std::ios::binary);
  std::string command, arg;
  while (std::getline(cmdline, arg, '\0')) command += (command.empty() ? "" : " ") + arg;

  char date[64];
  const std::time_t now = std::time(nullptr);
  std::strftime(date, sizeof date, "%Y-%m-%d %H:%M %Z", std::localtime(&now));
  return fmt::format("_{}; {} ({}), {} cores; commit {}; `{}`_\n\n", date, cpu, isa,
                     std::thread::hardware_concurrency(), commit, command);
}

}  // namespace tg::report
