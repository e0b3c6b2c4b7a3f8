// SIGINT/SIGTERM in the CLI: print "interrupted" and exit 130/143 (128 + the signal), as
// shells report it, instead of dying silently. Outputs are written through a temporary file
// and renamed, so an interrupted run never leaves a half-written image under the real name.
#pragma once

namespace diffuse::app {

void install_interrupt_handlers();

}  // namespace diffuse::app
