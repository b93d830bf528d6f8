#pragma once
// What the examples and benchmarks leave behind for people to look at: aligned tables (also
// as Markdown), CSV files and line plots drawn by gnuplot.
#include <string>
#include <vector>

namespace tg::report {

// A table printed with aligned columns; markdown() gives the same as Markdown.
struct Table {
  std::vector<std::string> header;
  std::vector<std::vector<std::string>> rows;
  std::string text() const;
  std::string markdown() const;
};

struct Series {
  std::string name;
  std::vector<double> x, y;
};

// Draws the series as lines into png_path with gnuplot (writes the data and
// script beside it: png_path minus .png plus .dat / .gp). Returns an empty
// string on success, or why no image was made (e.g. gnuplot is not installed).
std::string plot_lines(const std::string& png_path, const std::string& title, const std::string& xlabel,
                       const std::string& ylabel, const std::vector<Series>& series, bool logx = false);

// This process's peak resident memory in MiB (VmHWM). Not getrusage's
// ru_maxrss: Linux carries the spawning process's peak across fork + exec,
// so a benchmark script holding a corpus would inflate it.
double peak_rss_mib();

// The line that heads a table written for people to read later, as
// bench/compare.py heads its own: when (local date and time), on what (CPU,
// whether it has AVX-512 and the bfloat16 instructions, cores), from what
// (the commit of the source tree this program was built from, marked when the
// tree has uncommitted changes) and how (this process's command line).
// Measurements quoted in docs come with it, so that a reader can tell their age.
std::string provenance();

// Writes text to path atomically (temporary file + rename); throws
// std::runtime_error naming the path on failure.
void write_file(const std::string& path, const std::string& text);

}  // namespace tg::report
