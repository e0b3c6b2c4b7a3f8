#include "accel/dit_block_loop.h"

#include <torch/torch.h>

#include "accel/dit_cache.h"

namespace diffuse::accel {

torch::Tensor run_dit_blocks(const DitBlockLoop& loop, DitCache* cache, torch::Tensor image,
                             torch::Tensor text) {
  if (cache) cache->begin_call(image);
  torch::Tensor image_final, after_first;
  bool done = cache && cache->forecasts();
  if (done) image_final = cache->forecast();
  // First-Block Cache: after block 0, whether its residual says the others' can be reused.
  const auto first_block_reuses = [&](int64_t block, const torch::Tensor& before,
                                      const torch::Tensor& after) {
    if (block != 0 || !cache || !cache->first_block_cache()) return false;
    if (cache->reuse_after_first_block(after - before)) {
      image_final = after + cache->remaining_residual();
      return true;
    }
    after_first = after;
    return false;
  };
  for (int64_t i = 0; i < loop.dual_blocks && !done; ++i) {
    if (cache && cache->reuses_range_at(i)) {
      const auto out = cache->apply_range({image, text});
      image = out[0];
      text = out[1];
      i = cache->range_last();
      continue;
    }
    if (cache) cache->before_block(i, {image, text});
    auto [img, txt] = loop.dual(i, image, text);
    done = first_block_reuses(i, image, img);
    image = img;
    text = txt;
    if (cache) cache->after_block(i, {image, text});
  }
  if (!done) {
    auto tokens = loop.join(image, text);
    for (int64_t j = 0; j < loop.single_blocks && !done; ++j) {
      const int64_t b = loop.dual_blocks + j;
      if (cache && cache->reuses_range_at(b)) {
        tokens = cache->apply_range({tokens})[0];
        j = cache->range_last() - loop.dual_blocks;
        continue;
      }
      if (cache) cache->before_block(b, {tokens});
      const auto before = tokens;
      tokens = loop.single(j, tokens);
      if (cache) cache->after_block(b, {tokens});
      done = first_block_reuses(b, loop.image_of(before), loop.image_of(tokens));
    }
    if (!done) image_final = loop.image_of(tokens);
  }
  if (cache && !cache->forecasts()) cache->record_final(image_final, after_first);
  return image_final;
}

}  // namespace diffuse::accel
