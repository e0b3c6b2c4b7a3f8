// The LDM key mapping and config inference on the real SD1.5 / SD2.1 structures. The key sets
// are written here the way the original training code (ldm.modules.diffusionmodules) lays
// them out, with stride-0 tensors: full shapes, no memory, no files.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "io/ldm_key_map.h"

namespace diffuse {
namespace test_ldm_real_shapes {

using io::ldm::TensorMap;
using json = nlohmann::json;

torch::Tensor shaped(std::vector<int64_t> shape) {
  return torch::zeros({1}).expand(shape);
}

struct UnetSpec {
  int64_t in = 4, out = 4, mc = 320, context = 1024;
  std::vector<int64_t> mult = {1, 2, 4, 4};
  std::vector<bool> attention = {true, true, true, false};
  int res_blocks = 2;
  bool linear = true;
};

class LdmUnetWriter {
 public:
  explicit LdmUnetWriter(const UnetSpec& s) : s_(s) {}

  TensorMap build() {
    int64_t temb = 4 * s_.mc;
    add("time_embed.0", {temb, s_.mc});
    add("time_embed.2", {temb, temb});
    add("input_blocks.0.0", {s_.mc, s_.in, 3, 3});
    std::vector<int64_t> skips = {s_.mc};
    int64_t ch = s_.mc;
    int n = 1;
    for (size_t l = 0; l < s_.mult.size(); ++l) {
      for (int r = 0; r < s_.res_blocks; ++r, ++n) {
        std::string e = "input_blocks." + std::to_string(n);
        resnet(e + ".0", ch, s_.mc * s_.mult[l]);
        ch = s_.mc * s_.mult[l];
        if (s_.attention[l]) transformer(e + ".1", ch);
        skips.push_back(ch);
      }
      if (l + 1 < s_.mult.size()) {
        add("input_blocks." + std::to_string(n++) + ".0.op", {ch, ch, 3, 3});
        skips.push_back(ch);
      }
    }
    resnet("middle_block.0", ch, ch);
    transformer("middle_block.1", ch);
    resnet("middle_block.2", ch, ch);
    n = 0;
    for (size_t l = s_.mult.size(); l-- > 0;) {
      for (int r = 0; r <= s_.res_blocks; ++r, ++n) {
        std::string e = "output_blocks." + std::to_string(n);
        int64_t skip = skips.back();
        skips.pop_back();
        resnet(e + ".0", ch + skip, s_.mc * s_.mult[l]);
        ch = s_.mc * s_.mult[l];
        if (s_.attention[l]) transformer(e + ".1", ch);
        if (l > 0 && r == s_.res_blocks)
          add(e + (s_.attention[l] ? ".2" : ".1") + ".conv", {ch, ch, 3, 3});
      }
    }
    add("out.0", {ch});
    add("out.2", {s_.out, ch, 3, 3});
    return m_;
  }

 private:
  void add(const std::string& name, std::vector<int64_t> weight) {
    m_[name + ".weight"] = shaped(weight);
    m_[name + ".bias"] = shaped({weight[0]});
  }
  void resnet(const std::string& p, int64_t in, int64_t out) {
    add(p + ".in_layers.0", {in});
    add(p + ".in_layers.2", {out, in, 3, 3});
    add(p + ".emb_layers.1", {out, 4 * s_.mc});
    add(p + ".out_layers.0", {out});
    add(p + ".out_layers.3", {out, out, 3, 3});
    if (in != out) add(p + ".skip_connection", {out, in, 1, 1});
  }
  void transformer(const std::string& p, int64_t ch) {
    std::vector<int64_t> proj =
        s_.linear ? std::vector<int64_t>{ch, ch} : std::vector<int64_t>{ch, ch, 1, 1};
    add(p + ".norm", {ch});
    add(p + ".proj_in", proj);
    add(p + ".proj_out", proj);
    std::string b = p + ".transformer_blocks.0.";
    for (const char* attn : {"attn1", "attn2"}) {
      int64_t kv = std::string(attn) == "attn2" ? s_.context : ch;
      m_[b + attn + ".to_q.weight"] = shaped({ch, ch});
      m_[b + attn + ".to_k.weight"] = shaped({ch, kv});
      m_[b + attn + ".to_v.weight"] = shaped({ch, kv});
      add(b + attn + ".to_out.0", {ch, ch});
    }
    add(b + "ff.net.0.proj", {8 * ch, ch});
    add(b + "ff.net.2", {ch, 4 * ch});
    for (const char* norm : {"norm1", "norm2", "norm3"}) add(b + norm, {ch});
  }

