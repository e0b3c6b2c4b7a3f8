// Single-file SDXL checkpoints (generative-models' layout: model.diffusion_model.* with
// label_emb, first_stage_model.*, conditioner.embedders.{0.transformer (CLIP-L), 1.model
// (OpenCLIP ViT-bigG with text_projection)}; a refiner has only embedders.0.model). The sdxl-tiny
// set has no such file, so the test writes one from the diffusers folders by the inverse of the
// documented key layout (io/ldm_checkpoint.h), loads it with --config = the folder, and the
// pipeline must draw the folder's image bit for bit. SD1/SD2 single files are checked against a
// file made by the reference converter (test_ldm_checkpoint.cpp); this checks the SDXL parts.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <filesystem>

#include "diffuse/errors.h"
#include "diffuse/pipeline.h"
#include "io/model_folder.h"
#include "io/safetensors.h"
#include "io/string_affixes.h"
#include "pipeline_test_util.h"
#include "test_util.h"

namespace diffuse {
namespace test_sdxl_single_file {

namespace fs = std::filesystem;
using TensorList = std::vector<std::pair<std::string, torch::Tensor>>;
using TensorMap = std::map<std::string, torch::Tensor>;
using io::starts_with;

// Renames the keys under `from` to `to` + the rest, with `table` (diffusers -> LDM sub-prefix)
// applied to the start of the rest.
void move(const TensorMap& in, const std::string& from, const std::string& to, TensorList& out,
          const std::vector<std::pair<std::string, std::string>>& table = {{"", ""}}) {
  for (auto it = in.lower_bound(from); it != in.end() && starts_with(it->first, from); ++it) {
    const std::string rest = it->first.substr(from.size());
    for (const auto& [d, l] : table)
      if (starts_with(rest, d)) {
        out.emplace_back(to + l + rest.substr(d.size()), it->second);
        break;
      }
  }
}

const std::vector<std::pair<std::string, std::string>> kResnet = {
    {"norm1.", "in_layers.0."},          {"conv1.", "in_layers.2."},
    {"time_emb_proj.", "emb_layers.1."}, {"norm2.", "out_layers.0."},
    {"conv2.", "out_layers.3."},         {"conv_shortcut.", "skip_connection."}};

// The diffusers UNet in LDM names (openaimodel's numbering of input/output blocks).
void add_unet(const io::ModelFolder& folder, TensorList& out) {
  const auto w = folder.component_weights("unet");
  const auto cfg = folder.component_config("unet").json();
  const int n = cfg["layers_per_block"].get<int>();
  const auto down = cfg["down_block_types"], up = cfg["up_block_types"];
  const std::string p = "model.diffusion_model.";
  move(w, "time_embedding.linear_1.", p + "time_embed.0.", out);
  move(w, "time_embedding.linear_2.", p + "time_embed.2.", out);
  move(w, "add_embedding.linear_1.", p + "label_emb.0.0.", out);
  move(w, "add_embedding.linear_2.", p + "label_emb.0.2.", out);
  move(w, "conv_in.", p + "input_blocks.0.0.", out);
  move(w, "conv_norm_out.", p + "out.0.", out);
  move(w, "conv_out.", p + "out.2.", out);
  for (size_t l = 0; l < down.size(); ++l) {
    const std::string d = "down_blocks." + std::to_string(l) + ".";
    for (int r = 0; r < n; ++r) {
      const std::string entry = p + "input_blocks." + std::to_string(1 + l * (n + 1) + r) + ".";
      move(w, d + "resnets." + std::to_string(r) + ".", entry + "0.", out, kResnet);
      move(w, d + "attentions." + std::to_string(r) + ".", entry + "1.", out);
    }
    move(w, d + "downsamplers.0.conv.",
         p + "input_blocks." + std::to_string(1 + l * (n + 1) + n) + ".0.op.", out);
  }
  move(w, "mid_block.resnets.0.", p + "middle_block.0.", out, kResnet);
  move(w, "mid_block.attentions.0.", p + "middle_block.1.", out);
  move(w, "mid_block.resnets.1.", p + "middle_block.2.", out, kResnet);
  for (size_t j = 0; j < up.size(); ++j) {
    const std::string u = "up_blocks." + std::to_string(j) + ".";
    for (int r = 0; r <= n; ++r) {
      const std::string entry = p + "output_blocks." + std::to_string(j * (n + 1) + r) + ".";
      move(w, u + "resnets." + std::to_string(r) + ".", entry + "0.", out, kResnet);
      move(w, u + "attentions." + std::to_string(r) + ".", entry + "1.", out);
    }
    const bool attention = up[j] == "CrossAttnUpBlock2D";
    move(w, u + "upsamplers.0.conv.",
         p + "output_blocks." + std::to_string(j * (n + 1) + n) + (attention ? ".2" : ".1") +
             ".conv.",
         out);
  }
}

void add_vae(const io::ModelFolder& folder, TensorList& out) {
  const auto w = folder.component_weights("vae");
  const int levels =
      static_cast<int>(folder.component_config("vae").json()["block_out_channels"].size());
  const std::string p = "first_stage_model.";
  const std::vector<std::pair<std::string, std::string>> resnet = {
      {"norm1.", "norm1."},
      {"conv1.", "conv1."},
      {"norm2.", "norm2."},
      {"conv2.", "conv2."},
      {"conv_shortcut.", "nin_shortcut."}};
  for (const std::string part : {"encoder.", "decoder."}) {
    for (const char* same : {"conv_in.", "conv_out."}) move(w, part + same, p + part + same, out);
    move(w, part + "conv_norm_out.", p + part + "norm_out.", out);
    move(w, part + "mid_block.resnets.0.", p + part + "mid.block_1.", out, resnet);
    move(w, part + "mid_block.resnets.1.", p + part + "mid.block_2.", out, resnet);
    move(w, part + "mid_block.attentions.0.", p + part + "mid.attn_1.", out,
         {{"group_norm.", "norm."},
          {"to_q.", "q."},
          {"to_k.", "k."},
          {"to_v.", "v."},
          {"to_out.0.", "proj_out."}});
  }
  for (int l = 0; l < levels; ++l) {
    const std::string e = "encoder.down_blocks." + std::to_string(l) + ".";
    move(w, e + "resnets.", p + "encoder.down." + std::to_string(l) + ".block.", out);
    move(w, e + "downsamplers.0.conv.",
         p + "encoder.down." + std::to_string(l) + ".downsample.conv.", out);
    const std::string d = "decoder.up_blocks." + std::to_string(levels - 1 - l) + ".";
    move(w, d + "resnets.", p + "decoder.up." + std::to_string(l) + ".block.", out);
    move(w, d + "upsamplers.0.conv.", p + "decoder.up." + std::to_string(l) + ".upsample.conv.",
         out);
  }
  for (const char* same : {"quant_conv.", "post_quant_conv."}) move(w, same, p + same, out);
  // The resnets' own names: nin_shortcut in LDM.
  for (auto& [name, t] : out) {
    const auto at = name.find(".conv_shortcut.");
    if (starts_with(name, p) && at != std::string::npos)
      name = name.substr(0, at) + ".nin_shortcut." + name.substr(at + 15);
  }
}

// The ViT-bigG encoder (CLIPTextModelWithProjection) in OpenCLIP's names.
void add_open_clip(const io::ModelFolder& folder, const std::string& p, TensorList& out) {
  const auto w = folder.component_weights("text_encoder_2");
  const int layers = folder.component_config("text_encoder_2").json()["num_hidden_layers"];
  const std::string t = "text_model.";
  out.emplace_back(p + "token_embedding.weight", w.at(t + "embeddings.token_embedding.weight"));
  out.emplace_back(p + "positional_embedding", w.at(t + "embeddings.position_embedding.weight"));
  move(w, t + "final_layer_norm.", p + "ln_final.", out);
  out.emplace_back(p + "text_projection", w.at("text_projection.weight").t().contiguous());
  out.emplace_back(p + "logit_scale", torch::tensor(4.6));
  for (int i = 0; i < layers; ++i) {
    const std::string d = t + "encoder.layers." + std::to_string(i) + ".",
                      l = p + "transformer.resblocks." + std::to_string(i) + ".";
    move(w, d, l, out,
         {{"layer_norm1.", "ln_1."},
          {"layer_norm2.", "ln_2."},
          {"self_attn.out_proj.", "attn.out_proj."},
          {"mlp.fc1.", "mlp.c_fc."},
          {"mlp.fc2.", "mlp.c_proj."}});
    for (const std::string kind : {"weight", "bias"})
      out.emplace_back(
          l + "attn.in_proj_" + kind,
          torch::cat({w.at(d + "self_attn.q_proj." + kind), w.at(d + "self_attn.k_proj." + kind),
                      w.at(d + "self_attn.v_proj." + kind)}));
  }
}

class SdxlSingleFile : public ::testing::Test {
 protected:
  void SetUp() override {
    base_ = verify::GoldenSet::load(test::sdxl_golden_dir()).model_dir();
    if (!fs::exists(base_ + "/model_index.json")) GTEST_SKIP() << "no sdxl golden set";
  }
  // The folder's weights as one LDM-layout checkpoint.
  std::string write_checkpoint(const std::string& folder_dir, const std::string& name) const {
    const auto folder = io::ModelFolder::open(folder_dir);
    TensorList tensors;
    add_unet(folder, tensors);
    add_vae(folder, tensors);
    if (folder.has_component("text_encoder")) {
      for (const auto& [k, t] : folder.component_weights("text_encoder"))
        tensors.emplace_back("conditioner.embedders.0.transformer." + k, t);
      add_open_clip(folder, "conditioner.embedders.1.model.", tensors);
    } else {
      add_open_clip(folder, "conditioner.embedders.0.model.", tensors);  // a refiner
    }
    const std::string path = tmp_.file(name);
    io::save_safetensors(path, tensors);
    return path;
  }
  static std::vector<uint8_t> image(Text2Image& t2i) {
    GenerationConfig g;
    g.prompts = {"a red circle"};
    g.negative_prompts = {"blurry"};
    g.steps = 2;
    g.seed = 5;
    return t2i.generate(g).images.at(0).rgb;
  }

