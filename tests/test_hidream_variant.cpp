// HiDream variant defaults (pipeline/hidream_variant.h): told from the folder's pipeline class
// and scheduler, or named; an unknown name lists the accepted ones.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "diffuse/errors.h"
#include "io/model_folder.h"
#include "pipeline/hidream_variant.h"
#include "test_util.h"

namespace diffuse {
namespace test_hidream_variant {

namespace fs = std::filesystem;
using nlohmann::json;

// A folder with just model_index.json and the scheduler's config.
io::ModelFolder folder_with(const test::TempDir& dir, const std::string& pipeline,
                            const json& scheduler) {
  fs::create_directories(dir.path() / "scheduler");
  std::ofstream(dir.path() / "model_index.json")
      << json{{"_class_name", pipeline}, {"scheduler", {"diffusers", scheduler["_class_name"]}}};
  std::ofstream(dir.path() / "scheduler" / "scheduler_config.json") << scheduler.dump();
  return io::ModelFolder::open(dir.path().string());
}

TEST(HiDreamVariant, ToldFromThePipelineAndScheduler) {
  const json unipc = {{"_class_name", "UniPCMultistepScheduler"}, {"flow_shift", 3.0}};
  const json flash6 = {{"_class_name", "FlashFlowMatchEulerDiscreteScheduler"}, {"shift", 6.0}};
  const json flash3 = {{"_class_name", "FlashFlowMatchEulerDiscreteScheduler"}, {"shift", 3.0}};
  struct Case {
    std::string pipeline;
    json scheduler;
    std::string variant;
    int steps;
    double guidance;
  };
  for (const auto& c : std::vector<Case>{{"HiDreamImagePipeline", unipc, "i1-full", 50, 5.0},
                                         {"HiDreamImagePipeline", flash6, "i1-dev", 28, 0.0},
                                         {"HiDreamImagePipeline", flash3, "i1-fast", 16, 0.0},
                                         {"HiDreamImageEditingPipeline", unipc, "e1", 28, 5.0}}) {
    SCOPED_TRACE(c.variant);
    test::TempDir dir;
    const auto d = pipeline::hidream_defaults(folder_with(dir, c.pipeline, c.scheduler));
    EXPECT_EQ(d.variant, c.variant);
    EXPECT_EQ(d.steps, c.steps);
    EXPECT_EQ(d.guidance_scale, c.guidance);
  }
}

TEST(HiDreamVariant, NamedVariantsWinAndUnknownNamesAreRefused) {
  test::TempDir dir;
  const auto folder =
      folder_with(dir, "HiDreamImageEditingPipeline", {{"_class_name", "UniPCMultistepScheduler"}});
  const auto e1 = pipeline::hidream_defaults(folder, "e1");
  EXPECT_EQ(e1.image_guidance_scale, 4.0);
  EXPECT_EQ(e1.refine_strength, 0.3);
  const auto e11 = pipeline::hidream_defaults(folder, "e1.1");
  EXPECT_EQ(e11.guidance_scale, 3.0);
  EXPECT_EQ(e11.image_guidance_scale, 1.5);
  const auto msg =
      test::expect_throw<InvalidArgument>([&] { pipeline::hidream_defaults(folder, "i2-turbo"); });
  EXPECT_NE(msg.find("'i2-turbo'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("i1-dev"), std::string::npos) << msg;
}

}  // namespace test_hidream_variant
}  // namespace diffuse
