// Whether token merging pays on the device and size at hand (issue 38: an acceleration must
// never make a run slower). ToMe adds work (matching the tokens, gathering and scattering them)
// to shorten the self-attentions at its sites, and which side wins depends on the attention
// kernel, the token count and the device: measured on the run's own UNet, not guessed.
#pragma once
#include <torch/types.h>

#include <set>
#include <string>

#include "models/unet2d_condition.h"

namespace diffuse::accel {

struct TokenMergingPayoff {
  // Below this share of the plain run's time, merging counts as paying: a margin against
  // timing noise, so that a tie (which gains nothing) leaves the run as it was.
  static constexpr double kPaysBelow = 0.97;
  int64_t tokens = 0;   // the largest site's token count (height x width of its grid)
  double plain_s = 0;   // every site's self-attentions once, as the plain run computes them
  double merged_s = 0;  // the same with the matching, merge and unmerge of a ToMe run
  // One whole plain UNet call at this batch and size (0: not measured yet). The sites are a
  // small share of it, so what they save is judged against it, not against their own time.
  double call_s = 0;

  double saved_s() const { return plain_s - merged_s; }
  double speedup() const { return merged_s > 0 ? plain_s / merged_s : 0; }  // the sites'
  // The whole call's: the call less what the sites save.
  double call_speedup() const {
    return call_s > saved_s() && call_s > 0 ? call_s / (call_s - saved_s()) : 0;
  }
  // Whether `steps` UNet calls run faster merged than plain by the margin, counting, when
  // `spent_plain_call`, the plain first call a run timed to decide and then throws away.
  bool pays(int64_t steps, bool spent_plain_call) const {
    if (call_s <= 0 || saved_s() <= 0) return false;
    const double n = static_cast<double>(steps);
    const double merged_run = n * (call_s - saved_s()) + (spent_plain_call ? call_s : 0);
    return merged_run < kPaysBelow * n * call_s;
  }
};

// Times the self-attention path of every transformer block at `sites` (the first block of each
// distinct grid, counted once per block that shares it), plain and merged at `ratio`, on inputs
// of the run's batch and the token grid each site has at a latent of
// `latent_height` x `latent_width`, as `options` (the UNet's compute dtype and device; a
// float32 UNet may keep 16-bit weights, so its parameters do not say): one warm-up each,
// then the best of three alternating repeats, so both sides see the same machine state.
TokenMergingPayoff measure_token_merging(models::UNet2DConditionModelImpl& unet,
                                         const models::UNet2DConditionConfig& config,
                                         const std::set<std::string>& sites, int64_t batch,
                                         int64_t latent_height, int64_t latent_width, double ratio,
                                         const torch::TensorOptions& options);

// The one-line note of a run that left token merging out because it did not pay: its sites got
// slower, or what they saved was too small a share of the run's `steps` UNet calls.
std::string token_merging_skipped_note(const TokenMergingPayoff& payoff, double ratio,
                                       int64_t steps, const std::string& device);

}  // namespace diffuse::accel
