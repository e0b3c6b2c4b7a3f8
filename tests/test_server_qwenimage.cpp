// diffuse serve with a Qwen-Image-Edit model (the qwen-image-tiny golden model): the modes it
// runs, an edit job with the library's pixels (true CFG on the default " " negative prompt),
// text-to-image jobs (native and OpenAI's), and what it refuses.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <filesystem>

#include "diffuse/errors.h"
#include "io/model_folder.h"
#include "pipeline/qwenimage.h"
#include "pipeline/stable_diffusion.h"
#include "server/base64.h"
#include "server/qwenimage_engine.h"
#include "server_test_util.h"
#include "test_util.h"

namespace diffuse {
namespace test_server_qwenimage {

using nlohmann::json;
using test::demo_png_base64;
using test::expect_error;
using test::finished_job;
using test::image_at;
using test::json_of;
using test::TestServer;

std::string model_dir() {
  return test::qwen_image_golden_dir() + "/model";
}
bool have() {
  return std::filesystem::exists(model_dir() + "/model_index.json");
}

server::QwenImageEngine& engine() {
  static server::QwenImageEngine* e = nullptr;  // lives until exit, as `diffuse serve` keeps it
  if (!e) {
    LoadOptions lo;
    lo.device = "cpu";
    lo.dtype = "fp32";
    e = new server::QwenImageEngine(model_dir(), lo);
  }
  return *e;
}

TEST(ServerQwenImage, EditJobGivesTheLibrarysPixels) {
  if (!have()) GTEST_SKIP() << "no Qwen-Image model at " << model_dir();
  TestServer server(engine(), {});
  auto c = server.client();
  const auto status = json_of(c->Get("/v1/status"));
  EXPECT_EQ(status["modes"], json::array({"txt2img", "edit"}));
  EXPECT_EQ(status["scheduler"], "FlowMatchEulerDiscreteScheduler");

  const std::string source_b64 = demo_png_base64(50, 30);
  auto r = c->Post("/v1/jobs",
                   json{{"mode", "edit"},
                        {"prompt", "make it blue"},
                        {"init_image", source_b64},
                        {"steps", 2},
                        {"seed", 7},
                        {"preview", false}}
                       .dump(),
                   "application/json");
  ASSERT_EQ(r->status, 202) << r->body;
  auto job = finished_job(*c, json_of(r)["id"]);
  ASSERT_EQ(job["state"], "succeeded") << job.dump();
  const Image got = image_at(*c, job["images"][0]["url"]);

  const Image source = decode_png(server::base64_decode(source_b64, "png"), "source", 1 << 20);
  pipeline::QwenImagePipeline pipe(io::ModelFolder::open(model_dir()), torch::kCPU,
                                   torch::kFloat32);
  pipeline::QwenImageEdit e;
  e.prompt = "make it blue";
  e.negative_prompt = " ";
  e.image = pipeline::image_to_tensor(source);
  e.sampling.steps = 2;
  e.sampling.true_cfg_scale = 4.0;
  e.sampling.seed = 7;
  const Image want = pipeline::to_images(pipe.edit(e).image)[0];
  EXPECT_EQ(got.width, want.width);
  EXPECT_EQ(got.height, want.height);
  EXPECT_EQ(got.rgb, want.rgb) << "the server's edit differs from the library's";
}

TEST(ServerQwenImage, RunsTextToImageOnBothApisAndRefusesImg2Img) {
  if (!have()) GTEST_SKIP() << "no Qwen-Image model at " << model_dir();
  TestServer server(engine(), {});
  auto c = server.client();
  // OpenAI's generations (the model's 50 steps: cheap at this size on the tiny model).
  auto o =
      c->Post("/v1/images/generations",
              json{{"prompt", "a cat"}, {"size", "64x48"}, {"seed", 1}}.dump(), "application/json");
  ASSERT_EQ(o->status, 200) << o->body;
  EXPECT_EQ(json_of(o)["data"].size(), 1u);
  auto r = c->Post(
      "/v1/jobs",
      json{{"prompt", "a cat"}, {"width", 64}, {"height", 48}, {"steps", 2}, {"seed", 3}}.dump(),
      "application/json");
  ASSERT_EQ(r->status, 202) << r->body;
  auto job = finished_job(*c, json_of(r)["id"]);
  ASSERT_EQ(job["state"], "succeeded") << job.dump();
  const Image img = image_at(*c, job["images"][0]["url"]);
  EXPECT_EQ(img.width, 64);
  EXPECT_EQ(img.height, 48);
  const std::string src = demo_png_base64(32, 32);
  expect_error(
      c->Post("/v1/jobs", json{{"mode", "img2img"}, {"prompt", "x"}, {"init_image", src}}.dump(),
              "application/json"),
      400, "img2img");
}

}  // namespace test_server_qwenimage
}  // namespace diffuse
