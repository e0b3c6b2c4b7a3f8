// Key-mapping tables and structure parsing for LDM-layout checkpoints (see io/ldm_checkpoint.h).
#include "io/ldm_key_map.h"

#include <cstring>
#include <set>

#include "diffuse/errors.h"
#include "io/string_affixes.h"

namespace diffuse::io::ldm {
namespace {

bool has_prefix(const TensorMap& m, const std::string& prefix) {
  auto it = m.lower_bound(prefix);
  return it != m.end() && starts_with(it->first, prefix);
}

// Reports problems with the full key name, as the user sees it in the file.
class Keys {
 public:
  Keys(const TensorMap& m, std::string file, std::string prefix)
      : m_(m), file_(std::move(file)), prefix_(std::move(prefix)) {}

  [[noreturn]] void fail(const std::string& what) const { throw FormatError(file_ + ": " + what); }
  std::string full(const std::string& key) const { return "'" + prefix_ + key + "'"; }
  bool has(const std::string& key) const { return m_.count(key) != 0; }
  bool has_under(const std::string& prefix) const { return has_prefix(m_, prefix); }

  // The tensor `key`, which must exist and have `rank` dimensions (any rank if < 0).
  const torch::Tensor& need(const std::string& key, int64_t rank = -1) const {
    auto it = m_.find(key);
    if (it == m_.end()) fail("missing tensor " + full(key) + " of the single-file layout");
    if (rank >= 0 && it->second.dim() != rank)
      fail("tensor " + full(key) + " has " + std::to_string(it->second.dim()) +
           " dimensions, expected " + std::to_string(rank));
    return it->second;
  }

  // The integers N of keys "<prefix>N.*", which must be 0..count-1 with no gaps.
  int count_indices(const std::string& prefix) const {
    std::set<int> seen;
    for (auto it = m_.lower_bound(prefix); it != m_.end() && starts_with(it->first, prefix); ++it) {
      std::string rest = it->first.substr(prefix.size());
      size_t dot = rest.find('.');
      std::string num = rest.substr(0, dot);
      if (num.empty() || num.find_first_not_of("0123456789") != std::string::npos || num.size() > 6)
        fail("unexpected tensor " + full(it->first) + ": expected a block number after " +
             full(prefix));
      seen.insert(std::stoi(num));
    }
    int n = static_cast<int>(seen.size());
    if (n > 0 && *seen.rbegin() != n - 1)
      fail("the blocks " + full(prefix + "N") + " are not numbered 0.." + std::to_string(n - 1) +
           " without gaps");
    return n;
  }

