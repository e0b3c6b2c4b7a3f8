#include "train/hidream_demo_trainer.h"

#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>

#include "device/cpu_allocator.h"
#include "device/cpu_threads.h"
#include "io/json_config.h"
#include "io/model_folder.h"
#include "models/autoencoder_kl.h"
#include "models/clip_text_model.h"
#include "models/hidream_transformer.h"
#include "models/llama.h"
#include "models/load_component.h"
#include "models/t5_encoder.h"
#include "pipeline/component_writer.h"
#include "pipeline/hidream_text.h"
#include "text/bpe_trainer.h"
#include "text/llama_bpe_trainer.h"
#include "text/t5_tokenizer_trainer.h"
#include "text/tokenizer.h"
#include "train/data_parallel.h"
#include "train/hidream_demo_configs.h"
#include "train/scene_edit.h"
#include "train/train_loop.h"

namespace fs = std::filesystem;
using nlohmann::ordered_json;

namespace diffuse::train {
namespace {

constexpr int kPatch = 2, kVaeFactor = kHiDreamDemoVaeFactor;
constexpr double kShift = 2.0;  // the scheduler's, and the sigmas' training distribution
constexpr int64_t kLlamaLayers = 4;
constexpr int64_t kClipProjection = 32;

// One training example: a source scene, an edit of it, and their latents' rows.
struct EditPair {
  SceneEdit edit;
  int64_t source_row = 0, target_row = 0;
};

// The texts the tokenizers learn from (captions with and without size words, E1 prompts and bare
// instructions), and the part of each that the text sequence must hold whole: an E1 prompt up to
// its target description, whose tail may be cut (the instruction and the source image say what
// the description would; a third fewer text tokens makes a training step a quarter cheaper).
struct Corpus {
  std::vector<std::string> texts, must_fit;
};

Corpus caption_corpus(uint64_t seed) {
  std::mt19937_64 rng(seed ^ 0xC0FFEEull);
  Corpus c;
  for (int i = 0; i < 4000; ++i) {
    const Scene s = sample_scene(rng);
    const auto e = sample_edit(s, rng);
    for (auto text : {caption(spec_of(s, true)), caption(spec_of(s, false)), e.instruction}) {
      c.texts.push_back(text);
      c.must_fit.push_back(text);
    }
    c.texts.push_back(e1_prompt(e.instruction, caption(e.target, rng)));
    const auto head = e1_prompt(e.instruction, "");
    c.must_fit.push_back(head.substr(0, head.size() - 1));
  }
  return c;
}

// What the corpus takes of one tokenizer: the longest encoding that must fit and the highest id
// any text uses.
struct CorpusTokens {
  size_t longest = 0;
  int64_t max_id = -1;
};

CorpusTokens corpus_tokens(const Corpus& corpus, const text::Tokenizer& tok) {
  CorpusTokens t;
  for (const auto& text : corpus.texts)
    for (auto id : tok.encode(text)) t.max_id = std::max(t.max_id, id);
  for (const auto& text : corpus.must_fit) t.longest = std::max(t.longest, tok.encode(text).size());
  return t;
}

// The longest text that must fit, in tokens, rounded up to a multiple of 8 with room to spare:
// the sequence length the model is trained and run with (text padding is not masked in the
// transformer, so the two must agree).
int64_t sequence_length_for(std::initializer_list<CorpusTokens> tokens) {
  size_t longest = 0;
  for (const auto& t : tokens) longest = std::max(longest, t.longest);
  return static_cast<int64_t>((longest + 4 + 7) / 8 * 8);
}

template <typename Module, typename Config>
Module build(const ordered_json& json, const char* what) {
  return Module(Config::from_json(io::JsonConfig(json, what)));
}

// The prompt of an edit example as users write it: E1's format or the bare instruction (accepted
// by the pipeline as the whole prompt), half and half. The bare instruction says nothing of what
// stays, so the model must take that from the source: with the target's description every time
// it learns to draw the description and ignores the source (seen in a run: edits redrawn from
// the text, the source's objects lost).
std::string edit_prompt(const SceneEdit& e, std::mt19937_64& rng) {
  if (rng() % 2 == 0) return e.instruction;
  return e1_prompt(e.instruction, caption(e.target, rng));
}

// Every configuration of the model, and the text sequence length it is trained and run with.
struct DemoConfigs {
  ordered_json clip, t5, llama, vae, transformer;
  int64_t seq_len = 0;
};

// Trains the four tokenizers into `root` and sizes the model to them.
DemoConfigs fresh_configs(const Corpus& corpus, const fs::path& root, int resolution) {
  const auto clip_vocab = text::train_clip_bpe(corpus.texts, 400);
  for (const char* dir : {"tokenizer", "tokenizer_2"})
    text::save_clip_tokenizer(clip_vocab, (root / dir).string(), 248);
  text::train_t5_tokenizer(corpus.texts, 320, (root / "tokenizer_3").string(), 512);
  text::train_llama_tokenizer(corpus.texts, 400, (root / "tokenizer_4").string(), 2048);
  const auto clip_tok = text::load_tokenizer((root / "tokenizer").string());
  const auto t5_tok = text::load_tokenizer((root / "tokenizer_3").string());
  const auto llama_tok = text::load_tokenizer((root / "tokenizer_4").string());
  const auto clip_tokens = corpus_tokens(corpus, *clip_tok);
  const auto t5_tokens = corpus_tokens(corpus, *t5_tok);
  const auto llama_tokens = corpus_tokens(corpus, *llama_tok);
  DemoConfigs c;
  c.seq_len = sequence_length_for({clip_tokens, t5_tokens, llama_tokens});
  const auto clip_vocab_size = static_cast<int64_t>(clip_vocab.tokens.size());
  c.clip = hidream_demo_clip_config(clip_vocab_size, clip_vocab_size - 2, clip_vocab_size - 1,
                                    kClipProjection);
  // The T5 vocabulary: SentencePiece's pieces (no extra ids).
  c.t5 = hidream_demo_t5_config(std::max<int64_t>(t5_tokens.max_id + 1, 320));
  const int64_t llama_vocab = std::max<int64_t>({llama_tokens.max_id + 1, llama_tok->eos_id() + 1,
                                                 llama_tok->bos_id() + 1, llama_tok->pad_id() + 1});
  c.llama = hidream_demo_llama_config(llama_vocab, llama_tok->bos_id(), llama_tok->eos_id(),
                                      kLlamaLayers);
  c.vae = hidream_demo_vae_config(resolution);
  c.transformer = hidream_demo_transformer_config(
      resolution / kVaeFactor, c.t5["d_model"].get<int64_t>(),
      c.llama["hidden_size"].get<int64_t>(), 2 * kClipProjection, kLlamaLayers);
  return c;
}

// The folder of an earlier hidream-e1 run that --init-from continues.
struct InitFolder {
  fs::path dir;
  io::ModelFolder folder;
  ordered_json record;  // its training.json
};

ordered_json read_json(const fs::path& path) {
  std::ifstream in(path);
  if (!in) throw IoError("train-demo --init-from: cannot read " + path.string());
  try {
    return ordered_json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    throw FormatError("train-demo --init-from: " + path.string() +
                      " is not valid JSON: " + e.what());
  }
}

// Checked before anything is written: a folder `train-demo --arch hidream-e1` made at this
// resolution, and not the output folder itself.
std::optional<InitFolder> open_init_folder(const TrainDemoOptions& o) {
  if (o.init_from.empty()) return std::nullopt;
  const fs::path dir = o.init_from;
  std::error_code ec;
  if (fs::weakly_canonical(dir, ec) == fs::weakly_canonical(o.out, ec))
    throw InvalidArgument("train-demo: --init-from and --out are the same folder (" + dir.string() +
                          "); write the continued model elsewhere");
  auto folder = io::ModelFolder::open(dir.string());
  auto record = read_json(dir / "training.json");
  const std::string where = "train-demo --init-from " + dir.string() + ": ";
  if (record.value("arch", std::string()) != "hidream-e1")
    throw InvalidArgument(where + "training.json says arch '" +
                          record.value("arch", std::string("?")) +
                          "'; expected a folder made by train-demo --arch hidream-e1");
  if (record.value("resolution", 0) != o.resolution)
    throw InvalidArgument(where + "trained at resolution " +
                          std::to_string(record.value("resolution", 0)) + ", this run asks " +
                          std::to_string(o.resolution));
  return InitFolder{dir, std::move(folder), std::move(record)};
}

DemoConfigs configs_of(const InitFolder& init) {
  DemoConfigs c;
  c.clip = read_json(init.dir / "text_encoder" / "config.json");
  c.t5 = read_json(init.dir / "text_encoder_3" / "config.json");
  c.llama = read_json(init.dir / "text_encoder_4" / "config.json");
  c.vae = read_json(init.dir / "vae" / "config.json");
  c.transformer = read_json(init.dir / "transformer" / "config.json");
  const auto index = read_json(init.dir / "model_index.json");
  c.seq_len = index.value("_diffuse_defaults", ordered_json::object())
                  .value("max_sequence_length", int64_t{0});
  if (c.seq_len <= 0)
    throw FormatError("train-demo --init-from: " + (init.dir / "model_index.json").string() +
                      " has no _diffuse_defaults.max_sequence_length");
  return c;
}

}  // namespace

TrainReport train_hidream_demo(const TrainDemoOptions& o, const TrainCallback& on_progress,
                               const std::atomic<bool>* cancel) {
  validate_train_options(o, kVaeFactor, kPatch);
  const EditMix edit_mix = parse_edit_mix(o.edit_mix);
  const auto init = open_init_folder(o);
  const bool bf16 = train_in_bf16(o.precision);
  StagedFolder folder(o.out, o.force);
  device::configure_cpu_threads();
  device::set_cpu_memory_policy();
  const auto t_start = Clock::now();
  const double budget_s = o.minutes * 60;
  TrainReport report;
  torch::manual_seed(o.seed);
  auto gen = at::detail::createCPUGenerator(o.seed);
  const auto root = folder.path();

  // Tokenizers of the four kinds, learned from the world's texts (or the earlier run's), and
  // the configurations of the text encoders.
  DemoConfigs cfg;
  if (init) {
    for (const char* dir : {"tokenizer", "tokenizer_2", "tokenizer_3", "tokenizer_4"})
      fs::copy(init->dir / dir, root / dir, fs::copy_options::recursive);
    cfg = configs_of(*init);
  } else {
    cfg = fresh_configs(caption_corpus(o.seed), root, o.resolution);
  }
  pipeline::HiDreamTextEncoders::Parts parts;
  parts.clip_l_tok = text::load_tokenizer((root / "tokenizer").string());
  parts.clip_g_tok = text::load_tokenizer((root / "tokenizer_2").string());
  parts.t5_tok = text::load_tokenizer((root / "tokenizer_3").string());
  parts.llama_tok = text::load_tokenizer((root / "tokenizer_4").string());
  const int64_t seq_len = cfg.seq_len;
  const auto& clip_json = cfg.clip;
  const auto& t5_json = cfg.t5;
  const auto& llama_json = cfg.llama;

  auto clip_config = [&](const char* what) {
    auto c = models::ClipTextConfig::from_json(io::JsonConfig(clip_json, what));
    c.with_projection = true;
    c.projection_dim = kClipProjection;
    return c;
  };
  parts.clip_l = models::ClipTextModel(clip_config("demo text_encoder"));
  parts.clip_g = models::ClipTextModel(clip_config("demo text_encoder_2"));
  parts.t5 = build<models::T5EncoderModel, models::T5Config>(t5_json, "demo text_encoder_3");
  parts.llama =
      build<models::LlamaForCausalLM, models::LlamaConfig>(llama_json, "demo text_encoder_4");
  std::vector<torch::nn::Module*> encoders = {parts.clip_l.get(), parts.clip_g.get(),
                                              parts.t5.get(), parts.llama.get()};
  const auto& vae_json = cfg.vae;
  const int latent_size = o.resolution / kVaeFactor;
  const auto& transformer_json = cfg.transformer;
  auto vae = build<models::AutoencoderKL, models::AutoencoderKLConfig>(vae_json, "demo vae");
  auto transformer =
      build<models::HiDreamImageTransformer2DModel, models::HiDreamTransformerConfig>(
          transformer_json, "demo transformer");
  pipeline::HiDreamTextEncoders text_encoders(std::move(parts), torch::Device(torch::kCPU));
  report.parameters = count_parameters(*vae) + count_parameters(*transformer);
  for (auto* m : encoders) report.parameters += count_parameters(*m);

  if (init) {
    const char* components[] = {"text_encoder", "text_encoder_2", "text_encoder_3",
                                "text_encoder_4"};
    for (size_t k = 0; k < encoders.size(); ++k)
      models::load_component_weights(*encoders[k], init->folder, components[k]);
    models::load_component_weights(*vae, init->folder, "vae");
    models::load_component_weights(*transformer, init->folder, "transformer");
  }

  const auto held_out = held_out_prompts();
  SceneSource source(o.seed, held_out);

  // Stage 1: the autoencoder (kept as it is when continuing an earlier run).
  if (!init)
    train_autoencoder(vae, source, autoencoder_stage(o, 0.25 * budget_s), bf16, gen, on_progress,
                      cancel, report);

  // Stage 2: edit pairs and their latents (sources and targets), shifted and scaled to zero
  // mean and unit variance as the Flux VAE's shift_factor / scaling_factor do.
  const auto t_encode = Clock::now();
  std::vector<EditPair> pairs;
  std::vector<Scene> scenes;
  for (int64_t i = 0; i < o.dataset_size; ++i) {
    EditPair p;
    p.edit = sample_edit(
        edit_mix, [&] { return source.next(); }, source.rng());
    p.source_row = static_cast<int64_t>(scenes.size());
    scenes.push_back(p.edit.source);
    p.target_row = static_cast<int64_t>(scenes.size());
    scenes.push_back(p.edit.target);
    pairs.push_back(std::move(p));
  }
  torch::Tensor latents = encode_scenes(vae, scenes, o.resolution, bf16, on_progress, cancel);
  // The latents' shift and scale: measured on a new autoencoder, the earlier run's otherwise (its
  // transformer learned on those).
  report.shift_factor =
      init ? vae_json["shift_factor"].get<double>() : latents.mean().item<double>();
  report.scaling_factor =
      init ? vae_json["scaling_factor"].get<double>() : 1.0 / latents.std().item<double>();
  latents.sub_(report.shift_factor).mul_(report.scaling_factor);
  report.encode_s = seconds_since(t_encode);

  // Stage 3: the transformer and the four text encoders, by flow matching. Each step holds a
  // text-to-image batch (captions of sources and targets) and an edit batch (sources beside the
  // noisy targets), with text and source image dropped at random so that both guidances work.
  // In float32 whatever --precision says (it rules the autoencoder): this transformer's width-96
  // matrices gain nothing from bf16 and the casts cost (measured: 0.83 s a step in float32,
  // 1.34 s under bf16 autocast). The batch runs as data-parallel shards, one per core.
  int data_parallel_shards = 1;
  {
    const auto t0 = Clock::now();
    transformer->train();
    std::vector<torch::Tensor> params = transformer->parameters();
    for (auto* m : encoders) {
      m->train();
      for (const auto& p : m->parameters()) params.push_back(p);
    }
    const double peak_lr = o.learning_rate > 0 ? o.learning_rate : 5e-4;
    torch::optim::AdamW opt(
        params, torch::optim::AdamWOptions(peak_lr).betas({0.9, 0.99}).weight_decay(0.01));
    Ema ema(params);
    const int64_t N = static_cast<int64_t>(pairs.size());
    const int edit_batch = std::max(1, o.unet_batch * 2 / 3);
    const int t2i_batch = std::max(1, o.unet_batch - edit_batch);
    DataParallelGradients parallel(
        std::min({device::configure_cpu_threads(), t2i_batch, edit_batch}));
    data_parallel_shards = parallel.shards();
    auto& rng = source.rng();
    const int64_t w = latent_size;
    models::HiDreamForwardOptions edit_fwd;
    edit_fwd.max_seq = (latent_size / kPatch) * (2 * latent_size / kPatch);
    auto sigmas = [&](int n) {
      // Logit-normal, then the scheduler's shift: the noise levels inference visits.
      auto s = torch::sigmoid(at::randn({n}, gen));
      return kShift * s / (1 + (kShift - 1) * s);
    };
    auto step = [&](int64_t i, int64_t total) {
      set_learning_rate(opt, learning_rate(i, total, peak_lr));
      std::vector<std::string> prompts;
      std::vector<torch::Tensor> t2i_x0, edit_x0, edit_src;
      for (int b = 0; b < t2i_batch; ++b) {
        const auto& p = pairs[rng() % N];
        const bool target = rng() % 2 == 0;
        const Scene& s = target ? p.edit.target : p.edit.source;
        t2i_x0.push_back(latents[target ? p.target_row : p.source_row]);
        prompts.push_back(rng() % 10 == 0 ? std::string() : caption(s, rng));
      }
      for (int b = 0; b < edit_batch; ++b) {
        const auto& p = pairs[rng() % N];
        edit_x0.push_back(latents[p.target_row]);
        // 10 % without text, 10 % without the image, 5 % without both.
        const int r = static_cast<int>(rng() % 20);
        const bool drop_text = r < 2 || r == 4, drop_image = (r >= 2 && r < 4) || r == 4;
        edit_src.push_back(drop_image ? torch::zeros_like(latents[p.source_row])
                                      : latents[p.source_row]);
        prompts.push_back(drop_text ? std::string() : edit_prompt(p.edit, rng));
      }
      const auto x0_t = torch::stack(t2i_x0), x0_e = torch::stack(edit_x0);
      const auto src = torch::stack(edit_src);
      const auto s_t = sigmas(t2i_batch), s_e = sigmas(edit_batch);
      const auto n_t = at::randn(x0_t.sizes(), gen), n_e = at::randn(x0_e.sizes(), gen);
      auto noisy = [](const torch::Tensor& x0, const torch::Tensor& n, const torch::Tensor& s) {
        const auto sv = s.view({-1, 1, 1, 1});
        return (1 - sv) * x0 + sv * n;
      };
      // Shard k's share of the loss: the mean over the whole batch is the sum of the shards'.
      auto shard_loss = [&](int k) {
        const int S = parallel.shards();
        const int64_t bt = shard_begin(t2i_batch, S, k), nt = shard_size(t2i_batch, S, k);
        const int64_t be = shard_begin(edit_batch, S, k), ne = shard_size(edit_batch, S, k);
        std::vector<std::string> shard_prompts(prompts.begin() + bt, prompts.begin() + bt + nt);
        shard_prompts.insert(shard_prompts.end(), prompts.begin() + t2i_batch + be,
                             prompts.begin() + t2i_batch + be + ne);
        auto e = text_encoders.encode(shard_prompts, seq_len);
        auto slice = [&](int64_t from, int64_t n) {
          return std::make_tuple(e.t5.narrow(0, from, n), e.llama.narrow(1, from, n),
                                 e.pooled.narrow(0, from, n));
        };
        const auto [t5_t, llama_t, pooled_t] = slice(0, nt);
        const auto [t5_e, llama_e, pooled_e] = slice(nt, ne);
        const auto x0t = x0_t.narrow(0, bt, nt), nst = n_t.narrow(0, bt, nt);
        const auto st = s_t.narrow(0, bt, nt);
        const auto x0e = x0_e.narrow(0, be, ne), nse = n_e.narrow(0, be, ne);
        const auto se = s_e.narrow(0, be, ne);
        // The model's raw output is x0 - noise (the pipelines negate it into the velocity).
        const auto out_t =
            transformer->forward(noisy(x0t, nst, st), st * 1000, t5_t, llama_t, pooled_t);
        const auto input_e = torch::cat({noisy(x0e, nse, se), src.narrow(0, be, ne)}, 3);
        const auto out_e =
            transformer->forward(input_e, se * 1000, t5_e, llama_e, pooled_e, edit_fwd)
                .narrow(3, 0, w);
        const auto err_t = (out_t - (x0t - nst)).pow(2).mean();
        const auto err_e = (out_e - (x0e - nse)).pow(2).mean();
        return (static_cast<double>(nt) * err_t + static_cast<double>(ne) * err_e) /
               static_cast<double>(t2i_batch + edit_batch);
      };
      opt.zero_grad();
      const double loss = parallel.backward(params, shard_loss);
      torch::nn::utils::clip_grad_norm_(params, 1.0);
      opt.step();
      ema.update(i, total);
      return loss;
    };
    const double remaining = std::max(1.0, 0.98 * budget_s - seconds_since(t_start));
    report.unet_steps = run_stage("transformer", o.unet_steps, remaining, step, on_progress, cancel,
                                  report.unet_loss);
    ema.copy_to_params();
    transformer->eval();
    for (auto* m : encoders) m->eval();
    report.unet_s = seconds_since(t0);
  }
  throw_if_cancelled(cancel);

  // The folder, in the layout of a real HiDream folder.
  const std::string made_by =
      "diffuse train-demo --arch hidream-e1 --seed " + std::to_string(o.seed);
  const bool half = o.half_precision_weights;
  auto vae_out = vae_json;
  vae_out["scaling_factor"] = report.scaling_factor;
  vae_out["shift_factor"] = report.shift_factor;
  pipeline::write_json_file(root / "vae" / "config.json", vae_out);
  pipeline::save_module_weights(*vae, root / "vae" / "diffusion_pytorch_model.safetensors", half,
                                made_by);
  pipeline::write_json_file(root / "transformer" / "config.json", transformer_json);
  pipeline::save_module_weights(
      *transformer, root / "transformer" / "diffusion_pytorch_model.safetensors", half, made_by);
  const std::pair<const char*, const ordered_json*> configs[] = {{"text_encoder", &clip_json},
                                                                 {"text_encoder_2", &clip_json},
                                                                 {"text_encoder_3", &t5_json},
                                                                 {"text_encoder_4", &llama_json}};
  for (size_t k = 0; k < encoders.size(); ++k) {
    pipeline::write_json_file(root / configs[k].first / "config.json", *configs[k].second);
    pipeline::save_module_weights(*encoders[k], root / configs[k].first / "model.safetensors", half,
                                  made_by);
  }
  pipeline::write_json_file(root / "scheduler" / "scheduler_config.json",
                            hidream_demo_scheduler_config(kShift));
  // The DiT caches' settings measured on this model (docs/acceleration.md): what a bare
  // --cache fbcache / taylorseer gets.
  const ordered_json defaults = {
      {"steps", 20},
      {"guidance_scale", 4.0},
      {"image_guidance_scale", 1.5},
      {"max_sequence_length", seq_len},
      {"cache", {{"fbcache", "fbcache:0.25"}, {"taylorseer", "taylorseer:2:1"}}}};
  pipeline::write_json_file(root / "model_index.json", hidream_demo_model_index(defaults));
  report.total_s = seconds_since(t_start);
  auto record = training_record(o, report, bf16, "transformer", "edit_pairs", held_out);
  record["shift_factor"] = report.shift_factor;
  record["transformer"]["precision"] = "fp32";
  record["transformer"]["data_parallel_shards"] = data_parallel_shards;
  record["max_sequence_length"] = seq_len;
  record["edit_mix"] = edit_mix_spec(edit_mix);
  if (init) record["init_from"] = {{"folder", init->dir.string()}, {"training", init->record}};
  pipeline::write_json_file(root / "training.json", record);
  report.record = record.dump(2);
  folder.commit();
  return report;
}

}  // namespace diffuse::train
