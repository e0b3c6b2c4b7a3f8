// diffuse serve with a HiDream model (the hidream-tiny golden model): instruction edits and
// text-to-image through the native and OpenAI APIs, the same pixels as the library gives for
// the same request, what a HiDream server refuses, and cancel.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <filesystem>

#include "io/model_folder.h"
#include "pipeline/hidream.h"
#include "pipeline/stable_diffusion.h"
#include "server/base64.h"
#include "server/hidream_engine.h"
#include "server_test_util.h"
#include "test_util.h"

namespace diffuse {
namespace test_server_hidream {

using nlohmann::json;
using test::demo_png_base64;
using test::expect_error;
using test::finished_job;
using test::image_at;
using test::json_of;
using test::TestServer;

std::string hidream_model_dir() {
  return test::hidream_golden_dir() + "/model";
}

bool have_hidream_model() {
  return std::filesystem::exists(hidream_model_dir() + "/model_index.json");
}

// One engine per process: the text encoders stay loaded between jobs, as in `diffuse serve`.
server::HiDreamEngine& hidream_engine() {
  static server::HiDreamEngine* engine = [] {
    LoadOptions lo;
    lo.device = "cpu";
    lo.dtype = "fp32";
    return new server::HiDreamEngine(hidream_model_dir(), lo, {});  // lives until exit
  }();
  return *engine;
}

#define SKIP_WITHOUT_HIDREAM() \
  if (!have_hidream_model()) GTEST_SKIP() << "no HiDream golden model at " << hidream_model_dir()

// What the library makes for the same edit (seed, steps, guidance), as 8-bit pixels.
Image library_edit(const Image& source, const std::string& prompt, uint64_t seed, int steps) {
  pipeline::HiDreamPipeline pipe(io::ModelFolder::open(hidream_model_dir()), torch::kCPU,
                                 torch::kFloat32);
  pipeline::HiDreamEdit e;
  e.prompt = prompt;
  e.image = torch::from_blob(const_cast<uint8_t*>(source.rgb.data()),
                             {source.height, source.width, 3}, torch::kUInt8)
                .clone();
  e.sampling.steps = steps;
  e.sampling.guidance_scale = 5.0;
  e.sampling.seed = seed;
  return pipeline::to_images(pipe.edit(e).image)[0];
}

TEST(ServerHiDream, StatusListsEditAndTxt2ImgAndTheModelsOwnScheduler) {
  SKIP_WITHOUT_HIDREAM();
  TestServer server(hidream_engine(), {});
  auto c = server.client();
  auto s = json_of(c->Get("/v1/status"));
  EXPECT_EQ(s["modes"], json::array({"txt2img", "edit"}));
  EXPECT_EQ(s["scheduler"], "UniPCMultistepScheduler");
  EXPECT_TRUE(s["schedulers"].empty());
  EXPECT_EQ(s["vae_dtype"], "fp32");
  EXPECT_GT(s["default_width"].get<int>(), 0);
  EXPECT_EQ(json_of(c->Get("/sdapi/v1/samplers")), json::array());
}

TEST(ServerHiDream, EditJobGivesTheLibrarysPixelsWithEditParameters) {
  SKIP_WITHOUT_HIDREAM();
  TestServer server(hidream_engine(), {});
  auto c = server.client();
  const std::string prompt = "Editing Instruction: make it blue. Target Image Description: blue";
  const std::string source_b64 = demo_png_base64(64, 48);
  auto r = c->Post("/v1/jobs",
                   json{{"mode", "edit"},
                        {"prompt", prompt},
                        {"init_image", source_b64},
                        {"steps", 3},
                        {"seed", 11},
                        {"image_guidance_scale", 4.0}}
                       .dump(),
                   "application/json");
  ASSERT_EQ(r->status, 202) << r->body;
  auto job = finished_job(*c, json_of(r)["id"]);
  ASSERT_EQ(job["state"], "succeeded") << job.dump();
  EXPECT_EQ(job["request"]["mode"], "edit");
  EXPECT_EQ(job["timings"]["steps"], 3);
  EXPECT_GT(job["timings"]["vae_encode_s"].get<double>(), 0.0);
  std::map<std::string, std::string> text;
  Image got = image_at(*c, job["images"][0]["url"], &text);
  EXPECT_NE(text["parameters"].find("Image CFG scale: 4"), std::string::npos) << text["parameters"];
  EXPECT_NE(text["parameters"].find("Seed: 11"), std::string::npos);
  const Image source = decode_png(server::base64_decode(source_b64, "png"), "source", 1 << 20);
  Image want = library_edit(source, prompt, 11, 3);
  EXPECT_EQ(got.width, want.width);
  EXPECT_EQ(got.height, want.height);
  EXPECT_EQ(got.rgb, want.rgb) << "the server's edit differs from the library's";
}

TEST(ServerHiDream, Txt2ImgAndOpenAiEditsRunAsHiDreamJobs) {
  SKIP_WITHOUT_HIDREAM();
  TestServer server(hidream_engine(), {});
  auto c = server.client();
  // Width x height is the aspect ratio; the image is rescaled to the model's area.
  auto r = c->Post("/v1/jobs",
                   json{{"prompt", "a cat"},
                        {"width", 64},
                        {"height", 32},
                        {"steps", 2},
                        {"seed", 3},
                        {"num_images", 2}}
                       .dump(),
                   "application/json");
  ASSERT_EQ(r->status, 202) << r->body;
  auto job = finished_job(*c, json_of(r)["id"]);
  ASSERT_EQ(job["state"], "succeeded") << job.dump();
  ASSERT_EQ(job["images"].size(), 2u);
  Image a = image_at(*c, job["images"][0]["url"]), b = image_at(*c, job["images"][1]["url"]);
  EXPECT_GT(a.width, a.height);
  EXPECT_NE(a.rgb, b.rgb) << "the second image has its own seed";
  EXPECT_EQ(job["images"][1]["seed"], 4);

  httplib::MultipartFormDataItems items = {
      {"image", server::base64_decode(demo_png_base64(32, 32), "png"), "in.png", "image/png"},
      {"prompt", "make it red", "", ""},
      {"seed", "5", "", ""}};
  auto e = c->Post("/v1/images/edits", items);
  ASSERT_EQ(e->status, 200) << e->body;
  EXPECT_EQ(json_of(e)["data"].size(), 1u);
  auto jobs = json_of(c->Get("/v1/jobs"));
  bool saw_edit = false;
  for (const auto& j : jobs["jobs"]) saw_edit = saw_edit || j["request"]["mode"] == "edit";
  EXPECT_TRUE(saw_edit) << jobs.dump();
}

// Sizes the pipeline would refuse are refused when the request arrives (400, nothing queued),
// from the model's own size rules: an aspect ratio whose short side vanishes at the model's
// area, an edit source smaller than the VAE factor times the patch.
TEST(ServerHiDream, SizesThePipelineCannotMakeAreRefusedAtOnce) {
  SKIP_WITHOUT_HIDREAM();
  TestServer server(hidream_engine(), {});
  auto c = server.client();
  expect_error(c->Post("/v1/jobs", json{{"prompt", "x"}, {"width", 2048}, {"height", 8}}.dump(),
                       "application/json"),
               400, "has no side of at least");
  expect_error(
      c->Post("/v1/jobs",
              json{{"mode", "edit"}, {"prompt", "x"}, {"init_image", demo_png_base64(8, 8)}}.dump(),
              "application/json"),
      400, "each side needs at least");
  httplib::MultipartFormDataItems items = {
      {"image", server::base64_decode(demo_png_base64(8, 8), "png"), "in.png", "image/png"},
      {"prompt", "make it red", "", ""}};
  expect_error(c->Post("/v1/images/edits", items), 400, "each side needs at least");
  EXPECT_EQ(server.queue().counts().submitted, 0u);
  // An aspect ratio that is no multiple of 16 is fine: it is only a ratio.
  auto ok = c->Post("/v1/jobs",
                    json{{"prompt", "x"}, {"width", 1000}, {"height", 700}, {"steps", 1}}.dump(),
                    "application/json");
  EXPECT_EQ(ok->status, 202) << ok->body;
}

TEST(ServerHiDream, RefusesWhatAHiDreamModelDoesNotRun) {
  SKIP_WITHOUT_HIDREAM();
  TestServer server(hidream_engine(), {});
  auto c = server.client();
  const std::string img = demo_png_base64(32, 32);
  expect_error(
      c->Post("/v1/jobs", json{{"mode", "img2img"}, {"prompt", "x"}, {"init_image", img}}.dump(),
              "application/json"),
      400, "does not run img2img");
  expect_error(c->Post("/sdapi/v1/img2img",
                       json{{"prompt", "x"}, {"init_images", json::array({img})}}.dump(),
                       "application/json"),
               400, "does not run img2img");
  expect_error(
      c->Post("/sdapi/v1/txt2img", json{{"prompt", "x"}, {"sampler_name", "Euler a"}}.dump(),
              "application/json"),
      400, "only its own scheduler");
  expect_error(
      c->Post("/v1/jobs", json{{"prompt", "x"}, {"scheduler", "euler"}}.dump(), "application/json"),
      400, "only its own scheduler");
  expect_error(
      c->Post("/v1/jobs",
              json{{"mode", "edit"}, {"prompt", "x"}, {"init_image", img}, {"width", 64}}.dump(),
              "application/json"),
      400, "source image");
  expect_error(c->Post("/v1/jobs", json{{"prompt", "x"}, {"image_guidance_scale", 2.0}}.dump(),
                       "application/json"),
               400, "only for edit jobs");
  // DiT caches: the spec and the block range against this model, before the queue.
  expect_error(
      c->Post("/v1/jobs", json{{"prompt", "x"}, {"cache", "fbcache:2"}}.dump(), "application/json"),
      400, "cache fbcache:2");
  expect_error(c->Post("/v1/jobs", json{{"prompt", "x"}, {"cache", "ditcache:0:99"}}.dump(),
                       "application/json"),
               400, "not within");
  // Refining needs the E1-Full LoRA: the job fails with the pipeline's reason.
  auto r = c->Post("/v1/jobs",
                   json{{"mode", "edit"},
                        {"prompt", "x"},
                        {"init_image", img},
                        {"steps", 2},
                        {"refine_strength", 0.5}}
                       .dump(),
                   "application/json");
  ASSERT_EQ(r->status, 202) << r->body;
  auto job = finished_job(*c, json_of(r)["id"]);
  EXPECT_EQ(job["state"], "failed");
  EXPECT_NE(job["error"].get<std::string>().find("E1 LoRA"), std::string::npos) << job.dump();
}

TEST(ServerHiDream, CancelStopsARunningEdit) {
  SKIP_WITHOUT_HIDREAM();
  TestServer server(hidream_engine(), {});
  auto c = server.client();
  auto r = c->Post("/v1/jobs",
                   json{{"mode", "edit"},
                        {"prompt", "x"},
                        {"init_image", demo_png_base64(32, 32)},
                        {"steps", 150}}
                       .dump(),
                   "application/json");
  ASSERT_EQ(r->status, 202) << r->body;
  const std::string id = json_of(r)["id"];
  std::string text;
  bool cancelled = false;
  auto cancel_client = server.client();
  c->Get("/v1/jobs/" + id + "/events", [&](const char* data, size_t n) {
    text.append(data, n);
    if (!cancelled && text.find("\"step\":1,") != std::string::npos) {
      cancelled = true;
      EXPECT_EQ(cancel_client->Delete("/v1/jobs/" + id)->status, 202);
    }
    return true;
  });
  auto job = json_of(c->Get("/v1/jobs/" + id));
  EXPECT_EQ(job["state"], "cancelled");
  EXPECT_LT(job["progress"]["step"].get<int>(), 150);
}

}  // namespace test_server_hidream
}  // namespace diffuse