 private:
  const TensorMap& m_;
  std::string file_;
  std::string prefix_;
};

// One row of a mapping table: an LDM sub-key prefix and its diffusers replacement.
struct Rename {
  const char* ldm;
  const char* diffusers;
};

const std::vector<Rename> kUnetResnet = {
    {"in_layers.0.", "norm1."},          {"in_layers.2.", "conv1."},
    {"emb_layers.1.", "time_emb_proj."}, {"out_layers.0.", "norm2."},
    {"out_layers.3.", "conv2."},         {"skip_connection.", "conv_shortcut."},
};
// The spatial transformer has the same names in both layouts.
const std::vector<Rename> kUnetTransformer = {
    {"norm.", "norm."},
    {"proj_in.", "proj_in."},
    {"proj_out.", "proj_out."},
    {"transformer_blocks.", "transformer_blocks."},
};
const std::vector<Rename> kVaeResnet = {
    {"norm1.", "norm1."},
    {"conv1.", "conv1."},
    {"norm2.", "norm2."},
    {"conv2.", "conv2."},
    {"nin_shortcut.", "conv_shortcut."},
};
const std::vector<Rename> kVaeAttention = {
    {"norm.", "group_norm."},   {"q.", "to_q."}, {"k.", "to_k."}, {"v.", "to_v."},
    {"proj_out.", "to_out.0."},
};
const std::vector<Rename> kWhole = {{"", ""}};
const std::vector<Rename> kOpenClipLayer = {
    {"ln_1.", "layer_norm1."},
    {"ln_2.", "layer_norm2."},
    {"attn.out_proj.", "self_attn.out_proj."},
    {"mlp.c_fc.", "mlp.fc1."},
    {"mlp.c_proj.", "mlp.fc2."},
};

enum class Reshape { kNone, kSqueeze1x1 };

// Moves every tensor under `from` whose remaining name starts with a table entry to `to` +
// replacement + the rest. Tensors that no entry matches stay in `pool` (and are reported as
// unmapped by the caller).
void move(TensorMap& pool, const std::string& from, const std::string& to,
          const std::vector<Rename>& table, TensorMap& out, const std::string& file,
          Reshape reshape = Reshape::kNone, std::map<std::string, std::string>* sources = nullptr) {
  auto it = pool.lower_bound(from);
  while (it != pool.end() && starts_with(it->first, from)) {
    std::string rest = it->first.substr(from.size());
    const Rename* rule = nullptr;
    for (const auto& r : table) {
      if (starts_with(rest, r.ldm)) {
        rule = &r;
        break;
      }
    }
    if (rule == nullptr) {
      ++it;
      continue;
    }
    std::string name = to + rule->diffusers + rest.substr(std::strlen(rule->ldm));
    torch::Tensor t = it->second;
    if (reshape == Reshape::kSqueeze1x1 && ends_with(name, ".weight") && t.dim() > 2) {
      // LDM's VAE attention uses 1x1 convolutions where diffusers uses Linear layers.
      for (int64_t d = 2; d < t.dim(); ++d)
        if (t.size(d) != 1)
          throw FormatError(file + ": tensor '" + it->first +
                            "' should be a 1x1 convolution, has shape " + c10::str(t.sizes()));
      t = t.reshape({t.size(0), t.size(1)});
    }
    if (!out.emplace(name, t).second)
      throw FormatError(file + ": two tensors map to '" + name + "'");
    if (sources) (*sources)[name] = it->first;
    it = pool.erase(it);
  }
}

void erase_under(TensorMap& pool, const std::string& prefix) {
  auto it = pool.lower_bound(prefix);
  while (it != pool.end() && starts_with(it->first, prefix)) it = pool.erase(it);
}

std::string num(int64_t n) {
  return std::to_string(n);
}

// Counts transformer_blocks under one spatial transformer.
int transformer_depth(const Keys& k, const std::string& attention_prefix) {
  int depth = k.count_indices(attention_prefix + "transformer_blocks.");
  if (depth == 0)
    k.fail("spatial transformer " + k.full(attention_prefix) + " has no transformer_blocks");
  return depth;
}

// Adds one resnet entry (with its optional attention) to a level, checking the level stays
// uniform: diffusers blocks have attention on every resnet or on none.
void add_to_level(const Keys& k, UnetLevel* level, int block, const std::string& entry,
                  bool attention) {
  int depth = attention ? transformer_depth(k, entry + "1.") : 0;
  if (level->blocks.empty()) {
    level->attention = attention;
    level->transformer_depth = depth;
    level->channels = k.need(entry + "0.out_layers.3.weight", 4).size(0);
  } else if (attention != level->attention || depth != level->transformer_depth) {
    k.fail("blocks " + k.full(entry) + " and its neighbours differ in attention (depth " +
           num(depth) + " vs " + num(level->transformer_depth) +
           "); diffusers blocks need the same structure for every layer of a level");
  }
  level->blocks.push_back(block);
}

// The middle block's part of a UNet layout (a UNet's and a ControlNet's alike).
UnetLayout finish_middle(const Keys& k, UnetLayout L) {
  k.need("middle_block.0.in_layers.0.weight");
  k.need("middle_block.2.in_layers.0.weight");
  const auto& mid_proj_in = k.need("middle_block.1.proj_in.weight");
  L.mid_transformer_depth = transformer_depth(k, "middle_block.1.");
  // Linear proj_in (SD2) vs 1x1 conv (SD1); diffusers keeps the stored rank either way.
  L.use_linear_projection = mid_proj_in.dim() == 2;
  L.cross_attention_dim =
      k.need("middle_block.1.transformer_blocks.0.attn2.to_k.weight", 2).size(1);
  return L;
}

}  // namespace

// ---------------------------------------------------------------------------------- UNet

UnetLayout parse_unet_layout(const TensorMap& unet, const std::string& file, bool encoder_only) {
  Keys k(unet, file, encoder_only ? "control_model." : kUnetPrefix);
  UnetLayout L;
  const auto& conv_in = k.need("input_blocks.0.0.weight", 4);
  L.in_channels = conv_in.size(1);
  if (!encoder_only) L.out_channels = k.need("out.2.weight", 4).size(0);
  L.time_embed_dim = k.need("time_embed.0.weight", 2).size(0);

  int num_in = k.count_indices("input_blocks.");
  UnetLevel cur;
  for (int n = 1; n < num_in; ++n) {
    std::string entry = "input_blocks." + num(n) + ".";
    if (k.has(entry + "0.op.weight")) {
      if (cur.blocks.empty())
        k.fail("downsampler " + k.full(entry + "0.op") + " follows no resnet");
      cur.resample_block = n;
      L.down.push_back(cur);
      cur = UnetLevel{};
      continue;
    }
    if (!k.has(entry + "0.in_layers.0.weight"))
      k.fail(k.full(entry) + " is neither a resnet (0.in_layers.*) nor a downsampler (0.op.*)");
    add_to_level(k, &cur, n, entry, k.has_under(entry + "1."));
  }
  if (cur.blocks.empty()) k.fail("the last input_blocks level has no resnets");
  L.down.push_back(cur);
  if (encoder_only) return finish_middle(k, L);

  int num_out = k.count_indices("output_blocks.");
  cur = UnetLevel{};
  for (int n = 0; n < num_out; ++n) {
    std::string entry = "output_blocks." + num(n) + ".";
    if (!k.has(entry + "0.in_layers.0.weight")) k.fail(k.full(entry + "0") + " is not a resnet");
    int slot = k.has(entry + "1.conv.weight") ? 1 : k.has(entry + "2.conv.weight") ? 2 : -1;
    add_to_level(k, &cur, n, entry, slot != 1 && k.has_under(entry + "1."));
    if (slot > 0) {
      cur.resample_block = n;
      cur.resample_slot = slot;
      L.up.push_back(cur);
      cur = UnetLevel{};
    }
  }
  if (!cur.blocks.empty()) L.up.push_back(cur);

  size_t levels = L.down.size();
  if (L.up.size() != levels)
    k.fail("found " + num(levels) + " down levels (input_blocks) but " + num(L.up.size()) +
           " up levels (output_blocks, split at their upsamplers)");
  for (size_t j = 0; j < levels; ++j) {
    const auto& down = L.down[levels - 1 - j];
    const auto& up = L.up[j];
    if (up.blocks.size() != down.blocks.size() + 1 || up.channels != down.channels ||
        (j + 1 < levels) != (up.resample_block >= 0))
      k.fail("output_blocks level " + num(j) + " (" + num(up.blocks.size()) + " resnets, " +
             num(up.channels) + " channels) does not mirror input_blocks level " +
             num(levels - 1 - j) + " (" + num(down.blocks.size()) + " resnets + 1, " +
             num(down.channels) + " channels)");
  }
  return finish_middle(k, L);
}

TensorMap map_unet(TensorMap& pool, const UnetLayout& L, const std::string& file,
                   std::map<std::string, std::string>* sources) {
  TensorMap out;
  auto mv = [&](const std::string& from, const std::string& to, const std::vector<Rename>& t) {
    move(pool, from, to, t, out, file, Reshape::kNone, sources);
  };
  mv("time_embed.0.", "time_embedding.linear_1.", kWhole);
  mv("time_embed.2.", "time_embedding.linear_2.", kWhole);
  // SDXL's added conditioning (pooled text + size/crop embeddings).
  mv("label_emb.0.0.", "add_embedding.linear_1.", kWhole);
  mv("label_emb.0.2.", "add_embedding.linear_2.", kWhole);
  mv("input_blocks.0.0.", "conv_in.", kWhole);
  mv("out.0.", "conv_norm_out.", kWhole);
  mv("out.2.", "conv_out.", kWhole);

  for (size_t l = 0; l < L.down.size(); ++l) {
    const auto& level = L.down[l];
    std::string block = "down_blocks." + num(l) + ".";
    for (size_t r = 0; r < level.blocks.size(); ++r) {
      std::string entry = "input_blocks." + num(level.blocks[r]) + ".";
      mv(entry + "0.", block + "resnets." + num(r) + ".", kUnetResnet);
      if (level.attention) mv(entry + "1.", block + "attentions." + num(r) + ".", kUnetTransformer);
    }
    if (level.resample_block >= 0)
      mv("input_blocks." + num(level.resample_block) + ".0.op.", block + "downsamplers.0.conv.",
         kWhole);
  }

  mv("middle_block.0.", "mid_block.resnets.0.", kUnetResnet);
  mv("middle_block.1.", "mid_block.attentions.0.", kUnetTransformer);
  mv("middle_block.2.", "mid_block.resnets.1.", kUnetResnet);

  for (size_t j = 0; j < L.up.size(); ++j) {
    const auto& level = L.up[j];
    std::string block = "up_blocks." + num(j) + ".";
    for (size_t r = 0; r < level.blocks.size(); ++r) {
      std::string entry = "output_blocks." + num(level.blocks[r]) + ".";
      mv(entry + "0.", block + "resnets." + num(r) + ".", kUnetResnet);
      if (level.attention) mv(entry + "1.", block + "attentions." + num(r) + ".", kUnetTransformer);
    }
    if (level.resample_block >= 0)
      mv("output_blocks." + num(level.resample_block) + "." + num(level.resample_slot) + ".conv.",
         block + "upsamplers.0.conv.", kWhole);
  }
  return out;
}

// ---------------------------------------------------------------------------- ControlNet

ControlNetLayout parse_controlnet_layout(const TensorMap& pool, const std::string& file) {
  Keys k(pool, file, "control_model.");
  ControlNetLayout L;
  L.unet = parse_unet_layout(pool, file, /*encoder_only=*/true);
  // input_hint_block: conv, SiLU, conv, SiLU, ..., conv (the last one zero-initialised).
  // Only the convolutions have weights: the indices run 0, 2, ..., 2m (the SiLUs between hold
  // nothing), so the entries are counted from the largest index.
  int n = 0;
  const std::string hint = "input_hint_block.";
  for (auto it = pool.lower_bound(hint); it != pool.end() && starts_with(it->first, hint); ++it) {
    const std::string index =
        it->first.substr(hint.size(), it->first.find('.', hint.size()) - hint.size());
    if (index.empty() || index.size() > 3 ||
        index.find_first_not_of("0123456789") != std::string::npos)
      k.fail("unexpected tensor " + k.full(it->first) + ": expected a number after " +
             k.full(hint));
    n = std::max(n, std::stoi(index) + 1);
  }
  if (n < 3 || n % 2 == 0)
    k.fail("input_hint_block has " + num(n) +
           " entries, expected convolutions at the even indices 0..2m (m >= 1) with SiLUs between");
  for (int i = 0; i < n; i += 2) k.need("input_hint_block." + num(i) + ".weight", 4);
  const auto& first = k.need("input_hint_block.0.weight", 4);
  L.conditioning_channels = first.size(1);
  L.hint_channels.push_back(first.size(0));
  // blocks: (c_i -> c_i, c_i -> c_{i+1} stride 2) per level; the stride-2 ones give c_{i+1}.
  const int blocks = (n - 3) / 2;
  if (blocks % 2 != 0)
    k.fail("input_hint_block has " + num(blocks) +
           " inner convolutions, expected pairs (one per level of the conditioning embedding)");
  for (int b = 1; b < blocks; b += 2)
    L.hint_channels.push_back(k.need("input_hint_block." + num(2 + 2 * b) + ".weight", 4).size(0));
  L.hint_last = n - 1;
  size_t skips = 1;
  for (const auto& level : L.unet.down) skips += level.blocks.size() + (level.resample_block >= 0);
  if (k.count_indices("zero_convs.") != static_cast<int>(skips))
    k.fail("zero_convs has " + num(k.count_indices("zero_convs.")) + " entries, the input blocks " +
           num(skips) + " skip connections");
  k.need("middle_block_out.0.weight", 4);
  return L;
}

TensorMap map_controlnet(TensorMap& pool, const ControlNetLayout& L, const std::string& file) {
  TensorMap out = map_unet(pool, L.unet, file);
  auto mv = [&](const std::string& from, const std::string& to) {
    move(pool, from, to, kWhole, out, file);
  };
  mv("input_hint_block.0.", "controlnet_cond_embedding.conv_in.");
  for (int i = 2; i < L.hint_last; i += 2)
    mv("input_hint_block." + num(i) + ".",
       "controlnet_cond_embedding.blocks." + num(i / 2 - 1) + ".");
  mv("input_hint_block." + num(L.hint_last) + ".", "controlnet_cond_embedding.conv_out.");
  for (int i = 0; has_prefix(pool, "zero_convs." + num(i) + ".0."); ++i)
    mv("zero_convs." + num(i) + ".0.", "controlnet_down_blocks." + num(i) + ".");
  mv("middle_block_out.0.", "controlnet_mid_block.");
  return out;
}

// ----------------------------------------------------------------------------------- VAE

VaeLayout parse_vae_layout(const TensorMap& vae, const std::string& file) {
  Keys k(vae, file, kVaePrefix);
  VaeLayout L;
  L.in_channels = k.need("encoder.conv_in.weight", 4).size(1);
  L.out_channels = k.need("decoder.conv_out.weight", 4).size(0);
  const auto& quant = k.need("quant_conv.weight", 4);
  L.latent_channels = quant.size(0) / 2;
  if (quant.size(0) != 2 * L.latent_channels ||
      k.need("decoder.conv_in.weight", 4).size(1) != L.latent_channels)
    k.fail("quant_conv (" + num(quant.size(0)) + " outputs) and decoder.conv_in (" +
           num(k.need("decoder.conv_in.weight").size(1)) +
           " inputs) disagree: expected 2 x latent channels and latent channels");

  int levels = k.count_indices("encoder.down.");
  if (levels == 0) k.fail("no encoder levels " + k.full("encoder.down.N"));
  if (k.count_indices("decoder.up.") != levels)
    k.fail("encoder has " + num(levels) + " levels but decoder has " +
           num(k.count_indices("decoder.up.")));
  for (int l = 0; l < levels; ++l) {
    std::string down = "encoder.down." + num(l) + ".";
    int blocks = k.count_indices(down + "block.");
    if (l == 0) L.layers_per_block = blocks;
    if (blocks == 0 || blocks != L.layers_per_block)
      k.fail(k.full(down) + " has " + num(blocks) + " resnets, level 0 has " +
             num(L.layers_per_block) + " (diffusers needs the same number on every level)");
    L.block_out_channels.push_back(k.need(down + "block.0.conv1.weight", 4).size(0));
    if (k.has(down + "downsample.conv.weight") != (l + 1 < levels))
      k.fail("expected a downsampler on every encoder level but the last; " + k.full(down) +
             " differs");
  }
  for (int l = 0; l < levels; ++l) {
    std::string up = "decoder.up." + num(l) + ".";
    int blocks = k.count_indices(up + "block.");
    if (blocks != L.layers_per_block + 1)
      k.fail(k.full(up) + " has " + num(blocks) + " resnets, expected " +
             num(L.layers_per_block + 1) + " (encoder resnets per level + 1)");
    if (k.need(up + "block.0.conv1.weight", 4).size(0) != L.block_out_channels[l])
      k.fail(k.full(up) + " has " + num(k.need(up + "block.0.conv1.weight").size(0)) +
             " channels, the encoder level has " + num(L.block_out_channels[l]));
    if (k.has(up + "upsample.conv.weight") != (l > 0))
      k.fail("expected an upsampler on every decoder level but up.0; " + k.full(up) + " differs");
  }
  return L;
}

TensorMap map_vae(TensorMap& pool, const VaeLayout& L, const std::string& file) {
  TensorMap out;
  auto mv = [&](const std::string& from, const std::string& to, const std::vector<Rename>& t,
                Reshape reshape = Reshape::kNone) { move(pool, from, to, t, out, file, reshape); };
  int levels = static_cast<int>(L.block_out_channels.size());
  for (const std::string part : {"encoder.", "decoder."}) {
    mv(part + "conv_in.", part + "conv_in.", kWhole);
    mv(part + "conv_out.", part + "conv_out.", kWhole);
    mv(part + "norm_out.", part + "conv_norm_out.", kWhole);
    mv(part + "mid.block_1.", part + "mid_block.resnets.0.", kVaeResnet);
    mv(part + "mid.block_2.", part + "mid_block.resnets.1.", kVaeResnet);
    mv(part + "mid.attn_1.", part + "mid_block.attentions.0.", kVaeAttention, Reshape::kSqueeze1x1);
  }
  for (int l = 0; l < levels; ++l) {
    std::string down = "encoder.down." + num(l) + ".";
    std::string block = "encoder.down_blocks." + num(l) + ".";
    for (int r = 0; r < L.layers_per_block; ++r)
      mv(down + "block." + num(r) + ".", block + "resnets." + num(r) + ".", kVaeResnet);
    mv(down + "downsample.conv.", block + "downsamplers.0.conv.", kWhole);

    // LDM numbers decoder levels from the full-resolution end, diffusers in execution order.
    std::string up = "decoder.up." + num(l) + ".";
    block = "decoder.up_blocks." + num(levels - 1 - l) + ".";
    for (int r = 0; r <= L.layers_per_block; ++r)
      mv(up + "block." + num(r) + ".", block + "resnets." + num(r) + ".", kVaeResnet);
    mv(up + "upsample.conv.", block + "upsamplers.0.conv.", kWhole);
  }
  mv("quant_conv.", "quant_conv.", kWhole);
  mv("post_quant_conv.", "post_quant_conv.", kWhole);
  return out;
}

// ---------------------------------------------------------------------------- Text encoder

namespace {
// Old SD1 files were saved with transformers versions whose CLIPTextModel had no
// "text_model." level; such keys are rooted at the model itself.
std::string clip_root(const TensorMap& pool) {
  return has_prefix(pool, "text_model.") ? "text_model." : "";
}
}  // namespace

TextLayout parse_text_layout(const TensorMap& pool, bool open_clip, const std::string& file,
                             const std::string& prefix) {
  TextLayout L;
  L.open_clip = open_clip;
  if (open_clip) {
    Keys k(pool, file, prefix.empty() ? kOpenClipPrefix : prefix);
    const auto& tok = k.need("token_embedding.weight", 2);
    L.vocab_size = tok.size(0);
    L.hidden_size = tok.size(1);
    L.max_positions = k.need("positional_embedding", 2).size(0);
    L.layers_in_file = k.count_indices("transformer.resblocks.");
    if (L.layers_in_file == 0)
      k.fail("no text encoder layers " + k.full("transformer.resblocks.N"));
    L.intermediate_size = k.need("transformer.resblocks.0.mlp.c_fc.weight", 2).size(0);
    for (int i = 0; i < L.layers_in_file; ++i) {
      std::string p = "transformer.resblocks." + num(i) + ".attn.in_proj_";
      if (k.need(p + "weight", 2).size(0) != 3 * L.hidden_size ||
          k.need(p + "bias", 1).size(0) != 3 * L.hidden_size)
        k.fail(k.full(p + "weight/bias") + " should stack q, k, v: expected " +
               num(3 * L.hidden_size) + " rows");
    }
    L.has_text_projection = k.has("text_projection");
  } else {
    Keys k(pool, file, prefix.empty() ? kClipPrefix : prefix);
    std::string root = clip_root(pool);
    const auto& tok = k.need(root + "embeddings.token_embedding.weight", 2);
    L.vocab_size = tok.size(0);
    L.hidden_size = tok.size(1);
    L.max_positions = k.need(root + "embeddings.position_embedding.weight", 2).size(0);
    L.layers_in_file = k.count_indices(root + "encoder.layers.");
    if (L.layers_in_file == 0)
      k.fail("no text encoder layers " + k.full(root + "encoder.layers.N"));
    L.intermediate_size = k.need(root + "encoder.layers.0.mlp.fc1.weight", 2).size(0);
  }
  return L;
}

TensorMap map_text(TensorMap& pool, const TextLayout& L, int num_layers, const std::string& file,
                   bool with_projection) {
  TensorMap out;
  auto mv = [&](const std::string& from, const std::string& to, const std::vector<Rename>& t) {
    move(pool, from, to, t, out, file);
  };
  if (!L.open_clip) {
    std::string root = clip_root(pool);
    pool.erase(root + "embeddings.position_ids");  // a buffer, not a parameter
    mv(root + "embeddings.token_embedding.", "text_model.embeddings.token_embedding.", kWhole);
    mv(root + "embeddings.position_embedding.", "text_model.embeddings.position_embedding.",
       kWhole);
    mv(root + "final_layer_norm.", "text_model.final_layer_norm.", kWhole);
    for (int i = 0; i < L.layers_in_file; ++i) {
      std::string from = root + "encoder.layers." + num(i) + ".";
      if (i < num_layers)
        mv(from, "text_model.encoder.layers." + num(i) + ".", kWhole);
      else
        erase_under(pool, from);
    }
    return out;
  }

  // The projection into CLIP's joint image-text space is SDXL's pooled embedding, unused by
  // SD2; the contrastive temperature is never used; attn_mask is the causal mask, rebuilt by
  // the model.
  if (with_projection) {
    auto it = pool.find("text_projection");
    if (it == pool.end() || it->second.dim() != 2)
      throw FormatError(file +
                        ": the OpenCLIP text encoder has no 2-D text_projection, which "
                        "SDXL's pooled text embedding needs");
    out["text_projection.weight"] = it->second.t().contiguous();
  }
  for (const char* unused : {"text_projection", "logit_scale", "attn_mask"}) pool.erase(unused);
  const Keys k(pool, file, kOpenClipPrefix);
  auto take = [&](const std::string& from, const std::string& to) {
    out[to] = k.need(from);
    pool.erase(from);
  };
  take("token_embedding.weight", "text_model.embeddings.token_embedding.weight");
  take("positional_embedding", "text_model.embeddings.position_embedding.weight");
  mv("ln_final.", "text_model.final_layer_norm.", kWhole);
  for (int i = 0; i < L.layers_in_file; ++i) {
    std::string from = "transformer.resblocks." + num(i) + ".";
    if (i >= num_layers) {
      erase_under(pool, from);  // the layer SD2 never runs (it conditions on the penultimate)
      continue;
    }
    std::string to = "text_model.encoder.layers." + num(i) + ".";
    mv(from, to, kOpenClipLayer);
    // nn.MultiheadAttention stacks the q, k, v projections along the output dimension.
    for (const std::string kind : {"weight", "bias"}) {
      std::string key = from + "attn.in_proj_" + kind;
      torch::Tensor stacked = k.need(key);
      const char* names[] = {"q_proj", "k_proj", "v_proj"};
      for (int64_t part = 0; part < 3; ++part)
        out[to + "self_attn." + names[part] + "." + kind] =
            stacked.narrow(0, part * L.hidden_size, L.hidden_size);
      pool.erase(key);
    }
  }
  return out;
}

}  // namespace diffuse::io::ldm
