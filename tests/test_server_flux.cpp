// diffuse serve with FLUX models (the flux-tiny and flux-kontext-tiny golden models): the modes
// each folder runs, a Kontext edit job with the library's pixels, text-to-image with a negative
// prompt (true CFG), and what a FLUX.1 text-to-image server refuses.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <filesystem>

#include "diffuse/errors.h"
#include "io/model_folder.h"
#include "pipeline/flux.h"
#include "pipeline/stable_diffusion.h"
#include "server/base64.h"
#include "server/flux_engine.h"
#include "server_test_util.h"
#include "test_util.h"

namespace diffuse {
namespace test_server_flux {

using nlohmann::json;
using test::demo_png_base64;
using test::expect_error;
using test::finished_job;
using test::image_at;
using test::json_of;
using test::TestServer;

bool have(const std::string& set) {
  return std::filesystem::exists(set + "/model/model_index.json");
}

server::FluxEngine& engine(const std::string& set) {
  // One engine per model and process, as `diffuse serve` keeps it (lives until exit).
  static std::map<std::string, server::FluxEngine*> engines;
  auto& e = engines[set];
  if (!e) {
    LoadOptions lo;
    lo.device = "cpu";
    lo.dtype = "fp32";
    e = new server::FluxEngine(set + "/model", lo);
  }
  return *e;
}

TEST(ServerFlux, KontextEditJobGivesTheLibrarysPixels) {
  const auto set = test::flux_kontext_golden_dir();
  if (!have(set)) GTEST_SKIP() << "no FLUX Kontext model at " << set;
  TestServer server(engine(set), {});
  auto c = server.client();
  auto s = json_of(c->Get("/v1/status"));
  EXPECT_EQ(s["modes"], json::array({"txt2img", "edit"}));
  EXPECT_EQ(s["scheduler"], "FlowMatchEulerDiscreteScheduler");
  const std::string source_b64 = demo_png_base64(64, 48);
  const json edit_job = {{"mode", "edit"},
                         {"prompt", "make it blue"},
                         {"init_image", source_b64},
                         {"steps", 2},
                         {"guidance_scale", 2.5},
                         {"seed", 11},
                         // No per-step previews: a ~1 MP edit's are slow to encode.
                         {"preview", false}};
  auto r = c->Post("/v1/jobs", edit_job.dump(), "application/json");
  ASSERT_EQ(r->status, 202) << r->body;
  auto job = finished_job(*c, json_of(r)["id"]);
  ASSERT_EQ(job["state"], "succeeded") << job.dump();
  EXPECT_EQ(job["timings"]["steps"], 2);
  Image got = image_at(*c, job["images"][0]["url"]);

  const Image source = decode_png(server::base64_decode(source_b64, "png"), "source", 1 << 20);
  pipeline::FluxPipeline pipe(io::ModelFolder::open(set + "/model"), torch::kCPU, torch::kFloat32);
  pipeline::FluxEdit e;
  e.prompt = "make it blue";
  e.image = torch::from_blob(const_cast<uint8_t*>(source.rgb.data()),
                             {source.height, source.width, 3}, torch::kUInt8)
                .clone();
  e.max_area = 0;
  e.sampling.steps = 2;
  e.sampling.guidance_scale = 2.5;
  e.sampling.seed = 11;
  const Image want = pipeline::to_images(pipe.edit(e).image)[0];
  // The source was resized to Kontext's training resolution closest to 4:3 (1184x880).
  EXPECT_EQ(got.width, want.width);
  EXPECT_EQ(got.height, want.height);
  EXPECT_EQ(got.width, 1184);
  EXPECT_EQ(got.rgb, want.rgb) << "the server's edit differs from the library's";

  // auto_resize false: the source keeps its own size (the CLI's --no-auto-resize), the
  // library's pixels again.
  json kept_size = edit_job;
  kept_size["auto_resize"] = false;
  r = c->Post("/v1/jobs", kept_size.dump(), "application/json");
  ASSERT_EQ(r->status, 202) << r->body;
  job = finished_job(*c, json_of(r)["id"]);
  ASSERT_EQ(job["state"], "succeeded") << job.dump();
  EXPECT_EQ(job["request"]["auto_resize"], false) << job.dump();
  got = image_at(*c, job["images"][0]["url"]);
  e.auto_resize = false;
  const Image kept = pipeline::to_images(pipe.edit(e).image)[0];
  EXPECT_EQ(got.width, source.width / pipe.size_multiple() * pipe.size_multiple());
  EXPECT_EQ(got.height, source.height / pipe.size_multiple() * pipe.size_multiple());
  EXPECT_EQ(got.rgb, kept.rgb);
  // Only edits take it.
  expect_error(
      c->Post("/v1/jobs", json{{"prompt", "x"}, {"auto_resize", false}}.dump(), "application/json"),
      400, "auto_resize");
}

TEST(ServerFlux, Txt2ImgServerRunsNegativePromptsAndRefusesEdits) {
  const auto set = test::flux_golden_dir();
  if (!have(set)) GTEST_SKIP() << "no FLUX model at " << set;
  TestServer server(engine(set), {});
  auto c = server.client();
  EXPECT_EQ(json_of(c->Get("/v1/status"))["modes"], json::array({"txt2img"}));
  auto r = c->Post("/v1/jobs",
                   json{{"prompt", "a cat"},
                        {"negative_prompt", "blurry"},
                        {"width", 64},
                        {"height", 32},
                        {"steps", 2},
                        {"seed", 3}}
                       .dump(),
                   "application/json");
  ASSERT_EQ(r->status, 202) << r->body;
  auto job = finished_job(*c, json_of(r)["id"]);
  ASSERT_EQ(job["state"], "succeeded") << job.dump();
  Image a = image_at(*c, job["images"][0]["url"]);
  EXPECT_EQ(a.width, 64);
  EXPECT_EQ(a.height, 32);
  expect_error(
      c->Post(
          "/v1/jobs",
          json{{"mode", "edit"}, {"prompt", "x"}, {"init_image", demo_png_base64(32, 32)}}.dump(),
          "application/json"),
      400, "edit");
  // A Kontext-only field on FLUX.1-dev.
  expect_error(
      c->Post("/v1/jobs",
              json{{"prompt", "x"}, {"width", 64}, {"height", 32}, {"auto_resize", true}}.dump(),
              "application/json"),
      400, "auto_resize");
}

// `diffuse serve --transformer FILE` on a FLUX folder: the engine loads the transformer from
// the file (here the folder's own weights given as a file: the same image); --e1-lora is
// HiDream's only.
TEST(ServerFlux, TransformerFromAFileAndHiDreamOnlyFlagsRefused) {
  const auto set = test::flux_golden_dir();
  if (!have(set)) GTEST_SKIP() << "no FLUX model at " << set;
  LoadOptions lo;
  lo.device = "cpu";
  lo.dtype = "fp32";
  server::HiDreamEngineOptions from_file;
  from_file.transformer = set + "/model/transformer/diffusion_pytorch_model.safetensors";
  auto e = server::load_engine(set + "/model", lo, from_file);
  EXPECT_EQ(e->info().model, set + "/model");
  EXPECT_EQ(e->defaults().kinds, std::vector<server::JobKind>{server::JobKind::txt2img});
  server::HiDreamEngineOptions e1;
  e1.e1_lora = set + "/model/transformer/diffusion_pytorch_model.safetensors";
  const auto msg =
      test::expect_throw<InvalidArgument>([&] { server::load_engine(set + "/model", lo, e1); });
  EXPECT_NE(msg.find("--e1-lora"), std::string::npos) << msg;
  server::HiDreamEngineOptions missing;
  missing.transformer = set + "/nothing.safetensors";
  EXPECT_THROW(server::load_engine(set + "/model", lo, missing), IoError);
}

}  // namespace test_server_flux
}  // namespace diffuse
