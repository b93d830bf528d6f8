#pragma once
// A progress bar for long loops, on stderr:
//   gpt  [##########..........]  1200/3000  loss 1.834  42.1k tok/s  ETA 1:23
// On a terminal it redraws in place (at most 10 times a second); otherwise
// (CI logs, pipes) it prints one line every 10% so logs stay readable.
#include <chrono>
#include <cstdint>
#include <string>

namespace tg::report {

class Progress {
 public:
  // unit: what the rate counts ("tok", "words"); total: number of steps;
  // first: the step this run starts at (a resumed run), for the ETA.
  Progress(std::string label, int64_t total, std::string unit, int64_t first = 0);
  // done steps so far, items processed since start, extra text ("loss 1.83").
  void update(int64_t done, double items, const std::string& extra);
  // Final line with the elapsed time.
  void finish(const std::string& extra);
  double seconds() const;

 private:
  void draw(int64_t done, double items, const std::string& extra, bool final);
  std::string label_, unit_;
  int64_t total_, first_;
  bool tty_;
  int last_decile_ = -1;
  std::chrono::steady_clock::time_point start_, last_draw_;
};

// "1:23", "12:05", "1:02:03"
std::string format_duration(double seconds);
// "950", "42.1k", "3.2M"
std::string format_count(double n);
// items over secs: "42.1k tok/s"; below one a second, seconds per item so that
// a slow rate does not read 0: "2.5 s/round" (unit "rounds", singular by
// dropping its last 's'). Empty for no items or no time.
std::string format_rate(double items, double secs, const std::string& unit);

}  // namespace tg::report
