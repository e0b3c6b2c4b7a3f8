#include "train/demo_trainer.h"

#include <torch/torch.h>
#include <torch/version.h>

#include <cmath>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <random>

#include "device/cpu_allocator.h"
#include "device/cpu_threads.h"
#include "device/device.h"
#include "diffuse/errors.h"
#include "io/json_config.h"
#include "models/autoencoder_kl.h"
#include "models/clip_text_model.h"
#include "models/unet2d_condition.h"
#include "pipeline/component_writer.h"
#include "schedulers/scheduler_config.h"
#include "text/bpe_trainer.h"
#include "text/clip_tokenizer.h"
#include "train/demo_configs.h"
#include "train/hidream_demo_trainer.h"
#include "train/scene.h"
#include "train/train_loop.h"

namespace fs = std::filesystem;
using nlohmann::ordered_json;

namespace diffuse::train {
namespace {

TrainReport train_sd_demo(const TrainDemoOptions& o, const TrainCallback& on_progress,
                          const std::atomic<bool>* cancel) {
  validate_train_options(o, 8, 1);
  const bool bf16 = train_in_bf16(o.precision);
  StagedFolder folder(o.out, o.force);
  device::configure_cpu_threads();
  // Training allocates and frees the same activation-sized buffers every step (page faults
  // were 30-40 % of the step time here without this).
  device::set_cpu_memory_policy();
  const auto t_start = Clock::now();
  const double budget_s = o.minutes * 60;
  TrainReport report;
  torch::manual_seed(o.seed);
  auto gen = at::detail::createCPUGenerator(o.seed);

  // Tokenizer: a BPE vocabulary learned from the world's captions.
  std::mt19937_64 corpus_rng(o.seed ^ 0xC0FFEEull);
  std::vector<std::string> corpus;
  for (int i = 0; i < 4000; ++i) {
    const Scene s = sample_scene(corpus_rng);
    corpus.push_back(caption(spec_of(s, true)));
    corpus.push_back(caption(spec_of(s, false)));
  }
  const auto vocab = text::train_clip_bpe(corpus, 400);
  const int max_tokens = kDemoMaxTokens;
  text::save_clip_tokenizer(vocab, (folder.path() / "tokenizer").string(), max_tokens);
  const auto tokenizer = text::ClipTokenizer::from_folder((folder.path() / "tokenizer").string());
  const auto vocab_size = static_cast<int64_t>(vocab.tokens.size());

  const auto vae_json = demo_vae_config(o.resolution);
  const auto unet_json = demo_unet_config(o.resolution / 8);
  const auto te_json = demo_text_encoder_config(vocab_size, vocab_size - 2, vocab_size - 1);
  const auto sched_json = demo_scheduler_config();
  auto vae = models::AutoencoderKL(
      models::AutoencoderKLConfig::from_json(io::JsonConfig(vae_json, "demo vae")));
  auto unet = models::UNet2DConditionModel(
      models::UNet2DConditionConfig::from_json(io::JsonConfig(unet_json, "demo unet")));
  auto text_encoder = models::ClipTextModel(
      models::ClipTextConfig::from_json(io::JsonConfig(te_json, "demo text_encoder")));
  report.parameters =
      count_parameters(*vae) + count_parameters(*unet) + count_parameters(*text_encoder);

  const auto held_out = held_out_prompts();
  SceneSource source(o.seed, held_out);

  // Stage 1: the autoencoder.
  train_autoencoder(vae, source, autoencoder_stage(o, 0.3 * budget_s), bf16, gen, on_progress,
                    cancel, report);

  // Stage 2: the dataset of latents the UNet learns from.
  const auto t_encode = Clock::now();
  const std::vector<Scene> scenes = source.next(static_cast<int>(o.dataset_size));
  torch::Tensor latents = encode_scenes(vae, scenes, o.resolution, bf16, on_progress, cancel);
  report.scaling_factor = 1.0 / latents.std().item<double>();
  latents.mul_(report.scaling_factor);
  report.encode_s = seconds_since(t_encode);

  // Stage 3: UNet and text encoder together, epsilon prediction with min-SNR weighting and
  // 10 % empty captions (for classifier-free guidance).
  {
    const auto t0 = Clock::now();
    unet->train();
    text_encoder->train();
    std::vector<torch::Tensor> params = unet->parameters();
    for (const auto& p : text_encoder->parameters()) params.push_back(p);
    const double peak_lr = o.learning_rate > 0 ? o.learning_rate : 4e-4;
    torch::optim::AdamW opt(
        params, torch::optim::AdamWOptions(peak_lr).betas({0.9, 0.99}).weight_decay(0.01));
    schedulers::SchedulerConfig sched(io::JsonConfig(sched_json, "demo scheduler"));
    const auto alphas_cumprod =
        schedulers::alphas_cumprod_from_betas(sched.betas("linear", 0.0001, 0.02, false));
    const int64_t T = alphas_cumprod.size(0), N = latents.size(0);
    Ema ema(params);
    auto step = [&](int64_t i, int64_t total) {
      set_learning_rate(opt, learning_rate(i, total, peak_lr));
      const auto idx = at::randint(N, {o.unet_batch}, gen, torch::kLong);
      const auto x0 = latents.index_select(0, idx);
      std::vector<std::string> captions;
      const auto* ids = idx.data_ptr<int64_t>();
      for (int b = 0; b < o.unet_batch; ++b) {
        const bool drop = source.rng()() % 10 == 0;
        captions.push_back(drop ? std::string() : caption(scenes[ids[b]], source.rng()));
      }
      const auto tokens = tokenizer.encode_padded(captions, max_tokens);
      std::vector<int64_t> flat;
      for (const auto& row : tokens.input_ids) flat.insert(flat.end(), row.begin(), row.end());
      const auto input_ids = torch::tensor(flat, torch::kLong).view({o.unet_batch, max_tokens});
      const auto t = at::randint(T, {o.unet_batch}, gen, torch::kLong);
      const auto noise = at::randn(x0.sizes(), gen);
      const auto ab = alphas_cumprod.index_select(0, t).view({-1, 1, 1, 1});
      const auto noisy = ab.sqrt() * x0 + (1 - ab).sqrt() * noise;
      torch::Tensor pred;
      {
        AutocastGuard autocast(bf16);  // the forward pass only, as autocast wants
        const auto context = text_encoder->forward(input_ids).last_hidden_state;
        pred = unet->forward(noisy, t.to(torch::kFloat32), context).to(torch::kFloat32);
      }
      const auto snr = (ab / (1 - ab)).view({-1});
      const auto weight = torch::clamp_max(snr, 5.0) / snr;
      auto loss = (weight * (pred - noise).pow(2).mean({1, 2, 3})).mean();
      opt.zero_grad();
      loss.backward();
      torch::nn::utils::clip_grad_norm_(params, 1.0);
      opt.step();
      ema.update(i, total);
      return loss.item<double>();
    };
    // Whatever the first two stages left of the budget, less a little for writing.
    const double remaining = std::max(1.0, 0.98 * budget_s - seconds_since(t_start));
    report.unet_steps =
        run_stage("unet", o.unet_steps, remaining, step, on_progress, cancel, report.unet_loss);
    ema.copy_to_params();
    unet->eval();
    text_encoder->eval();
    report.unet_s = seconds_since(t0);
  }
  throw_if_cancelled(cancel);

  // The folder.
  auto vae_out = vae_json;
  vae_out["scaling_factor"] = report.scaling_factor;
  const std::string made_by = "diffuse train-demo --seed " + std::to_string(o.seed);
  const auto root = folder.path();
  pipeline::write_json_file(root / "vae" / "config.json", vae_out);
  pipeline::save_module_weights(*vae, root / "vae" / "diffusion_pytorch_model.safetensors",
                                o.half_precision_weights, made_by);
  pipeline::write_json_file(root / "unet" / "config.json", unet_json);
  pipeline::save_module_weights(*unet, root / "unet" / "diffusion_pytorch_model.safetensors",
                                o.half_precision_weights, made_by);
  pipeline::write_json_file(root / "text_encoder" / "config.json", te_json);
  pipeline::save_module_weights(*text_encoder, root / "text_encoder" / "model.safetensors",
                                o.half_precision_weights, made_by);
  pipeline::write_json_file(root / "scheduler" / "scheduler_config.json", sched_json);
  pipeline::write_json_file(
      root / "model_index.json",
      pipeline::stable_diffusion_model_index(
          sched_json.value("_class_name", "PNDMScheduler"),
          "trained from scratch by `diffuse train-demo` on the demo world (see training.json)"));
  report.total_s = seconds_since(t_start);
  const auto record = training_record(o, report, bf16, "unet", "scenes", held_out);
  pipeline::write_json_file(root / "training.json", record);
  report.record = record.dump(2);
  folder.commit();
  return report;
}

}  // namespace

TrainReport train_demo(const TrainDemoOptions& o, const TrainCallback& on_progress,
                       const std::atomic<bool>* cancel) {
  if (o.arch == "sd") {
    if (!o.init_from.empty())
      throw InvalidArgument("train-demo: --init-from continues --arch hidream-e1 runs only");
    if (!o.edit_mix.empty() && o.edit_mix != "natural")
      throw InvalidArgument("train-demo: --edit-mix is for --arch hidream-e1 (edit pairs)");
    return train_sd_demo(o, on_progress, cancel);
  }
  if (o.arch == "hidream-e1") return train_hidream_demo(o, on_progress, cancel);
  throw InvalidArgument("train-demo: --arch must be sd or hidream-e1, got '" + o.arch + "'");
}

}  // namespace diffuse::train
