#include "nn/token_merge_hook.h"

namespace diffuse::nn {
namespace {
thread_local TokenMergeHook* active_hook = nullptr;
}  // namespace

TokenMergeHook* active_token_merge_hook() {
  return active_hook;
}

ScopedTokenMergeHook::ScopedTokenMergeHook(TokenMergeHook* hook) : previous_(active_hook) {
  active_hook = hook;
}

ScopedTokenMergeHook::~ScopedTokenMergeHook() {
  active_hook = previous_;
}

}  // namespace diffuse::nn
