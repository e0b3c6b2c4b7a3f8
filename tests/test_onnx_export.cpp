// `diffuse export onnx` against ONNX Runtime: every exported component of the Stable Diffusion
// golden sets, run by ONNX Runtime's CPU provider (tests/onnx/run_onnx.mjs, npm
// onnxruntime-node), gives the engine's own output on the same inputs; and the exporter's
// refusals. Needs node and tests/onnx/node_modules (scripts/setup.sh installs both).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "diffuse/errors.h"
#include "export/onnx_export.h"
#include "io/model_folder.h"
#include "io/safetensors.h"
#include "models/autoencoder_kl.h"
#include "models/clip_text_model.h"
#include "models/controlnet.h"
#include "models/flux_transformer.h"
#include "models/hidream_transformer.h"
#include "models/llama.h"
#include "models/t5_encoder.h"
#include "models/unet2d_condition.h"
#include "pipeline/real_size_model.h"
#include "test_util.h"

namespace diffuse::test {
namespace test_onnx_export {

namespace fs = std::filesystem;
using onnx_export::ExportRequest;
using onnx_export::ExportResult;
using Tensors = std::map<std::string, torch::Tensor>;

// Runs `model` with ONNX Runtime on `inputs`; every graph output by name.
Tensors run_onnx_runtime(const std::string& model, const Tensors& inputs, const TempDir& dir) {
  const auto in = dir.file("inputs.safetensors"), out = dir.file("outputs.safetensors");
  std::vector<std::pair<std::string, torch::Tensor>> list(inputs.begin(), inputs.end());
  io::save_safetensors(in, list);
  const std::string script = std::string(DIFFUSE_SOURCE_DIR) + "/tests/onnx/run_onnx.mjs";
  const std::string log = dir.file("node.log");
  const std::string cmd =
      "node '" + script + "' '" + model + "' '" + in + "' '" + out + "' > '" + log + "' 2>&1";
  const int rc = std::system(cmd.c_str());
  if (rc != 0) {
    ADD_FAILURE() << "ONNX Runtime failed on " << model << " (exit " << rc
                  << "; scripts/setup.sh installs node and tests/onnx/node_modules):\n"
                  << read_file(log);
    return {};
  }
  auto outputs = io::SafetensorsFile::open(out)->load_all();
  for (auto& [name, t] : outputs) t = t.clone();
  return outputs;
}

// Random inputs of the exported shapes (dims of -1 take `symbolic`'s value in order).
Tensors make_inputs(const ExportResult& r, int64_t vocab, std::vector<int64_t> symbolic = {}) {
  torch::manual_seed(1234);
  Tensors inputs;
  size_t next = 0;
  for (const auto& in : r.inputs) {
    std::vector<int64_t> dims;
    for (auto d : in.dims) dims.push_back(d >= 0 ? d : symbolic.at(next++));
    if (in.name == "input_ids") {
      inputs[in.name] = torch::randint(0, vocab, dims, torch::kInt64);
    } else if (in.name == "attention_mask") {  // T5: the last tokens of the second row padding
      auto mask = torch::ones(dims, torch::kInt64);
      if (dims[0] > 1 && dims[1] > 2) mask[1].narrow(0, dims[1] - 3, 3).zero_();
      inputs[in.name] = mask;
    } else if (in.name == "timesteps") {  // HiDream: t * 1000
      inputs[in.name] = torch::rand(dims) * 999;
    } else if (in.name == "timestep") {
      // A UNet's timestep runs to 999; FLUX's is t / 1000.
      const bool dit = std::any_of(r.inputs.begin(), r.inputs.end(),
                                   [](const auto& i) { return i.name == "img_ids"; });
      inputs[in.name] = torch::rand(dims) * (dit ? 1.0 : 999.0);
    } else if (in.name == "img_ids" || in.name == "txt_ids") {
      inputs[in.name] = torch::randint(0, 32, dims).to(torch::kFloat32);
    } else if (in.name == "guidance") {
      inputs[in.name] = torch::rand(dims) * 5;
    } else if (in.name == "time_ids") {
      inputs[in.name] = torch::randint(0, 1024, dims).to(in.dtype);
    } else {
      inputs[in.name] = torch::randn(dims).to(in.dtype);
    }
  }
  return inputs;
}

// The engine's own outputs for the component on those inputs.
Tensors engine_outputs(const io::ModelFolder& folder, const std::string& component,
                       const Tensors& in) {
  torch::NoGradGuard no_grad;
  if (component == "unet") {
    auto unet = models::load_unet(folder, torch::kCPU, torch::kFloat32);
    models::UNetAddedConditions added;
    if (in.count("text_embeds")) added = {in.at("text_embeds"), in.at("time_ids")};
    return {{"out_sample",
             unet->forward(in.at("sample"), in.at("timestep"), in.at("encoder_hidden_states"),
                           nullptr, in.count("text_embeds") ? &added : nullptr)}};
  }
  if (component == "vae_decoder" || component == "vae_encoder") {
    auto vae = models::load_vae(folder, torch::kCPU, torch::kFloat32);
    if (component == "vae_decoder") return {{"sample", vae->decode(in.at("latent_sample"))}};
    return {{"latent_parameters", vae->encode_moments(in.at("sample"))}};
  }
  if (in.count("encoder_hidden_states_llama3")) {
    auto t = models::load_hidream_transformer(folder, torch::kCPU, torch::kFloat32, component);
    return {
        {"out_hidden_states",
         t->forward(in.at("hidden_states"), in.at("timesteps"), in.at("encoder_hidden_states_t5"),
                    in.at("encoder_hidden_states_llama3"), in.at("pooled_embeds"))}};
  }
  if (component.rfind("transformer", 0) == 0) {
    auto t = models::load_flux_transformer(folder, torch::kCPU, torch::kFloat32, component);
    return {{"out_hidden_states",
             t->forward(in.at("hidden_states"), in.at("timestep"), in.at("encoder_hidden_states"),
                        in.at("pooled_projections"), in.at("img_ids"), in.at("txt_ids"),
                        in.count("guidance") ? in.at("guidance") : torch::Tensor())}};
  }
  if (folder.component_class(component) == "LlamaForCausalLM") {
    auto llama = models::load_llama(folder, component, torch::kCPU, torch::kFloat32);
    const auto o = llama->forward(in.at("input_ids"), in.at("attention_mask"));
    Tensors out;
    for (size_t i = 0; i < o.hidden_states.size(); ++i)
      out["hidden_states." + std::to_string(i)] = o.hidden_states[i];
    return out;
  }
  if (folder.component_class(component) == "T5EncoderModel") {
    auto t5 = models::load_t5_encoder(folder, component, torch::kCPU, torch::kFloat32);
    return {{"last_hidden_state",
             t5->forward(in.at("input_ids"), in.at("attention_mask")).last_hidden_state}};
  }
  auto te = models::load_clip_text_model(folder, torch::kCPU, torch::kFloat32, component);
  const auto o = te->forward(in.at("input_ids"), true);
  Tensors out = {{"last_hidden_state", o.last_hidden_state}, {"pooler_output", o.pooler_output}};
  if (o.text_embeds.defined()) out["text_embeds"] = o.text_embeds;
  for (size_t i = 0; i < o.hidden_states.size(); ++i)
    out["hidden_states." + std::to_string(i)] = o.hidden_states[i];
  return out;
}

// ONNX Runtime's float32 result against the engine's: both round differently through the same
// arithmetic (other summation orders in convolutions and matrix products, InstanceNormalization
// for GroupNorm, Erf for GELU), so the difference is bounded relative to the values' scale.
void expect_close(const Tensors& ort, const Tensors& engine, const std::string& what) {
  ASSERT_EQ(ort.size(), engine.size()) << what << ": number of outputs";
  for (const auto& [name, ref] : engine) {
    ASSERT_TRUE(ort.count(name)) << what << ": ONNX Runtime gave no " << name;
    const auto& got = ort.at(name);
    ASSERT_EQ(got.sizes(), ref.sizes()) << what << ": " << name;
    const auto r = ref.to(torch::kFloat64), g = got.to(torch::kFloat64);
    const double err = (r - g).abs().max().item<double>();
    const double scale = r.abs().max().item<double>();
    EXPECT_LE(err, 1e-4 * (1.0 + scale))
        << what << ": " << name << " max |diff| " << err << " at scale " << scale;
    std::printf("  %s %s: max |diff| %.3g (max |x| %.3g)\n", what.c_str(), name.c_str(), err,
                scale);
  }
}

int64_t vocab_of(const io::ModelFolder& folder, const std::string& component) {
  if (component.rfind("text_encoder", 0) != 0) return 0;
  if (folder.component_class(component) == "T5EncoderModel")
    return models::T5Config::from_json(folder.component_config(component)).vocab_size;
  if (folder.component_class(component) == "LlamaForCausalLM")
    return models::LlamaConfig::from_json(folder.component_config(component)).vocab_size;
  return models::clip_text_config(folder, component).vocab_size;
}

ExportResult export_to(const std::string& model, const std::string& component,
                       const std::string& out, ExportRequest r = {}) {
  r.model_dir = model;
  r.component = component;
  r.output = out;
  return onnx_export::export_onnx(r);
}

// Small static shapes that are not the models' defaults: batch 2, non-square, 12 tokens.
ExportRequest small_shapes(const io::ModelFolder& folder) {
  const int64_t factor =
      models::AutoencoderKLConfig::from_json(folder.component_config("vae")).spatial_factor();
  ExportRequest r;
  r.batch = 2;
  r.height = factor * 8;
  r.width = factor * 12;
  r.tokens = 12;
  return r;
}

void check_set(const std::string& set_dir) {
  const auto model = verify::GoldenSet::load(set_dir).model_dir();
  const auto folder = io::ModelFolder::open(model);
  const auto components = onnx_export::exportable_components(model);
  ASSERT_FALSE(components.empty()) << model;
  for (const auto& c : components) {
    SCOPED_TRACE(model + " " + c);
    TempDir dir;
    const auto onnx = dir.file(c + ".onnx");
    const auto r = export_to(model, c, onnx, small_shapes(folder));
    ASSERT_TRUE(fs::exists(onnx));
    EXPECT_TRUE(r.data_path.empty()) << "a tiny model's weights fit inside the file";
    const auto in = make_inputs(r, vocab_of(folder, c));
    expect_close(run_onnx_runtime(onnx, in, dir), engine_outputs(folder, c, in),
                 fs::path(set_dir).filename().string() + " " + c);
  }
}

TEST(OnnxExport, Sd21EveryComponentMatchesTheEngine) {
  check_set(golden_dir());
}

TEST(OnnxExport, SdxlEveryComponentMatchesTheEngine) {
  check_set(sdxl_golden_dir());
}

// FLUX.1 dev and schnell transformers (double and single blocks, RoPE from the ids), CLIP-L and
// the 16-channel VAE; Kontext's transformer over a sequence that holds the source tokens too.
TEST(OnnxExport, FluxEveryComponentMatchesTheEngine) {
  check_set(flux_golden_dir());
  // T5 with a symbolic batch and length (the position buckets are computed in the graph), at
  // a length past the exact buckets, the second row padded.
  const auto model = verify::GoldenSet::load(flux_golden_dir()).model_dir();
  const auto folder = io::ModelFolder::open(model);
  TempDir dir;
  ExportRequest dynamic;
  dynamic.dynamic = true;
  const auto r = export_to(model, "text_encoder_2", dir.file("t5.onnx"), dynamic);
  const auto in = make_inputs(r, vocab_of(folder, "text_encoder_2"), {3, 41, 3, 41});
  expect_close(run_onnx_runtime(dir.file("t5.onnx"), in, dir),
               engine_outputs(folder, "text_encoder_2", in), "flux-tiny T5 (dynamic, 41 tokens)");
}

// HiDream-I1: CLIP-L/G, the 16-channel VAE, and the transformer (MoE routing, Llama layers per
// block) on a non-square latent (padded to max_seq with the key mask) and on a square one.
TEST(OnnxExport, HiDreamEveryComponentMatchesTheEngine) {
  check_set(hidream_golden_dir());
  const auto model = verify::GoldenSet::load(hidream_golden_dir()).model_dir();
  const auto folder = io::ModelFolder::open(model);
  TempDir dir;
  ExportRequest square = small_shapes(folder);
  square.width = square.height;
  const auto r = export_to(model, "transformer", dir.file("t.onnx"), square);
  EXPECT_GT(r.op_counts.at("TopK"), 0);
  const auto in = make_inputs(r, 0);
  expect_close(run_onnx_runtime(dir.file("t.onnx"), in, dir),
               engine_outputs(folder, "transformer", in), "hidream-tiny square transformer");
}

TEST(OnnxExport, KontextTransformerTakesTheSourceTokensDynamically) {
  const auto model = verify::GoldenSet::load(flux_kontext_golden_dir()).model_dir();
  const auto folder = io::ModelFolder::open(model);
  TempDir dir;
  ExportRequest req;
  req.dynamic = true;
  const auto r = export_to(model, "transformer", dir.file("t.onnx"), req);
  // batch 2; 12 output + 20 source tokens; 7 text tokens (in input order).
  const auto in = make_inputs(r, 0, {2, 32, 2, 7, 2, 2, 32, 7, 2});
  expect_close(run_onnx_runtime(dir.file("t.onnx"), in, dir),
               engine_outputs(folder, "transformer", in), "kontext transformer");
}

TEST(OnnxExport, InpaintingAndControlNetFoldersExportTheirSdComponents) {
  const std::vector<std::pair<std::string, std::string>> sets = {
      {"DIFFUSE_SD2_INPAINT_GOLDEN_DIR", "sd2-inpaint-tiny"},
      {"DIFFUSE_SD2_CONTROLNET_GOLDEN_DIR", "sd2-controlnet-tiny"}};
  for (const auto& [env, name] : sets) {
    const auto dir = sibling_golden_dir(env.c_str(), name);
    ASSERT_TRUE(fs::exists(dir)) << dir;
    // The inpainting UNet takes 9 channels (latents | mask | masked-image latents).
    const auto model = verify::GoldenSet::load(dir).model_dir();
    const auto folder = io::ModelFolder::open(model);
    TempDir tmp;
    const auto onnx = tmp.file("unet.onnx");
    const auto r = export_to(model, "unet", onnx, small_shapes(folder));
    const auto in = make_inputs(r, 0);
    expect_close(run_onnx_runtime(onnx, in, tmp), engine_outputs(folder, "unet", in), name);
  }
}

// The ControlNet of sd2-controlnet-tiny (conditioning embedding, encoder half, zero
// convolutions) with a plain and with guess mode's per-residual scales, and the UNet taking
// residuals as inputs: each against the engine's own forward on the same inputs.
TEST(OnnxExport, ControlNetAndTheUnetTakingItsResidualsMatchTheEngine) {
  const auto dir = sibling_golden_dir("DIFFUSE_SD2_CONTROLNET_GOLDEN_DIR", "sd2-controlnet-tiny");
  ASSERT_TRUE(fs::exists(dir)) << dir;
  const auto model = verify::GoldenSet::load(dir).model_dir();
  const auto folder = io::ModelFolder::open(model);
  const auto components = onnx_export::exportable_components(model);
  ASSERT_NE(std::find(components.begin(), components.end(), "controlnet"), components.end());
  torch::NoGradGuard no_grad;
  const auto unet_config =
      models::UNet2DConditionConfig::from_json(folder.component_config("unet"));
  auto net = models::load_controlnet(folder.component_dir("controlnet"), torch::kCPU,
                                     torch::kFloat32, &unet_config);
  TempDir tmp;
  const auto onnx = tmp.file("controlnet.onnx");
  const auto r = export_to(model, "controlnet", onnx, small_shapes(folder));
  const int64_t n = static_cast<int64_t>(net->num_down_residuals());
  ASSERT_EQ(r.outputs.size(), static_cast<size_t>(n + 1));
  auto in = make_inputs(r, 0);
  in["controlnet_cond"] = torch::rand(in.at("controlnet_cond").sizes());
  for (const bool guess : {false, true}) {
    const double scale = guess ? 0.9 : 0.7;
    in["conditioning_scale"] =
        guess ? models::guess_mode_scales(n, scale) : torch::full({n + 1}, scale, torch::kFloat32);
    const auto res =
        net->forward(in.at("sample"), in.at("timestep"), in.at("encoder_hidden_states"),
                     in.at("controlnet_cond"), scale, guess);
    Tensors engine{{"mid_block_res_sample", res.mid}};
    for (int64_t i = 0; i < n; ++i)
      engine["down_block_res_samples." + std::to_string(i)] = res.down[static_cast<size_t>(i)];
    expect_close(run_onnx_runtime(onnx, in, tmp), engine,
                 guess ? "controlnet (guess mode)" : "controlnet");
  }

  // The UNet with the residuals as inputs; the ControlNet's shapes are the UNet's inputs.
  ExportRequest with_residuals = small_shapes(folder);
  with_residuals.control_residuals = true;
  const auto unet_onnx = tmp.file("unet.onnx");
  const auto u = export_to(model, "unet", unet_onnx, with_residuals);
  ASSERT_EQ(u.inputs.size(), 3 + static_cast<size_t>(n + 1));
  auto unet_in = make_inputs(u, 0);
  models::UNetControlResiduals control;
  for (int64_t i = 0; i < n; ++i) {
    const auto name = "down_block_additional_residuals." + std::to_string(i);
    EXPECT_EQ(unet_in.at(name).sizes(), r.outputs[static_cast<size_t>(i)].dims) << name;
    control.down.push_back(unet_in.at(name));
  }
  control.mid = unet_in.at("mid_block_additional_residual");
  auto unet = models::load_unet(folder, torch::kCPU, torch::kFloat32);
  expect_close(run_onnx_runtime(unet_onnx, unet_in, tmp),
               {{"out_sample",
                 unet->forward(unet_in.at("sample"), unet_in.at("timestep"),
                               unet_in.at("encoder_hidden_states"), nullptr, nullptr, &control)}},
               "unet with control residuals");
  // Only the UNet takes residuals.
  ExportRequest wrong = small_shapes(folder);
  wrong.control_residuals = true;
  const auto msg = expect_throw<InvalidArgument>(
      [&] { export_to(model, "vae_decoder", tmp.file("vae.onnx"), wrong); });
  EXPECT_NE(msg.find("--control-residuals"), std::string::npos) << msg;
  EXPECT_FALSE(fs::exists(tmp.file("vae.onnx")));
}

TEST(OnnxExport, DynamicShapesRunAtOtherSizes) {
  const auto model = golden_model_dir();
  const auto folder = io::ModelFolder::open(model);
  for (const std::string c : {"unet", "vae_decoder", "text_encoder"}) {
    TempDir dir;
    ExportRequest req;
    req.dynamic = true;
    const auto r = export_to(model, c, dir.file("m.onnx"), req);
    // In input order: batch 3; a latent 5 x 7 (not a multiple of the UNet's factor: its up path
    // meets the skip connections' sizes); 9 tokens.
    std::vector<int64_t> symbols = c == "unet"          ? std::vector<int64_t>{3, 5, 7, 3, 3, 9}
                                   : c == "vae_decoder" ? std::vector<int64_t>{3, 5, 7}
                                                        : std::vector<int64_t>{3, 9};
    const auto in = make_inputs(r, vocab_of(folder, c), symbols);
    expect_close(run_onnx_runtime(dir.file("m.onnx"), in, dir), engine_outputs(folder, c, in),
                 "dynamic " + c);
  }
}

TEST(OnnxExport, Opset16WritesLayerNormOutAndFp16Runs) {
  const auto model = golden_model_dir();
  const auto folder = io::ModelFolder::open(model);
  TempDir dir;
  ExportRequest req = small_shapes(folder);
  req.opset = 16;
  const auto r = export_to(model, "text_encoder", dir.file("te16.onnx"), req);
  EXPECT_EQ(r.op_counts.count("LayerNormalization"), 0u);
  EXPECT_GT(r.op_counts.at("ReduceMean"), 0);
  const auto in = make_inputs(r, vocab_of(folder, "text_encoder"));
  expect_close(run_onnx_runtime(dir.file("te16.onnx"), in, dir),
               engine_outputs(folder, "text_encoder", in), "opset 16 text_encoder");

  // float16: the file holds half the bytes and ONNX Runtime runs it; its result is the float32
  // one within half precision.
  ExportRequest half = small_shapes(folder);
  half.precision = "fp16";
  const auto r16 = export_to(model, "vae_decoder", dir.file("dec16.onnx"), half);
  const auto r32 = export_to(model, "vae_decoder", dir.file("dec32.onnx"), small_shapes(folder));
  EXPECT_NEAR(static_cast<double>(r16.weight_bytes) / r32.weight_bytes, 0.5, 0.01);
  auto in16 = make_inputs(r16, 0);
  Tensors in32 = {{"latent_sample", in16.at("latent_sample").to(torch::kFloat32)}};
  const auto out16 = run_onnx_runtime(dir.file("dec16.onnx"), in16, dir);
  const auto ref = engine_outputs(folder, "vae_decoder", in32).at("sample");
  ASSERT_TRUE(out16.count("sample"));
  EXPECT_EQ(out16.at("sample").scalar_type(), torch::kFloat16);
  const double err = (out16.at("sample").to(torch::kFloat32) - ref).abs().max().item<double>();
  EXPECT_LE(err, 2e-2 * (1.0 + ref.abs().max().item<double>()));
}

TEST(OnnxExport, ExternalDataBesideTheFile) {
  const auto model = golden_model_dir();
  const auto folder = io::ModelFolder::open(model);
  TempDir dir;
  ExportRequest req = small_shapes(folder);
  req.external_data = true;
  const auto r = export_to(model, "vae_encoder", dir.file("enc.onnx"), req);
  ASSERT_EQ(r.data_path, dir.file("enc.onnx.data"));
  // The weights are beside the file; small constants (axes, shapes) stay inside it.
  EXPECT_GE(r.data_bytes + r.model_bytes, r.weight_bytes);
  EXPECT_GT(r.data_bytes, r.weight_bytes / 2);
  const auto in = make_inputs(r, 0);
  expect_close(run_onnx_runtime(dir.file("enc.onnx"), in, dir),
               engine_outputs(folder, "vae_encoder", in), "external-data vae_encoder");
}

// The real SD2.1-base UNet (865M parameters, random weights): 3.46 GB of float32 weights go
// beside the file as external data, and ONNX Runtime runs it like the engine (128 x 128, the
// batch of two that classifier-free guidance runs).
TEST(OnnxExport, FullSizeSd21BaseUnetWithExternalData) {
  TempDir dir;
  const auto model = dir.file("sd21-base");
  pipeline::write_random_folder(model, pipeline::real_size_spec("sd2.1-base"));
  ExportRequest req;
  req.batch = 2;
  req.height = req.width = 128;
  const auto onnx = dir.file("unet.onnx");
  const auto r = export_to(model, "unet", onnx, req);
  EXPECT_EQ(r.data_path, onnx + ".data");
  EXPECT_GT(r.data_bytes, int64_t{3400} * 1000 * 1000);
  EXPECT_LT(r.model_bytes, int64_t{4} << 20);
  const auto folder = io::ModelFolder::open(model);
  const auto in = make_inputs(r, 0);
  expect_close(run_onnx_runtime(onnx, in, dir), engine_outputs(folder, "unet", in),
               "sd2.1-base unet");
}

TEST(OnnxExport, BadRequestsAreRefusedAndLeaveNothing) {
  const auto model = golden_model_dir();
  TempDir dir;
  const auto out = dir.file("x.onnx");
  ExportRequest r;
  r.opset = 12;
  EXPECT_NE(
      expect_throw<InvalidArgument>([&] { export_to(model, "unet", out, r); }).find("--opset 12"),
      std::string::npos);
  EXPECT_NE(expect_throw<InvalidArgument>([&] {
              export_to(model, "transformer", out);
            }).find("--component transformer"),
            std::string::npos);
  r = {};
  r.height = 100;  // not a multiple of the VAE factor
  EXPECT_NE(
      expect_throw<InvalidArgument>([&] { export_to(model, "unet", out, r); }).find("--height 100"),
      std::string::npos);
  r = {};
  r.precision = "int4";
  expect_throw<InvalidArgument>([&] { export_to(model, "unet", out, r); });
  r = {};
  r.batch = 0;
  expect_throw<InvalidArgument>([&] { export_to(model, "unet", out, r); });
  r = {};
  r.tokens = 100000;
  expect_throw<InvalidArgument>([&] { export_to(model, "text_encoder", out, r); });
  EXPECT_TRUE(fs::is_empty(dir.path())) << "a refused export wrote something";

  // HiDream's transformer has static shapes only; a family without an export is named.
  const auto hidream = verify::GoldenSet::load(hidream_golden_dir()).model_dir();
  r = {};
  r.dynamic = true;
  EXPECT_NE(expect_throw<InvalidArgument>([&] {
              export_to(hidream, "transformer", out, r);
            }).find("static shapes"),
            std::string::npos);
  // T5 overflows float16: refused, saying so.
  r = {};
  r.precision = "fp16";
  EXPECT_NE(expect_throw<InvalidArgument>([&] {
              export_to(verify::GoldenSet::load(flux_golden_dir()).model_dir(), "text_encoder_2",
                        out, r);
            }).find("overflow float16"),
            std::string::npos);
  const auto qwen = sibling_golden_dir("DIFFUSE_QWEN_IMAGE_GOLDEN_DIR", "qwen-image-tiny");
  if (fs::exists(qwen + "/cases.json")) {
    EXPECT_NE(expect_throw<InvalidArgument>([&] {
                export_to(verify::GoldenSet::load(qwen).model_dir(), "transformer", out);
              }).find("ONNX export covers"),
              std::string::npos);
  }

  // An existing file is kept unless --overwrite.
  { std::ofstream(out) << "keep"; }
  expect_throw<IoError>([&] { export_to(model, "vae_decoder", out); });
  EXPECT_EQ(read_file(out), "keep");
  r = {};
  r.overwrite = true;
  export_to(model, "vae_decoder", out, r);
  EXPECT_NE(read_file(out), "keep");
  // A folder that cannot take the file: nothing half-written.
  expect_throw<Error>([&] { export_to(model, "vae_decoder", dir.file("missing/x.onnx")); });
  EXPECT_FALSE(fs::exists(dir.file("missing")));
}

}  // namespace test_onnx_export
}  // namespace diffuse::test
