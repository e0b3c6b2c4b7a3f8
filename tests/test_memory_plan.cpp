// The memory plan (pipeline/memory_plan.h): decisions from sizes and a budget, the folder census
// from weight headers, and a HiDream generation that follows a plan with its text encoders one at
// a time giving the same image as with all four loaded.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <filesystem>

#include "diffuse/errors.h"
#include "diffuse/pipeline.h"
#include "io/model_folder.h"
#include "pipeline/hidream.h"
#include "pipeline/memory_plan.h"
#include "pipeline/memory_plan_folder.h"
#include "pipeline/model_source.h"
#include "test_util.h"
#include "verify/verify.h"

namespace diffuse {
namespace test_memory_plan {

namespace fs = std::filesystem;
constexpr int64_t GiB = int64_t{1} << 30;

// HiDream-I1's shapes at bf16, in whole GiB: CLIP-L, CLIP-G, T5-XXL and Llama-3.1-8B, a 17B
// transformer of 48 blocks, the VAE.
pipeline::PlanRequest hidream_like(int64_t budget) {
  pipeline::PlanRequest r;
  r.device = "cpu";
  r.budget = budget;
  r.denoiser_dtype = "bf16";
  r.text_encoders = {{"text_encoder", "CLIP", GiB / 4, 0, 0, 0},
                     {"text_encoder_2", "CLIP", GiB, 0, 0, 0},
                     {"text_encoder_3", "T5", 9 * GiB, 0, 0, 0},
                     {"text_encoder_4", "Llama", 15 * GiB, 0, 0, 0}};
  r.denoiser = {"transformer", "transformer", 32 * GiB, GiB, GiB, 17 * GiB};
  r.vae = {"vae", "VAE", GiB / 4, 0, 0, 0};
  r.text_activations = GiB / 8;
  r.step_activations = GiB;
  r.vae_activations = 2 * GiB;
  r.vae_tiled_activations = GiB / 2;
  r.size = "1024x1024";
  return r;
}

TEST(MemoryPlan, ChoosesTheCheapestPlanThatFitsTheBudget) {
  // Plenty: everything resident, the encoders together, the VAE whole.
  auto big = pipeline::plan_memory(hidream_like(100 * GiB));
  ASSERT_TRUE(big.fits);
  EXPECT_FALSE(big.text_one_at_a_time);
  EXPECT_FALSE(big.stream_denoiser);
  EXPECT_FALSE(big.vae_tiled);
  EXPECT_LE(big.peak, 100 * GiB);
  EXPECT_NE(big.line.find("text encoders together"), std::string::npos) << big.line;

  // A 23 GiB machine: the four encoders (25.25 GiB) cannot be together, the 32 GiB transformer
  // cannot be resident.
  auto small = pipeline::plan_memory(hidream_like(22 * GiB));
  ASSERT_TRUE(small.fits) << small.advice;
  EXPECT_TRUE(small.text_one_at_a_time);
  EXPECT_TRUE(small.stream_denoiser);
  EXPECT_LE(small.peak, 22 * GiB);
  for (const auto& s : small.peaks) EXPECT_LE(s.bytes, 22 * GiB) << s.stage;
  EXPECT_NE(small.line.find("one at a time (largest Llama"), std::string::npos) << small.line;
  EXPECT_NE(small.line.find("streamed block by block"), std::string::npos) << small.line;

  // int8 (17 GiB) resident: the Llama (15 GiB) cannot load beside it, so the transformer is
  // freed before the encoders.
  auto r = hidream_like(22 * GiB);
  r.weight_type = "int8";
  auto q = pipeline::plan_memory(r);
  ASSERT_TRUE(q.fits) << q.advice;
  EXPECT_TRUE(q.quantized_denoiser);
  EXPECT_FALSE(q.stream_denoiser);
  EXPECT_TRUE(q.free_denoiser_for_text);
  EXPECT_NE(q.line.find("int8 resident 17.0 GiB"), std::string::npos) << q.line;

  // With 40 GiB the int8 transformer stays beside the encoders (one at a time).
  r.budget = 40 * GiB;
  auto q40 = pipeline::plan_memory(r);
  ASSERT_TRUE(q40.fits);
  EXPECT_FALSE(q40.free_denoiser_for_text);
  EXPECT_TRUE(q40.text_one_at_a_time);

  // The VAE tiles when only that makes its stage fit.
  auto v = hidream_like(100 * GiB);
  v.budget = 32 * GiB + GiB / 4 + GiB + GiB / 2;  // resident transformer + VAE + step + tiles
  v.text_encoders.resize(2);                      // the CLIPs only: the text stage is small
  auto tiled = pipeline::plan_memory(v);
  ASSERT_TRUE(tiled.fits) << tiled.advice;
  EXPECT_FALSE(tiled.stream_denoiser);
  EXPECT_TRUE(tiled.vae_tiled);
}

// Networks held beside the others (ControlNets) count in every stage, in both of Stable
// Diffusion's residencies, and push a plan over its budget like any other weight.
TEST(MemoryPlan, NetworksHeldThroughoutCountInEveryStage) {
  for (auto residency : {pipeline::PlanRequest::Residency::kPerStage,
                         pipeline::PlanRequest::Residency::kAllResident}) {
    auto r = hidream_like(100 * GiB);
    r.residency = residency;
    r.text_encoders.resize(1);
    r.streaming = "off";  // one candidate: nothing else to give way
    r.vae_tiling = "off";
    const auto without = pipeline::plan_memory(r);
    r.held = {{"cn-a", "ControlNet", GiB / 2, 0, 0, 0}, {"cn-b", "ControlNet", GiB / 4, 0, 0, 0}};
    const auto with = pipeline::plan_memory(r);
    ASSERT_EQ(with.peaks.size(), without.peaks.size());
    for (size_t i = 0; i < with.peaks.size(); ++i)
      EXPECT_EQ(with.peaks[i].bytes, without.peaks[i].bytes + GiB * 3 / 4) << with.peaks[i].stage;
    EXPECT_NE(with.line.find("2 ControlNets 768 MiB held throughout"), std::string::npos)
        << with.line;
    r.budget = without.peak + GiB / 2;  // fits without them, not with them
    EXPECT_FALSE(pipeline::plan_memory(r).fits) << pipeline::plan_memory(r).line;
  }
}

TEST(MemoryPlan, HonoursTheFlagsAndSaysWhatWouldFitWhenNothingDoes) {
  // Streaming off: nothing fits 22 GiB, and the advice names the ways out.
  auto r = hidream_like(22 * GiB);
  r.streaming = "off";
  auto off = pipeline::plan_memory(r);
  EXPECT_FALSE(off.fits);
  EXPECT_NE(off.advice.find("--weights q8_0"), std::string::npos) << off.advice;
  EXPECT_NE(off.advice.find("--stream-weights auto"), std::string::npos) << off.advice;
  EXPECT_NE(off.advice.find("22.0 GiB is available"), std::string::npos) << off.advice;

  // Streaming on is honoured even where resident would fit.
  auto on = hidream_like(100 * GiB);
  on.streaming = "on";
  EXPECT_TRUE(pipeline::plan_memory(on).stream_denoiser);

  // Encoders kept (a server) when they fit, freed when they do not.
  auto keep = hidream_like(100 * GiB);
  keep.keep_text_encoders = true;
  EXPECT_TRUE(pipeline::plan_memory(keep).keep_text_encoders);
  keep.budget = 40 * GiB;
  EXPECT_FALSE(pipeline::plan_memory(keep).keep_text_encoders);

  // A budget below any plan: the smallest plan's peak and no suggestion that would not fit.
  auto tiny = pipeline::plan_memory(hidream_like(GiB));
  EXPECT_FALSE(tiny.fits);
  EXPECT_GT(tiny.peak, GiB);
  EXPECT_NE(tiny.advice.find("nothing the flags offer fits"), std::string::npos) << tiny.advice;

  // A pipeline that cannot split its encoders never plans them one at a time.
  auto nosplit = hidream_like(22 * GiB);
  nosplit.text_one_at_a_time_possible = false;
  auto ns = pipeline::plan_memory(nosplit);
  EXPECT_FALSE(ns.text_one_at_a_time);
  EXPECT_FALSE(ns.fits);

  // Streaming asked of a network with nothing to stream: planned resident, not an empty choice.
  auto blockless = hidream_like(100 * GiB);
  blockless.streaming = "on";
  blockless.denoiser.largest_unit = 0;
  EXPECT_FALSE(pipeline::plan_memory(blockless).stream_denoiser);
  blockless.budget = 0;
  EXPECT_TRUE(pipeline::plan_memory(blockless).fits);

  // Unknown free memory: as asked, and said.
  auto unknown = pipeline::plan_memory(hidream_like(0));
  EXPECT_TRUE(unknown.fits);
  EXPECT_NE(unknown.line.find("not checked"), std::string::npos);
}

TEST(MemoryPlan, ParsesMemorySizes) {
  EXPECT_EQ(pipeline::parse_memory_size("24G", "--max-memory"), 24 * GiB);
  EXPECT_EQ(pipeline::parse_memory_size("24GiB", "--max-memory"), 24 * GiB);
  EXPECT_EQ(pipeline::parse_memory_size("24gb", "--max-memory"), 24 * GiB);
  EXPECT_EQ(pipeline::parse_memory_size("1.5T", "--max-memory"), 1536 * GiB);
  EXPECT_EQ(pipeline::parse_memory_size("512M", "--max-memory"), GiB / 2);
  EXPECT_EQ(pipeline::parse_memory_size("4096", "--max-memory"), 4096);
  for (const char* bad :
       {"", "G", "abc", "-1G", "12X", "1.2.3G", "0", "0.1", "1e3G", "99999999999T"}) {
    try {
      pipeline::parse_memory_size(bad, "--max-memory");
      ADD_FAILURE() << "accepted '" << bad << "'";
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find("--max-memory"), std::string::npos);
    }
  }
}

// The census reads what each network weighs from its files' headers: the same bytes as the
// loaded tensors' element counts at the run dtype.
TEST(MemoryPlan, WeighsAFoldersNetworksFromTheirHeaders) {
  const auto golden = test::hidream_golden_dir();
  if (!fs::exists(golden + "/cases.json")) GTEST_SKIP() << "no golden set at " << golden;
  const auto folder = io::ModelFolder::open(verify::GoldenSet::load(golden).model_dir());
  EXPECT_EQ(pipeline::plan_family(folder), "hidream");
  pipeline::FolderPlanOptions o;
  o.dtype = torch::kBFloat16;
  o.max_memory = 64 * GiB;
  o.width = o.height = 256;
  const auto r = pipeline::plan_request(folder, o);
  ASSERT_EQ(r.text_encoders.size(), 4u);
  EXPECT_EQ(r.text_encoders[2].label, "T5");
  EXPECT_EQ(r.text_encoders[3].label, "Llama");
  auto bf16_bytes = [&](const std::string& component) {
    int64_t b = 0;
    for (const auto& [name, t] : folder.component_weights(component)) b += t.numel() * 2;
    return b;
  };
  EXPECT_EQ(r.text_encoders[3].bytes, bf16_bytes("text_encoder_4"));
  EXPECT_EQ(r.denoiser.bytes, bf16_bytes("transformer"));
  // Blocks stream; one block is a part of the whole.
  EXPECT_GT(r.denoiser.largest_unit, 0);
  EXPECT_LT(r.denoiser.largest_unit + r.denoiser.outside_units, r.denoiser.bytes);
  EXPECT_GT(r.denoiser.quantized_bytes, 0);
  EXPECT_LT(r.denoiser.quantized_bytes, r.denoiser.bytes);
  EXPECT_EQ(r.budget, 64 * GiB);
  EXPECT_TRUE(r.budget_given);
  // Activations grow with the pixels.
  o.width = o.height = 512;
  EXPECT_GT(pipeline::plan_request(folder, o).step_activations, r.step_activations);
  o.weight_type = "q9_9";
  EXPECT_THROW(pipeline::plan_request(folder, o), InvalidArgument);
}

TEST(MemoryPlan, NamesTheFamilyOfEveryGoldenFolder) {
  const fs::path root = fs::path(test::hidream_golden_dir()).parent_path();
  const std::map<std::string, std::string> families = {{"sd21-tiny", "stable-diffusion"},
                                                       {"sdxl-tiny", "stable-diffusion-xl"},
                                                       {"flux-tiny", "flux"},
                                                       {"flux-kontext-tiny", "flux"},
                                                       {"hidream-tiny", "hidream"},
                                                       {"qwen-image-tiny", "qwen-image"},
                                                       {"sd2-inpaint-tiny", "stable-diffusion"}};
  int seen = 0;
  for (const auto& [set, family] : families) {
    if (!fs::exists(root / set / "cases.json")) continue;
    ++seen;
    const auto folder =
        io::ModelFolder::open(verify::GoldenSet::load((root / set).string()).model_dir());
    EXPECT_EQ(pipeline::plan_family(folder), family) << set;
    pipeline::FolderPlanOptions o;
    o.max_memory = 8 * GiB;
    const auto plan = pipeline::plan_folder(folder, o);
    EXPECT_TRUE(plan.fits) << set << ": " << plan.advice;
    EXPECT_EQ(plan.line.rfind("plan: ", 0), 0u) << plan.line;
  }
  if (seen == 0) GTEST_SKIP() << "no golden sets beside " << root;
}

// A budget that fits only with the encoders one at a time: the plan says so, the generation
// follows it, and the image is the one made with all four loaded.
TEST(MemoryPlan, HiDreamEncodersOneAtATimeGiveTheSameImage) {
  const auto golden = test::hidream_golden_dir();
  if (!fs::exists(golden + "/cases.json")) GTEST_SKIP() << "no golden set at " << golden;
  const auto folder = io::ModelFolder::open(verify::GoldenSet::load(golden).model_dir());
  pipeline::HiDreamPipeline pipe(folder, torch::kCPU, torch::kFloat32);
  pipe.set_keep_text_encoders(false);
  pipeline::HiDreamTextToImage t2i;
  t2i.prompt = "a red circle";
  t2i.negative_prompt = "blurry";
  t2i.sampling.steps = 1;
  t2i.sampling.seed = 5;
  t2i.width = t2i.height = static_cast<int>(2 * pipe.size_multiple());
  const auto [w, h] = pipe.normalized_size(t2i.width, t2i.height, pipe.area_side());

  pipe.set_max_memory(64 * GiB);
  const auto together_plan = pipe.plan(w, h, 0);
  ASSERT_TRUE(together_plan.fits);
  ASSERT_FALSE(together_plan.text_one_at_a_time);
  const auto together = pipe.text_to_image(t2i);
  EXPECT_EQ(together.timings.plan, together_plan.line);

  // The largest budget under the together plan's peak at which the plan goes one at a time.
  int64_t budget = 0;
  for (int64_t b = together_plan.peak - 1; b > together_plan.peak / 4;
       b -= together_plan.peak / 256) {
    pipe.set_max_memory(b);
    const auto p = pipe.plan(w, h, 0);
    if (p.fits && p.text_one_at_a_time) {
      budget = b;
      break;
    }
  }
  ASSERT_GT(budget, 0) << "no budget makes the tiny model's encoders go one at a time";
  pipe.set_max_memory(budget);
  const auto one = pipe.text_to_image(t2i);
  EXPECT_NE(one.timings.plan.find("one at a time"), std::string::npos) << one.timings.plan;
  EXPECT_TRUE(torch::equal(one.latents, together.latents));
  EXPECT_TRUE(torch::equal(one.prompt_embeddings.llama, together.prompt_embeddings.llama));

  // Below every plan: refused before the run, saying how much it needs.
  pipe.set_max_memory(1024);
  try {
    pipe.text_to_image(t2i);
    ADD_FAILURE() << "a 1 KiB budget ran";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("this run needs about"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("--max-memory"), std::string::npos) << e.what();
  }
}

// Stable Diffusion's pipeline loads each network for its stage and frees it after (a single
// generation) or keeps all of them (a batch, the server): the plan counts one network per stage
// or all of them in every stage, and the convolutions count under --weights, as they load.
TEST(MemoryPlan, StableDiffusionPlansItsNetworksAsThePipelineHoldsThem) {
  const auto golden = test::golden_dir();
  if (!fs::exists(golden + "/cases.json")) GTEST_SKIP() << "no golden set at " << golden;
  const auto model = verify::GoldenSet::load(golden).model_dir();
  const auto folder = io::ModelFolder::open(model);
  pipeline::FolderPlanOptions o;
  o.dtype = torch::kBFloat16;
  o.max_memory = 8 * GiB;
  auto r = pipeline::plan_request(folder, o);
  EXPECT_EQ(r.residency, pipeline::PlanRequest::Residency::kPerStage);
  ASSERT_EQ(r.text_encoders.size(), 1u);
  int64_t unet_bf16 = 0, linear_only = 0;
  for (const auto& [name, t] : folder.component_weights("unet")) {
    unet_bf16 += t.numel() * 2;
    const bool matrix = t.dim() == 2 && t.size(1) % 32 == 0 && name.find(".weight") != name.npos;
    linear_only += matrix ? t.numel() * 34 / 32 : t.numel() * 2;
  }
  EXPECT_EQ(r.denoiser.bytes, unet_bf16);
  EXPECT_EQ(r.denoiser.largest_unit, 0) << "the UNet does not stream";
  auto plan = pipeline::plan_memory(r);
  ASSERT_TRUE(plan.fits) << plan.advice;
  ASSERT_EQ(plan.peaks.size(), 3u);
  EXPECT_EQ(plan.peaks[0].bytes, r.text_encoders[0].bytes + r.text_activations);
  EXPECT_EQ(plan.peaks[1].bytes, r.denoiser.bytes + r.step_activations);
  EXPECT_EQ(plan.peaks[2].bytes, r.vae.bytes + r.vae_activations);
  EXPECT_NE(plan.line.find("freed after encoding"), std::string::npos) << plan.line;
  EXPECT_NE(plan.line.find("freed after denoising"), std::string::npos) << plan.line;

  o.keep_text_encoders = true;  // every network resident
  r = pipeline::plan_request(folder, o);
  EXPECT_EQ(r.residency, pipeline::PlanRequest::Residency::kAllResident);
  plan = pipeline::plan_memory(r);
  const int64_t all = r.text_encoders[0].bytes + r.denoiser.bytes + r.vae.bytes;
  EXPECT_EQ(plan.peaks[1].bytes, all + r.step_activations);
  EXPECT_NE(plan.line.find(", kept"), std::string::npos) << plan.line;
  EXPECT_EQ(plan.line.find("freed"), std::string::npos) << plan.line;

  // The VAE's weights whose rows are whole blocks are weighed as q8_0 blocks too.
  const int64_t vae_plain = r.vae.bytes;
  int64_t vae_values = 0, vae_blockable = 0;
  for (const auto& [name, t] : folder.component_weights("vae")) {
    vae_values += t.numel();
    const bool rows = t.dim() >= 2 && (t.numel() / t.size(0)) % 32 == 0;
    if (rows && name.find(".weight") != name.npos) vae_blockable += t.numel();
  }
  ASSERT_GT(vae_values, 0);
  const int64_t vae_element = vae_plain / vae_values;
  o.weight_type = "q8_0";  // the convolutions' weights are in blocks too, the VAE's as well
  r = pipeline::plan_request(folder, o);
  EXPECT_LT(r.denoiser.quantized_bytes, linear_only);
  EXPECT_EQ(r.vae.bytes, vae_plain - vae_blockable * vae_element + vae_blockable * 34 / 32);
  EXPECT_NE(pipeline::plan_memory(r).line.find("UNet q8_0 resident"), std::string::npos);
}

// The pipeline prints its plan, and refuses a generation whose plan does not fit before any of
// it runs.
TEST(MemoryPlan, StableDiffusionGenerationPrintsItsPlanAndRefusesOneThatCannotFit) {
  const auto golden = test::golden_dir();
  if (!fs::exists(golden + "/cases.json")) GTEST_SKIP() << "no golden set at " << golden;
  const auto model = verify::GoldenSet::load(golden).model_dir();
  for (bool single : {true, false}) {
    LoadOptions lo;
    lo.device = "cpu";
    lo.single_generation = single;
    lo.max_memory = 8 * GiB;
    auto t2i = Text2Image::load(model, lo);
    GenerationConfig g;
    g.prompts = {"a red circle"};
    g.steps = 1;
    g.width = g.height = 64;
    g.seed = 1;
    const auto out = t2i.generate(g);
    EXPECT_EQ(out.timings.plan.rfind("plan: text encoder ", 0), 0u) << out.timings.plan;
    EXPECT_EQ(out.timings.plan.find("freed after denoising") != std::string::npos, single)
        << out.timings.plan;
  }
  LoadOptions lo;
  lo.device = "cpu";
  lo.max_memory = 1 << 20;  // 1 MiB
  auto t2i = Text2Image::load(model, lo);
  GenerationConfig g;
  g.prompts = {"a red circle"};
  g.steps = 1;
  g.width = g.height = 64;
  try {
    t2i.generate(g);
    ADD_FAILURE() << "a 1 MiB budget ran";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("this run needs about"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("--max-memory"), std::string::npos) << e.what();
  }
}

}  // namespace test_memory_plan
}  // namespace diffuse
