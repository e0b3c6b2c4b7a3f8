// Step progress for the CLI: a redrawn bar on a terminal, one plain line per step otherwise.
#pragma once
#include <string>

#include "diffuse/pipeline.h"

namespace diffuse::app {

class Progress {
 public:
  explicit Progress(bool quiet);
  // Returns true (never cancels); usable directly as a StepCallback.
  bool operator()(const StepEvent& e);
  void finish();

 private:
  bool quiet_;
  bool tty_;
  bool drawn_ = false;
};

std::string format_seconds(double s);
std::string format_bytes(int64_t bytes);

}  // namespace diffuse::app
