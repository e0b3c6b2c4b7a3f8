// Transformer weight streaming (models/block_streaming.h) on the HiDream golden set's
// transformer: the streamed model gives exactly the resident model's output, zero-copy on the
// CPU (block weights keep viewing the file after a forward) and by per-block copies in another
// dtype; a LoRA merged into a streamed model survives its pages being dropped; the pipeline
// takes the mode by name. The same for FLUX's transformer (flux-tiny), which refuses what
// cannot stream (a LoRA, quantized weights, BFL's fused names) saying why.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <filesystem>
#include <map>

#include "adapters/lora.h"
#include "adapters/lora_merger.h"
#include "cpu_bf16.h"
#include "diffuse/errors.h"
#include "hidream_test_util.h"
#include "io/lora_key_map.h"
#include "io/model_folder.h"
#include "io/safetensors.h"
#include "models/flux_transformer.h"
#include "models/hidream_transformer.h"
#include "models/load_component.h"
#include "pipeline/flux.h"
#include "pipeline/hidream.h"
#include "pipeline/hidream_random_model.h"
#include "test_util.h"
#include "verify/verify.h"

namespace diffuse {
namespace test_weight_streaming {

namespace fs = std::filesystem;

bool have_set() {
  return fs::exists(test::hidream_golden_dir() + "/cases.json");
}

io::ModelFolder golden_folder() {
  return io::ModelFolder::open(verify::GoldenSet::load(test::hidream_golden_dir()).model_dir());
}

// Inputs of the shapes `c` asks for: a square latent of 2 x 2 patches, short texts.
struct Inputs {
  torch::Tensor x, t, t5, llama, pooled;
};
Inputs inputs_for(const models::HiDreamTransformerConfig& c) {
  torch::manual_seed(4);
  const int64_t B = 2, side = 2 * c.patch_size;
  int64_t llama_stack = 0;
  for (auto i : c.llama_layers) llama_stack = std::max(llama_stack, i + 1);
  return {torch::randn({B, c.in_channels, side, side}), torch::tensor({700.0f, 25.5f}),
          torch::randn({B, 7, c.caption_channels[0]}),
          torch::randn({llama_stack, B, 5, c.caption_channels[1]}),
          torch::randn({B, c.text_emb_dim})};
}

torch::Tensor run(models::HiDreamImageTransformer2DModel& m, const Inputs& in) {
  torch::NoGradGuard no_grad;
  return m->forward(in.x, in.t, in.t5, in.llama, in.pooled);
}

TEST(WeightStreaming, ZeroCopyOnTheCpuGivesTheResidentOutput) {
  if (!have_set()) GTEST_SKIP() << "no golden set at " << test::hidream_golden_dir();
  const auto folder = golden_folder();
  const torch::Device cpu(torch::kCPU);
  auto resident = models::load_hidream_transformer(folder, cpu, torch::kFloat32);
  auto streamed = models::load_hidream_transformer(folder, cpu, torch::kFloat32, "transformer",
                                                   /*stream=*/true);
  ASSERT_TRUE(streamed->stream);
  EXPECT_TRUE(streamed->stream->zero_copy());
  EXPECT_EQ(streamed->stream->blocks(),
            streamed->double_blocks.size() + streamed->single_blocks.size());
  EXPECT_GT(streamed->stream->streamed_bytes(), 0);
  const auto in = inputs_for(resident->config());
  const auto want = run(resident, in);
  EXPECT_TRUE(torch::equal(run(streamed, in), want));
  EXPECT_TRUE(torch::equal(run(streamed, in), want));  // pages dropped and read again
  // Nothing was copied: the block weights still view the file.
  for (const auto& p : streamed->named_parameters()) {
    if (p.key().rfind("double_stream_blocks.", 0) == 0 ||
        p.key().rfind("single_stream_blocks.", 0) == 0) {
      EXPECT_TRUE(io::is_file_mapped(p.value())) << p.key();
    }
  }
}

TEST(WeightStreaming, PerBlockCopiesInAnotherDtypeGiveTheResidentOutput) {
  DIFFUSE_SKIP_WITHOUT_CPU_BF16();
  if (!have_set()) GTEST_SKIP() << "no golden set at " << test::hidream_golden_dir();
  const auto folder = golden_folder();
  const torch::Device cpu(torch::kCPU);
  auto resident = models::load_hidream_transformer(folder, cpu, torch::kBFloat16);
  auto streamed = models::load_hidream_transformer(folder, cpu, torch::kBFloat16, "transformer",
                                                   /*stream=*/true);
  ASSERT_TRUE(streamed->stream);
  EXPECT_FALSE(streamed->stream->zero_copy());  // the file is float32
  const auto in = inputs_for(resident->config());
  EXPECT_TRUE(torch::equal(run(streamed, in), run(resident, in)));
}

TEST(WeightStreaming, AMergedLoraSurvivesDroppedPages) {
  if (!have_set()) GTEST_SKIP() << "no golden set at " << test::hidream_golden_dir();
  const auto folder = golden_folder();
  const torch::Device cpu(torch::kCPU);
  auto resident = models::load_hidream_transformer(folder, cpu, torch::kFloat32);
  auto streamed = models::load_hidream_transformer(folder, cpu, torch::kFloat32, "transformer",
                                                   /*stream=*/true);
  // A pair on the first block's image query projection, applied to both models.
  std::string target;
  for (const auto& p : resident->named_parameters())
    if (p.key().rfind("double_stream_blocks.0.", 0) == 0 &&
        p.key().find("to_q.weight") != std::string::npos) {
      target = p.key();
      break;
    }
  ASSERT_FALSE(target.empty());
  const auto w = resident->named_parameters()[target];
  const std::string module = target.substr(0, target.size() - 7);
  torch::manual_seed(8);
  const std::map<std::string, torch::Tensor> t = {
      {module + ".lora_A.weight", torch::randn({2, w.size(1)})},
      {module + ".lora_B.weight", torch::randn({w.size(0), 2})}};
  auto apply = [&](models::HiDreamImageTransformer2DModel& m) {
    std::vector<adapters::Network> nets{{io::lora::transformer_names(), m.get()}};
    auto merger = std::make_unique<adapters::LoraMerger>(nets);
    merger->add(adapters::make_lora(t, {}, "test", nets), 1.0);
    return merger;
  };
  const auto m1 = apply(resident);
  const auto m2 = apply(streamed);
  const auto in = inputs_for(resident->config());
  const auto want = run(resident, in);
  EXPECT_TRUE(torch::equal(run(streamed, in), want));
  EXPECT_TRUE(torch::equal(run(streamed, in), want));  // after the block's pages were dropped
  EXPECT_FALSE(io::is_file_mapped(streamed->named_parameters()[target]));  // its own copy
}

// create-demo-model --arch hidream-i1's writer, on a small config with a tiny shard size (so
// that blocks spread over several shards): every tensor is bf16, the folder loads by name,
// resident or streamed zero-copy, with the same output.
TEST(WeightStreaming, RandomTransformerWriterMakesALoadableShardedFolder) {
  DIFFUSE_SKIP_WITHOUT_CPU_BF16();
  test::TempDir dir;
  pipeline::RandomHiDreamOptions o;
  o.config = test::tiny_hidream_config();
  o.config["num_layers"] = 2;  // blocks of both kinds spread over several shards
  o.config["llama_layers"] = {1, 0, 1, 1};
  o.shard_bytes = 8 << 10;
  const int64_t bytes = pipeline::create_random_hidream_i1(dir.path().string(), o);
  const auto folder = io::ModelFolder::open(dir.path().string());
  EXPECT_EQ(models::component_weight_bytes(folder, "transformer"), bytes);
  int shards = 0;
  for (const auto& e : fs::directory_iterator(dir.path() / "transformer"))
    if (e.path().extension() == ".safetensors") {
      ++shards;
      const std::string name = e.path().filename().string();
      EXPECT_NE(name.find("-of-"), std::string::npos) << name;
      // Held: names() is a reference into the file object.
      const auto file = io::SafetensorsFile::open(e.path().string());
      for (const auto& t : file->names())
        EXPECT_EQ(file->get(t).scalar_type(), torch::kBFloat16) << t;
    }
  EXPECT_GT(shards, 2);
  const torch::Device cpu(torch::kCPU);
  auto resident = models::load_hidream_transformer(folder, cpu, torch::kBFloat16);
  auto streamed =
      models::load_hidream_transformer(folder, cpu, torch::kBFloat16, "transformer", true);
  EXPECT_TRUE(streamed->stream->zero_copy());
  const auto in = inputs_for(resident->config());
  const auto out = run(resident, in);
  EXPECT_TRUE(torch::isfinite(out).all().item<bool>());
  EXPECT_TRUE(torch::equal(run(streamed, in), out));
}

// The writer's folder depends on its seed alone: LibTorch's global generator, drawn from in
// between, changes nothing (the MoE gates once took their values from it).
TEST(WeightStreaming, RandomTransformerWriterDependsOnItsSeedAlone) {
  pipeline::RandomHiDreamOptions o;
  o.config = test::tiny_hidream_config();
  auto write = [&](const fs::path& dir, uint64_t global_seed) {
    torch::manual_seed(global_seed);
    pipeline::create_random_hidream_i1(dir.string(), o);
    std::map<std::string, torch::Tensor> weights;
    for (const auto& e : fs::directory_iterator(dir / "transformer"))
      if (e.path().extension() == ".safetensors")
        for (auto& [name, t] : io::SafetensorsFile::open(e.path().string())->load_all())
          weights[name] = t.clone();
    return weights;
  };
  test::TempDir a, b;
  const auto first = write(a.path(), 1), second = write(b.path(), 2);
  ASSERT_EQ(first.size(), second.size());
  for (const auto& [name, t] : first) {
    ASSERT_TRUE(second.count(name)) << name;
    EXPECT_TRUE(torch::equal(second.at(name), t)) << name;
  }
  o.seed += 1;
  test::TempDir c;
  const auto other = write(c.path(), 1);
  int gates = 0;
  for (const auto& [name, t] : first)
    if (name.find(".gate.weight") != std::string::npos) {
      ++gates;
      EXPECT_FALSE(torch::equal(other.at(name), t)) << name << " does not follow the seed";
    }
  EXPECT_GT(gates, 0);
}

TEST(WeightStreaming, ThePipelineTakesTheModeByName) {
  if (!have_set()) GTEST_SKIP() << "no golden set at " << test::hidream_golden_dir();
  const auto folder = golden_folder();
  pipeline::HiDreamPipeline pipe(folder, torch::Device(torch::kCPU), torch::kFloat32);
  EXPECT_THROW(pipe.set_weight_streaming("sometimes"), InvalidArgument);
  pipe.set_weight_streaming("on");
  pipe.transformer();
  EXPECT_TRUE(pipe.streams_weights());
  EXPECT_THROW(pipe.set_weight_streaming("off"), InvalidArgument);  // already loaded
  pipeline::HiDreamPipeline small(folder, torch::Device(torch::kCPU), torch::kFloat32);
  small.transformer();  // auto: a tiny transformer fits
  EXPECT_FALSE(small.streams_weights());
}

// --- FLUX -------------------------------------------------------------------------------------

bool have_flux() {
  return fs::exists(test::flux_golden_dir() + "/cases.json");
}

// One forward of the tiny FLUX transformer on fixed inputs of the shapes its config asks for.
torch::Tensor flux_forward(models::FluxTransformer2DModel& m, torch::Dtype dtype) {
  const auto& c = m->config();
  auto gen = at::detail::createCPUGenerator(3);
  auto x = torch::randn({1, 16, c.in_channels}, gen).to(dtype);
  auto enc = torch::randn({1, 5, c.joint_attention_dim}, gen).to(dtype);
  auto pooled = torch::randn({1, c.pooled_projection_dim}, gen).to(dtype);
  auto t = torch::full({1}, 0.7f), g = torch::full({1}, 3.5f);
  torch::InferenceMode guard;
  return m->forward(x, t, enc, pooled, models::flux_image_ids(8, 8), torch::zeros({5, 3}),
                    c.guidance_embeds ? g : torch::Tensor());
}

TEST(WeightStreaming, FluxStreamedGivesTheResidentOutputZeroCopyAndByCopies) {
  if (!have_flux()) GTEST_SKIP() << "no set at " << test::flux_golden_dir();
  const auto folder = io::ModelFolder::open(test::flux_golden_dir() + "/model");
  for (auto dtype : {torch::kFloat32, torch::kBFloat16}) {
    if (dtype == torch::kBFloat16 && !test::cpu_runs_bf16()) continue;
    auto resident = models::load_flux_transformer(folder, torch::kCPU, dtype);
    auto streamed = models::load_flux_transformer(folder, torch::kCPU, dtype, "transformer", {},
                                                  nullptr, /*stream=*/true);
    ASSERT_NE(streamed->stream, nullptr);
    EXPECT_EQ(streamed->stream->blocks(),
              resident->double_blocks.size() + resident->single_blocks.size());
    // The tiny set's files are float32: zero-copy in float32, per-block copies in bf16.
    EXPECT_EQ(streamed->stream->zero_copy(), dtype == torch::kFloat32);
    const auto a = flux_forward(resident, dtype), b = flux_forward(streamed, dtype);
    EXPECT_TRUE(torch::equal(a, b)) << c10::toString(dtype);
    // A second call, after the blocks' pages or copies went: the same again.
    EXPECT_TRUE(torch::equal(a, flux_forward(streamed, dtype))) << c10::toString(dtype);
  }
}

TEST(WeightStreaming, FluxPipelineTakesTheModeAndRefusesWhatCannotStream) {
  if (!have_flux()) GTEST_SKIP() << "no set at " << test::flux_golden_dir();
  const auto dir = test::flux_golden_dir() + "/model";
  const auto folder = io::ModelFolder::open(dir);
  pipeline::FluxPipeline pipe(folder, torch::kCPU, torch::kFloat32);
  EXPECT_THROW(pipe.set_weight_streaming("sometimes"), InvalidArgument);
  pipe.set_weight_streaming("on");
  EXPECT_NE(test::expect_throw<InvalidArgument>([&] {
              pipe.set_weight_type("q8_0");
            }).find("exclude each other"),
            std::string::npos);
  EXPECT_NE(test::expect_throw<InvalidArgument>([&] {
              pipe.add_lora("any.safetensors", 1.0);
            }).find("--stream-weights off"),
            std::string::npos);
  pipe.transformer();
  EXPECT_TRUE(pipe.streams_weights());
  EXPECT_THROW(pipe.set_weight_streaming("off"), InvalidArgument);  // already loaded
  pipeline::FluxPipeline small(folder, torch::kCPU, torch::kFloat32);
  small.transformer();  // auto: a tiny transformer fits
  EXPECT_FALSE(small.streams_weights());

  // BFL's names fuse what diffusers splits: nothing to view, "on" says so before loading.
  test::TempDir tmp;
  const auto file = tmp.file("flux-bfl-named.safetensors");
  {
    auto weights = folder.component_weights("transformer");
    std::vector<std::pair<std::string, torch::Tensor>> renamed;
    for (const auto& [k, v] : weights) renamed.emplace_back("double_blocks_renamed." + k, v);
    io::save_safetensors(file, renamed);
  }
  auto other = io::ModelFolder::open(dir);
  other.set_component_weights_file("transformer", file);
  auto message = test::expect_throw<InvalidArgument>([&] {
    models::load_flux_transformer(other, torch::kCPU, torch::kFloat32, "transformer", {}, nullptr,
                                  /*stream=*/true);
  });
  EXPECT_NE(message.find("another key layout"), std::string::npos) << message;
}

}  // namespace test_weight_streaming
}  // namespace diffuse
