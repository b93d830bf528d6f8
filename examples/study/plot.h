#pragma once
// Plots for the study, drawn by gnuplot into PNG files: one or more panels
// side by side, each with its own axes (log scales optional), lines or points
// per series, a colour per model that stays the same in every plot, and
// labelled vertical markers (a crossover, a chance level's distance).
#include <cmath>
#include <string>
#include <vector>

namespace tg::study {

struct Series {
  std::string title;  // legend entry; empty: no entry
  std::vector<double> x, y;
  std::string model;  // picks the colour ("rnn", "lstm", "gru", "gpt"; other: grey)
  enum Style { line, points, linepoints, dashed } style = linepoints;
  // A spread per point (e.g. min-max over seeds, quartiles over repeats),
  // from ylo to yhi: a shaded band under a line or dashed line, error bars
  // on points; empty: none.
  std::vector<double> ylo{}, yhi{};
};

struct Marker {
  double x = 0;       // a vertical line at x (drawn only inside the data's x range)
  std::string label;
};

struct Panel {
  std::string title, xlabel, ylabel;
  bool logx = false, logy = false;
  int xbase = 10;               // of the log x axis: 2 for context lengths
  std::vector<double> xtics{};  // x ticks at exactly these values (e.g. thread counts); empty: automatic
  double ymin = NAN, ymax = NAN;  // y range; NaN: the data's own (plus a margin)
  std::vector<Series> series{};
  std::vector<Marker> markers{};
  double hline = 0;             // a horizontal dotted line at this y (e.g. chance); 0: none
  std::string hline_label{};
  std::string key = "top right";
};

// Writes png (and beside it, for re-plotting by hand: png minus .png plus .dat
// and .gp). Returns "" on success, or why no image was made (gnuplot missing
// or failing); the CSV files hold the same numbers either way.
std::string plot(const std::string& png, const std::vector<Panel>& panels, int width = 900, int height = 560);

}  // namespace tg::study