  std::string base_;
  test::TempDir tmp_;
};

TEST_F(SdxlSingleFile, BaseAndRefinerDrawTheirFoldersImages) {
  const std::string refiner = (fs::path(base_).parent_path() / "model_refiner").string();
  for (const std::string& folder : {base_, refiner}) {
    if (!fs::exists(folder + "/model_index.json")) continue;
    const auto file = write_checkpoint(folder, "sdxl.safetensors");
    LoadOptions o = test::fp32_cpu();
    o.config_dir = folder;
    auto single = Text2Image::load(file, o);
    auto from_folder = Text2Image::load(folder, test::fp32_cpu());
    EXPECT_EQ(image(single), image(from_folder)) << folder;
  }
}

TEST_F(SdxlSingleFile, NeedsItsConfigFolderAndRefusesAnotherOne) {
  const auto file = write_checkpoint(base_, "sdxl.safetensors");
  auto msg = test::expect_throw<FormatError>([&] { Text2Image::load(file, test::fp32_cpu()); });
  EXPECT_NE(msg.find("--config"), std::string::npos) << msg;
  EXPECT_NE(msg.find("SDXL"), std::string::npos) << msg;
  // An SD2 folder's configs do not describe this UNet: the key and both values.
  LoadOptions o = test::fp32_cpu();
  o.config_dir = test::golden_model_dir();
  msg = test::expect_throw<Error>([&] { Text2Image::load(file, o); });
  EXPECT_NE(msg.find("config.json"), std::string::npos) << msg;
}

}  // namespace test_sdxl_single_file
}  // namespace diffuse
