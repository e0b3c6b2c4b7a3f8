#include "interrupt.h"

#include <signal.h>
#include <unistd.h>

namespace diffuse::app {
namespace {

extern "C" void exit_on_interrupt(int sig) {
  // Only async-signal-safe calls here.
  static const char kMessage[] = "\ninterrupted\n";
  const ssize_t written = ::write(STDERR_FILENO, kMessage, sizeof kMessage - 1);
  (void)written;
  ::_exit(128 + sig);
}

}  // namespace

void install_interrupt_handlers() {
  struct sigaction action {};
  action.sa_handler = exit_on_interrupt;
  sigemptyset(&action.sa_mask);
  for (int sig : {SIGINT, SIGTERM}) ::sigaction(sig, &action, nullptr);
}

}  // namespace diffuse::app
