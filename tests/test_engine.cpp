// diffuse::Engine (include/diffuse/engine.h), the torch-free API every job goes through: the
// family picked from the folder, defaults, seeds, progress and cancel, timings, and the jobs a
// model does not run, on the demo model and the HiDream golden model.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>

#include "diffuse/engine.h"
#include "test_util.h"
#include "verify/golden.h"

namespace test_engine {

using namespace diffuse;

const std::string kDemo = std::string(DIFFUSE_SOURCE_DIR) + "/models/demo";

JobRequest request(const std::string& prompt, int steps, uint64_t seed) {
  JobRequest r;
  r.prompt = prompt;
  r.steps = steps;
  r.seed = seed;
  return r;
}

TEST(Engine, StableDiffusionJobsSeedsProgressAndTimings) {
  auto e = Engine::open(kDemo, "cpu", "fp32");
  EXPECT_EQ(e.family(), "stable-diffusion");
  EXPECT_FALSE(e.can_edit());
  auto r = request("a red circle on the left on a blue background", 2, 42);
  std::vector<std::pair<int, int>> seen;
  r.progress = [&](int step, int total) {
    seen.emplace_back(step, total);
    return true;
  };
  const auto a = e.txt2img(r);
  EXPECT_EQ(seen, (std::vector<std::pair<int, int>>{{1, 2}, {2, 2}}));
  EXPECT_EQ(a.seed, 42u);
  EXPECT_GT(a.image.width, 0);
  EXPECT_EQ(a.image.rgb.size(), static_cast<size_t>(a.image.width) * a.image.height * 3);
  EXPECT_GT(a.seconds, 0);
  EXPECT_EQ(a.timings.step_s.size(), 2u);
  EXPECT_FALSE(a.timings.memory.empty());
  r.progress = {};
  EXPECT_EQ(e.txt2img(r).image.rgb, a.image.rgb);  // the same seed, the same image
  // No seed: a random one, reported, that gives the image again.
  r.seed.reset();
  const auto drawn = e.txt2img(r);
  r.seed = drawn.seed;
  EXPECT_EQ(e.txt2img(r).image.rgb, drawn.image.rgb);

  r.strength = 0.6;
  const auto b = e.img2img(r, a.image);
  EXPECT_EQ(b.image.width, a.image.width);
  EXPECT_NE(b.image.rgb, a.image.rgb);
  EXPECT_THROW(e.edit(r, a.image), Unsupported);
}

TEST(Engine, CancelAndBadRequestsAreErrorsNamingTheField) {
  auto e = Engine::open(kDemo, "cpu", "fp32");
  auto r = request("a blue square", 4, 1);
  int calls = 0;
  r.progress = [&](int, int) { return ++calls < 2; };
  EXPECT_THROW(e.txt2img(r), Cancelled);
  EXPECT_EQ(calls, 2);
  r.progress = {};
  auto expect_invalid = [&](const JobRequest& bad, const Image* input, const std::string& part) {
    try {
      if (input)
        e.img2img(bad, *input);
      else
        e.txt2img(bad);
      ADD_FAILURE() << "no error for " << part;
    } catch (const InvalidArgument& err) {
      EXPECT_NE(std::string(err.what()).find(part), std::string::npos) << err.what();
    }
  };
  auto bad = r;
  bad.prompt = "a \xff\xfe square";
  expect_invalid(bad, nullptr, "prompt");
  bad = r;
  bad.steps = -1;
  expect_invalid(bad, nullptr, "steps");
  bad = r;
  bad.guidance_scale = std::nan("");
  expect_invalid(bad, nullptr, "guidance_scale");
  Image wrong;
  wrong.width = 8;
  wrong.height = 8;
  wrong.rgb.assign(10, 0);  // not 8 x 8 x 3 bytes
  expect_invalid(r, &wrong, "expected width x height x 3");
  wrong.width = 0;
  expect_invalid(r, &wrong, "the input image is 0x8");
  EXPECT_THROW(Engine::open("/nonexistent/model"), IoError);
  EXPECT_THROW(Engine::open(""), InvalidArgument);
}

TEST(Engine, HiDreamI1RunsTextToImageAndRefusesEdits) {
  const std::string set = test::hidream_golden_dir();
  if (!std::filesystem::exists(set + "/cases.json")) GTEST_SKIP() << "no set at " << set;
  auto e = Engine::open(verify::GoldenSet::load(set).model_dir(), "cpu", "fp32");
  EXPECT_EQ(e.family(), "hidream");
  EXPECT_FALSE(e.can_edit());  // an I1 folder
  auto r = request("a red fox", 1, 3);
  const auto a = e.txt2img(r);
  EXPECT_EQ(a.seed, 3u);
  EXPECT_GT(a.image.width * a.image.height, 0);
  try {
    e.edit(r, a.image);
    ADD_FAILURE() << "an I1 model edited";
  } catch (const Unsupported& err) {
    EXPECT_NE(std::string(err.what()).find("HiDream-I1"), std::string::npos) << err.what();
  }
  r.scheduler = "euler";
  EXPECT_THROW(e.txt2img(r), InvalidArgument);
}

}  // namespace test_engine
