#include "progress.h"

#include <unistd.h>

#include <cstdio>
#include <iostream>

namespace diffuse::app {

Progress::Progress(bool quiet) : quiet_(quiet), tty_(::isatty(STDERR_FILENO) != 0) {}

std::string format_seconds(double s) {
  char buf[32];
  if (s < 60)
    std::snprintf(buf, sizeof(buf), "%.2fs", s);
  else
    std::snprintf(buf, sizeof(buf), "%dm%02ds", static_cast<int>(s) / 60, static_cast<int>(s) % 60);
  return buf;
}

std::string format_bytes(int64_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.1f MiB", static_cast<double>(bytes) / (1024.0 * 1024.0));
  return buf;
}

bool Progress::operator()(const StepEvent& e) {
  if (quiet_) return true;
  int done = e.step + 1;
  double rate = e.elapsed_s > 0 ? done / e.elapsed_s : 0;
  double eta = rate > 0 ? (e.num_steps - done) / rate : 0;
  char line[160];
  if (tty_) {
    const int width = 30;
    int filled = e.num_steps ? done * width / e.num_steps : width;
    std::string bar(static_cast<size_t>(filled), '#');
    bar.resize(width, '.');
    std::snprintf(line, sizeof(line), "\rstep %d/%d [%s] %.2f it/s ETA %s   ", done, e.num_steps,
                  bar.c_str(), rate, format_seconds(eta).c_str());
    std::cerr << line << std::flush;
    drawn_ = true;
  } else {
    std::snprintf(line, sizeof(line), "step %d/%d t=%g %.2f it/s eta=%s", done, e.num_steps,
                  e.timestep, rate, format_seconds(eta).c_str());
    std::cerr << line << "\n";
  }
  return true;
}

void Progress::finish() {
  if (drawn_) std::cerr << "\n";
  drawn_ = false;
}

}  // namespace diffuse::app
