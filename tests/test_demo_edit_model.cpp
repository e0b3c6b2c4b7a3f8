// The shipped HiDream-architecture demo model (models/demo-edit, trained by `diffuse train-demo
// --arch hidream-e1`) edits by instruction through the normal HiDream-E1 path: float32, fixed
// seeds, results scored by the scene scorer against the scene the instruction asks for (not
// compared pixel by pixel, so the test holds on another machine's kernels too).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <filesystem>

#include "io/model_folder.h"
#include "pipeline/hidream.h"
#include "pipeline/hidream_variant.h"
#include "pipeline/stable_diffusion.h"
#include "train/scene_edit.h"
#include "train/scene_scorer.h"

namespace diffuse {
namespace test_demo_edit_model {

const std::string kModel = std::string(DIFFUSE_SOURCE_DIR) + "/models/demo-edit";

// The first held-out edit of `kind`, run with the folder's defaults; the scene score of the
// result against the edit's target.
train::SceneScore edit_score(pipeline::HiDreamPipeline& pipe, const pipeline::HiDreamDefaults& d,
                             train::EditKind kind, uint64_t seed, std::string* prompt) {
  for (const auto& e : train::held_out_edits(60)) {
    if (e.kind != kind) continue;
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
    *prompt = req.prompt;
    return train::score_scene(pipeline::to_images(pipe.edit(req).image)[0], target);
  }
  ADD_FAILURE() << "no held-out edit of kind " << train::edit_kind_name(kind);
  return {};
}

TEST(DemoEditModel, AppliesABackgroundAndAnObjectRecolourEdit) {
  // Until a trained model is shipped (issue 37: the first 36-minute training run did not reach
  // the quality targets), there is nothing to score.
  if (!std::filesystem::exists(kModel + "/model_index.json")) GTEST_SKIP() << "no " << kModel;
  const auto folder = io::ModelFolder::open(kModel);
  const auto defaults = pipeline::hidream_defaults(folder);
  pipeline::HiDreamPipeline pipe(folder, torch::Device(torch::kCPU), torch::kFloat32);
  for (auto kind : {train::EditKind::kBackground, train::EditKind::kRecolour}) {
    std::string prompt;
    const auto score = edit_score(pipe, defaults, kind, 0, &prompt);
    EXPECT_TRUE(score.background) << prompt << ": background " << score.detected_background;
    for (size_t i = 0; i < score.objects.size(); ++i)
      EXPECT_TRUE(score.objects[i].colour_position && score.objects[i].shape)
          << prompt << ": object " << i << " detected " << score.objects[i].detected_shape;
  }
}

}  // namespace test_demo_edit_model
}  // namespace diffuse
