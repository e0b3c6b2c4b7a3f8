// The shipped HiDream-architecture demo model (models/demo-edit, trained by `diffuse train-demo
// --arch hidream-e1`) edits by instruction through the normal HiDream-E1 path: float32, fixed
// seeds, results scored by the scene scorer against the scene the instruction asks for (not
// compared pixel by pixel, so the test holds on another machine's kernels too).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <filesystem>

#include "accel/dit_cache.h"
#include "io/model_folder.h"
#include "pipeline/hidream.h"
#include "pipeline/hidream_variant.h"
#include "pipeline/stable_diffusion.h"
#include "train/scene_edit.h"
#include "train/scene_scorer.h"

namespace diffuse {
namespace test_demo_edit_model {

const std::string kModel = std::string(DIFFUSE_SOURCE_DIR) + "/models/demo-edit";

// The first `count` held-out edits of `kind`, run with the folder's defaults: how many come
// out fully right (the scorer's every check against the edit's target scene); what went wrong
// with the others in `failures`.
int edits_right(pipeline::HiDreamPipeline& pipe, const pipeline::HiDreamDefaults& d,
                train::EditKind kind, int count, uint64_t seed, std::string* failures,
                const DitCacheOptions& cache = {}, accel::DitCacheStats* stats = nullptr) {
  int tried = 0, right = 0;
  for (const auto& e : train::held_out_edits(60)) {
    if (e.kind != kind || tried == count) continue;
    ++tried;
    const auto target = train::spec_of(e.target, false);
    const Image source = train::render_scene(e.source, pipe.area_side(), pipe.area_side());
    pipeline::HiDreamEdit req;
    req.prompt = train::e1_prompt(e.instruction, train::caption(target));
    req.image = torch::from_blob(const_cast<uint8_t*>(source.rgb.data()),
                                 {source.height, source.width, 3}, torch::kUInt8)
                    .clone();
    req.image_guidance_scale = d.image_guidance_scale;
    req.sampling.steps = d.steps;
    req.sampling.guidance_scale = d.guidance_scale;
    req.sampling.seed = seed;
    req.sampling.cache = cache;
    const auto result = pipe.edit(req);
    if (stats) *stats += result.cache;
    const auto score = train::score_scene(pipeline::to_images(result.image)[0], target);
    if (score.all())
      ++right;
    else
      *failures += "\n  " + req.prompt + " (background " + score.detected_background + ")";
  }
  EXPECT_EQ(tried, count) << "too few held-out edits of kind " << train::edit_kind_name(kind);
  return right;
}

// Scored on four edits of each kind, three of which must come out right: the model gets about
// nine in ten of these kinds right (docs/demo-models.md), and one borderline edit that another
// CPU's kernels tip over must not fail the suite.
TEST(DemoEditModel, AppliesBackgroundAndObjectRecolourEdits) {
  if (!std::filesystem::exists(kModel + "/model_index.json")) GTEST_SKIP() << "no " << kModel;
  const auto folder = io::ModelFolder::open(kModel);
  const auto defaults = pipeline::hidream_defaults(folder);
  pipeline::HiDreamPipeline pipe(folder, torch::Device(torch::kCPU), torch::kFloat32);
  for (auto kind : {train::EditKind::kBackground, train::EditKind::kRecolour}) {
    std::string failures;
    EXPECT_GE(edits_right(pipe, defaults, kind, 4, 0, &failures), 3)
        << train::edit_kind_name(kind) << " edits that went wrong:" << failures;
  }
}

// Issue 38's scored check: First-Block Cache at 0.25 (the setting measured at 1.88x within 3
// points of off on 120 held-out edits, docs/acceleration.md) skips blocks on this trained model
// and still makes the edits: the same bound as the plain run above on the same edits.
TEST(DemoEditModel, FirstBlockCacheSkipsBlocksAndKeepsTheEdits) {
  if (!std::filesystem::exists(kModel + "/model_index.json")) GTEST_SKIP() << "no " << kModel;
  const auto folder = io::ModelFolder::open(kModel);
  const auto defaults = pipeline::hidream_defaults(folder);
  pipeline::HiDreamPipeline pipe(folder, torch::Device(torch::kCPU), torch::kFloat32);
  const auto cache = accel::parse_dit_cache("fbcache:0.25");
  accel::DitCacheStats stats;
  for (auto kind : {train::EditKind::kBackground, train::EditKind::kRecolour}) {
    std::string failures;
    EXPECT_GE(edits_right(pipe, defaults, kind, 4, 0, &failures, cache, &stats), 3)
        << train::edit_kind_name(kind) << " edits that went wrong:" << failures;
  }
  ASSERT_GT(stats.blocks_possible, 0);
  EXPECT_GT(stats.cached_calls, 0);
  EXPECT_LT(stats.blocks_run, stats.blocks_possible * 9 / 10)
      << stats.blocks_run << " of " << stats.blocks_possible << " blocks ran";
}

}  // namespace test_demo_edit_model
}  // namespace diffuse
