// One runner per component; each lives in verify_<component>.cpp and reads everything it
// needs (inputs, params, tolerances, model folder) from the case and the set.
#pragma once
#include <map>
#include <string>
#include <utility>

#include "diffuse/pipeline.h"
#include "pipeline/stable_diffusion.h"
#include "verify/verify.h"

namespace diffuse::verify {

CaseResult verify_text_encoder(const GoldenSet& set, const GoldenCase& c, const VerifyOptions& o);

CaseResult verify_tokenizer(const GoldenSet& set, const GoldenCase& c,
                            const VerifyOptions& options);
// UNet2DConditionModel forward (inputs sample, timestep, encoder_hidden_states; output out).
CaseResult verify_unet(const GoldenSet& set, const GoldenCase& c, const VerifyOptions& options);
// ControlNetModel forward (inputs sample, timestep, encoder_hidden_states, controlnet_cond;
// outputs down_block_res_sample.i, mid_block_res_sample).
CaseResult verify_controlnet(const GoldenSet& set, const GoldenCase& c,
                             const VerifyOptions& options);
// The ControlNet folder number `index` of a case: params.controlnet_dirs[index] (relative to
// the set), params.controlnet, or the case's model folder's controlnet/.
std::string case_controlnet_dir(const GoldenSet& set, const GoldenCase& c, size_t index);
// Image preprocessing of the pipelines: a mask (inputs image_u8, mask_u8) or a ControlNet's
// control image (input image_u8), compared exactly where the reference is 8-bit arithmetic.
CaseResult verify_preprocessing(const GoldenSet& set, const GoldenCase& c,
                                const VerifyOptions& options);
// HiDreamImageTransformer2DModel forward (inputs x, timesteps, t5, llama, pooled; output out).
CaseResult verify_transformer(const GoldenSet& set, const GoldenCase& c,
                              const VerifyOptions& options);
// FluxTransformer2DModel forward (inputs x, timestep, enc, pooled, img_ids, txt_ids[, guidance];
// output out); verify_transformer hands a FLUX transformer to it.
CaseResult verify_flux_transformer(const GoldenSet& set, const GoldenCase& c,
                                   const VerifyOptions& options);
// (model folder, component) of the component folder params.`key` names relative to the set
// (e.g. "model/transformer_schnell"); without it (the case's model folder, `fallback`).
std::pair<std::string, std::string> case_component(const GoldenSet& set, const GoldenCase& c,
                                                   const std::string& key,
                                                   const std::string& fallback);
// AutoencoderKL encode (input x; outputs mean, logvar, std) and/or decode (input z; output sample).
CaseResult verify_vae(const GoldenSet& set, const GoldenCase& c, const VerifyOptions& options);
CaseResult verify_scheduler(const GoldenSet& set, const GoldenCase& c,
                            const VerifyOptions& options);

// HiDream-I1 text-to-image / HiDream-E1 editing replay (verify_pipeline dispatches to it by
// model_index.json's class).
CaseResult verify_hidream_pipeline(const GoldenSet& set, const GoldenCase& c,
                                   const VerifyOptions& options);
// FLUX.1 / FLUX.1 Kontext replay (verify_pipeline dispatches to it by model_index.json's class;
// params.transformer picks the transformer folder, e.g. model/transformer_schnell).
CaseResult verify_flux_pipeline(const GoldenSet& set, const GoldenCase& c,
                                const VerifyOptions& options);
// Compares every traced tensor the case also stores (ids exactly; timesteps, embeddings and
// images with atol; latent-like tensors relative to their largest magnitude).
void compare_traced_tensors(const GoldenCase& c, const CaseTensors& t,
                            const std::map<std::string, torch::Tensor>& traced,
                            const std::string& label, CaseResult* r);

// A LoRA file merged into the HiDream transformer (output out, and out_adapters_disabled).
CaseResult verify_lora(const GoldenSet& set, const GoldenCase& c, const VerifyOptions& options);

// Every component of a Qwen-Image set (tokenizer, processor, text_encoder, vae, transformer,
// scheduler, pipeline; verify_qwenimage.cpp); is_qwenimage_set: its model_index.json names a
// QwenImage pipeline.
CaseResult verify_qwenimage(const GoldenSet& set, const GoldenCase& c,
                            const VerifyOptions& options);
bool is_qwenimage_set(const GoldenSet& set);

// Stable Diffusion txt2img / img2img replay (diffusers folder and single-file checkpoint).
CaseResult verify_pipeline(const GoldenSet& set, const GoldenCase& c, const VerifyOptions& options);

}  // namespace diffuse::verify
