#include "report/progress.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>

#include <fmt/format.h>

namespace tg::report {

std::string format_duration(double s) {
  if (!std::isfinite(s) || s < 0) return "?";
  auto t = static_cast<int64_t>(s + 0.5);
  if (t >= 3600) return fmt::format("{}:{:02}:{:02}", t / 3600, t / 60 % 60, t % 60);
  return fmt::format("{}:{:02}", t / 60, t % 60);
}

std::string format_count(double n) {
  if (n >= 1e6) return fmt::format("{:.1f}M", n / 1e6);
  if (n >= 1e3) return fmt::format("{:.1f}k", n / 1e3);
  return fmt::format("{:.0f}", n);
}

std::string format_rate(double items, double secs, const std::string& unit) {
  if (!(items > 0) || !(secs > 0)) return "";
  const double per_second = items / secs;
  if (per_second >= 1) return fmt::format("{} {}/s", format_count(per_second), unit);
  const std::string one = unit.size() > 1 && unit.back() == 's' ? unit.substr(0, unit.size() - 1) : unit;
  return fmt::format("{:.{}f} s/{}", secs / items, secs / items < 10 ? 1 : 0, one);
}

Progress::Progress(std::string label, int64_t total, std::string unit, int64_t first)
    : label_(std::move(label)),
      unit_(std::move(unit)),
      total_(total > 0 ? total : 1),
      first_(std::clamp<int64_t>(first, 0, total_ - 1)),
      tty_(isatty(STDERR_FILENO)) {
  start_ = last_draw_ = std::chrono::steady_clock::now();
}

double Progress::seconds() const {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
}

void Progress::update(int64_t done, double items, const std::string& extra) {
  auto now = std::chrono::steady_clock::now();
  if (tty_) {
    if (now - last_draw_ < std::chrono::milliseconds(100) && done < total_) return;
  } else {
    int decile = static_cast<int>(10 * done / total_);
    if (decile == last_decile_) return;
    last_decile_ = decile;
  }
  last_draw_ = now;
  draw(done, items, extra, false);
}

void Progress::finish(const std::string& extra) {
  draw(total_, -1, extra, true);
}

void Progress::draw(int64_t done, double items, const std::string& extra, bool final) {
  const int width = 20;
  double frac = std::min(1.0, static_cast<double>(done) / total_);
  int filled = static_cast<int>(frac * width);
  std::string bar = std::string(filled, '#') + std::string(width - filled, '.');
  double secs = seconds();
  const std::string per = format_rate(items, secs, unit_);
  const std::string rate = per.empty() ? "" : "  " + per;
  double run_frac = static_cast<double>(done - first_) / (total_ - first_);  // of this run's share
  std::string tail = final ? fmt::format("  done in {}", format_duration(secs))
                           : fmt::format("  ETA {}", run_frac > 0 ? format_duration(secs * (1 - run_frac) / run_frac) : "?");
  std::string line = fmt::format("{:<6} [{}] {:>6}/{}  {}{}{}", label_, bar, done, total_, extra, rate, tail);
  if (tty_)
    fmt::print(stderr, "\r\033[K{}{}", line, final ? "\n" : "");
  else
    fmt::print(stderr, "{}\n", line);
  std::fflush(stderr);
}

}  // namespace tg::report