  UnetSpec s_;
  TensorMap m_;
};

// The SD1/SD2 VAE (ch 128, ch_mult 1,2,4,4, 2 res blocks, z 4).
TensorMap ldm_vae() {
  TensorMap m;
  auto add = [&](const std::string& name, std::vector<int64_t> w) {
    m[name + ".weight"] = shaped(w);
    m[name + ".bias"] = shaped({w[0]});
  };
  auto resnet = [&](const std::string& p, int64_t in, int64_t out) {
    add(p + ".norm1", {in});
    add(p + ".conv1", {out, in, 3, 3});
    add(p + ".norm2", {out});
    add(p + ".conv2", {out, out, 3, 3});
    if (in != out) add(p + ".nin_shortcut", {out, in, 1, 1});
  };
  auto mid = [&](const std::string& p, int64_t c) {
    resnet(p + ".mid.block_1", c, c);
    add(p + ".mid.attn_1.norm", {c});
    for (const char* x : {"q", "k", "v", "proj_out"}) add(p + ".mid.attn_1." + x, {c, c, 1, 1});
    resnet(p + ".mid.block_2", c, c);
  };
  std::vector<int64_t> mult = {1, 2, 4, 4};
  int64_t ch = 128;
  add("encoder.conv_in", {ch, 3, 3, 3});
  for (size_t l = 0; l < mult.size(); ++l) {
    for (int r = 0; r < 2; ++r) {
      resnet("encoder.down." + std::to_string(l) + ".block." + std::to_string(r), ch,
             128 * mult[l]);
      ch = 128 * mult[l];
    }
    if (l + 1 < mult.size())
      add("encoder.down." + std::to_string(l) + ".downsample.conv", {ch, ch, 3, 3});
  }
  mid("encoder", ch);
  add("encoder.norm_out", {ch});
  add("encoder.conv_out", {8, ch, 3, 3});
  add("quant_conv", {8, 8, 1, 1});
  add("post_quant_conv", {4, 4, 1, 1});
  add("decoder.conv_in", {ch, 4, 3, 3});
  mid("decoder", ch);
  for (size_t l = mult.size(); l-- > 0;) {
    for (int r = 0; r < 3; ++r) {
      resnet("decoder.up." + std::to_string(l) + ".block." + std::to_string(r), ch, 128 * mult[l]);
      ch = 128 * mult[l];
    }
    if (l > 0) add("decoder.up." + std::to_string(l) + ".upsample.conv", {ch, ch, 3, 3});
  }
  add("decoder.norm_out", {ch});
  add("decoder.conv_out", {3, ch, 3, 3});
  return m;
}

// OpenCLIP ViT-H/14 text tower as SD2 checkpoints store it (24 resblocks + projection).
TensorMap open_clip_tower() {
  TensorMap m;
  const int64_t w = 1024;
  m["token_embedding.weight"] = shaped({49408, w});
  m["positional_embedding"] = shaped({77, w});
  m["ln_final.weight"] = shaped({w});
  m["ln_final.bias"] = shaped({w});
  m["text_projection"] = shaped({w, w});
  m["logit_scale"] = torch::zeros({});
  for (int i = 0; i < 24; ++i) {
    std::string p = "transformer.resblocks." + std::to_string(i) + ".";
    for (const char* ln : {"ln_1", "ln_2"}) {
      m[p + ln + ".weight"] = shaped({w});
      m[p + ln + ".bias"] = shaped({w});
    }
    m[p + "attn.in_proj_weight"] = shaped({3 * w, w});
    m[p + "attn.in_proj_bias"] = shaped({3 * w});
    m[p + "attn.out_proj.weight"] = shaped({w, w});
    m[p + "attn.out_proj.bias"] = shaped({w});
    m[p + "mlp.c_fc.weight"] = shaped({4 * w, w});
    m[p + "mlp.c_fc.bias"] = shaped({4 * w});
    m[p + "mlp.c_proj.weight"] = shaped({w, 4 * w});
    m[p + "mlp.c_proj.bias"] = shaped({w});
  }
  return m;
}

void expect_shape(const TensorMap& m, const std::string& key, std::vector<int64_t> shape) {
  auto it = m.find(key);
  ASSERT_NE(it, m.end()) << key;
  EXPECT_EQ(it->second.sizes().vec(), shape) << key;
}

TEST(LdmRealShapes, Sd21UnetMapsAndInfersTheHubConfig) {
  TensorMap pool = LdmUnetWriter(UnetSpec{}).build();
  size_t n = pool.size();
  auto layout = io::ldm::parse_unet_layout(pool, "sd21");
  std::vector<std::string> assumed;
  json c = io::ldm::infer_unet_config(layout, "sd2", true, &assumed);
  EXPECT_EQ(c["block_out_channels"], json({320, 640, 1280, 1280}));
  EXPECT_EQ(c["attention_head_dim"], json({5, 10, 20, 20}));
  EXPECT_EQ(c["layers_per_block"], 2);
  EXPECT_EQ(c["cross_attention_dim"], 1024);
  EXPECT_EQ(c["use_linear_projection"], true);
  EXPECT_EQ(c["upcast_attention"], true);
  EXPECT_EQ(c["sample_size"], 96);
  EXPECT_EQ(c["down_block_types"], json({"CrossAttnDownBlock2D", "CrossAttnDownBlock2D",
                                         "CrossAttnDownBlock2D", "DownBlock2D"}));
  EXPECT_EQ(c["up_block_types"],
            json({"UpBlock2D", "CrossAttnUpBlock2D", "CrossAttnUpBlock2D", "CrossAttnUpBlock2D"}));

  TensorMap d = io::ldm::map_unet(pool, layout, "sd21");
  EXPECT_TRUE(pool.empty()) << pool.begin()->first;
  EXPECT_EQ(d.size(), n);
  expect_shape(d, "down_blocks.1.resnets.0.conv_shortcut.weight", {640, 320, 1, 1});
  expect_shape(d, "down_blocks.2.downsamplers.0.conv.weight", {1280, 1280, 3, 3});
  expect_shape(d, "mid_block.attentions.0.transformer_blocks.0.attn2.to_k.weight", {1280, 1024});
  expect_shape(d, "up_blocks.0.upsamplers.0.conv.weight", {1280, 1280, 3, 3});
  expect_shape(d, "up_blocks.1.upsamplers.0.conv.weight", {1280, 1280, 3, 3});
  expect_shape(d, "up_blocks.2.upsamplers.0.conv.weight", {640, 640, 3, 3});
  expect_shape(d, "up_blocks.3.resnets.0.conv1.weight", {320, 960, 3, 3});
  expect_shape(d, "up_blocks.3.attentions.2.proj_in.weight", {320, 320});
  EXPECT_EQ(d.count("up_blocks.3.upsamplers.0.conv.weight"), 0u);
}

TEST(LdmRealShapes, Sd15UnetUsesConvProjectionsAndEightHeads) {
  UnetSpec s;
  s.context = 768;
  s.linear = false;
  TensorMap pool = LdmUnetWriter(s).build();
  auto layout = io::ldm::parse_unet_layout(pool, "sd15");
  std::vector<std::string> assumed;
  json c = io::ldm::infer_unet_config(layout, "sd1", false, &assumed);
  EXPECT_EQ(c["attention_head_dim"], 8);
  EXPECT_EQ(c["cross_attention_dim"], 768);
  EXPECT_EQ(c["use_linear_projection"], false);
  EXPECT_EQ(c["upcast_attention"], false);
  TensorMap d = io::ldm::map_unet(pool, layout, "sd15");
  EXPECT_TRUE(pool.empty());
  expect_shape(d, "down_blocks.0.attentions.1.proj_out.weight", {320, 320, 1, 1});
}

TEST(LdmRealShapes, OtherLevelCountsAndResnetCountsAreRead) {
  UnetSpec s;  // 3 levels, 3 resnets each, attention only on the middle level
  s.mc = 192;
  s.mult = {1, 2, 3};
  s.attention = {false, true, false};
  s.res_blocks = 3;
  TensorMap pool = LdmUnetWriter(s).build();
  auto layout = io::ldm::parse_unet_layout(pool, "custom");
  std::vector<std::string> assumed;
  json c = io::ldm::infer_unet_config(layout, "sd2", false, &assumed);
  EXPECT_EQ(c["block_out_channels"], json({192, 384, 576}));
  EXPECT_EQ(c["layers_per_block"], 3);
  EXPECT_EQ(c["down_block_types"], json({"DownBlock2D", "CrossAttnDownBlock2D", "DownBlock2D"}));
  EXPECT_EQ(c["up_block_types"], json({"UpBlock2D", "CrossAttnUpBlock2D", "UpBlock2D"}));
  TensorMap d = io::ldm::map_unet(pool, layout, "custom");
  EXPECT_TRUE(pool.empty());
  expect_shape(d, "up_blocks.1.attentions.3.proj_in.weight", {384, 384});
  expect_shape(d, "up_blocks.1.upsamplers.0.conv.weight", {384, 384, 3, 3});
}

TEST(LdmRealShapes, SdVaeReversesDecoderLevelsAndSqueezesAttention) {
  TensorMap pool = ldm_vae();
  size_t n = pool.size();
  auto layout = io::ldm::parse_vae_layout(pool, "vae");
  std::vector<std::string> assumed;
  json c = io::ldm::infer_vae_config(layout, "sd2", false, &assumed);
  EXPECT_EQ(c["block_out_channels"], json({128, 256, 512, 512}));
  EXPECT_EQ(c["layers_per_block"], 2);
  EXPECT_EQ(c["latent_channels"], 4);
  TensorMap d = io::ldm::map_vae(pool, layout, "vae");
  EXPECT_TRUE(pool.empty());
  EXPECT_EQ(d.size(), n);
  expect_shape(d, "decoder.up_blocks.0.upsamplers.0.conv.weight", {512, 512, 3, 3});
  expect_shape(d, "decoder.up_blocks.2.resnets.0.conv_shortcut.weight", {256, 512, 1, 1});
  expect_shape(d, "decoder.up_blocks.3.resnets.0.conv_shortcut.weight", {128, 256, 1, 1});
  EXPECT_EQ(d.count("decoder.up_blocks.3.upsamplers.0.conv.weight"), 0u);
  expect_shape(d, "encoder.mid_block.attentions.0.to_out.0.weight", {512, 512});
}

TEST(LdmRealShapes, OpenClipTowerBecomesThe23LayerSd2TextEncoder) {
  TensorMap pool = open_clip_tower();
  auto layout = io::ldm::parse_text_layout(pool, true, "te");
  EXPECT_TRUE(layout.has_text_projection);
  int layers = layout.layers_in_file - 1;  // what the loader does for a full tower
  std::vector<std::string> assumed;
  json c = io::ldm::infer_text_config(layout, layers, &assumed);
  EXPECT_EQ(c["num_hidden_layers"], 23);
  EXPECT_EQ(c["num_attention_heads"], 16);
  EXPECT_EQ(c["intermediate_size"], 4096);
  EXPECT_EQ(c["hidden_act"], "gelu");
  TensorMap d = io::ldm::map_text(pool, layout, layers, "te");
  EXPECT_TRUE(pool.empty()) << pool.begin()->first;
  EXPECT_EQ(d.size(), 4u + 23u * 16u);
  expect_shape(d, "text_model.encoder.layers.22.self_attn.v_proj.weight", {1024, 1024});
  EXPECT_EQ(d.count("text_model.encoder.layers.23.mlp.fc1.weight"), 0u);
}

}  // namespace test_ldm_real_shapes
}  // namespace diffuse
