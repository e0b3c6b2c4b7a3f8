// Golden runner for component "vae". What a case checks follows from its tensors: an input
// "x" means encode (compare mean / logvar / std, and latents_e1 = the pipeline's latents of
// the mode, as HiDream-E1 encodes), an input "z" means decode of the VAE's z, an input
// "latents" means decode as the pipelines call it (decoder_input = the z of those latents);
// every captured "inter.*" is compared too.
#include <torch/torch.h>

#include "diffuse/errors.h"
#include "io/model_folder.h"
#include "models/autoencoder_kl.h"
#include "verify/compare_intermediates.h"
#include "verify/runners.h"

namespace diffuse::verify {

CaseResult verify_vae(const GoldenSet& set, const GoldenCase& c, const VerifyOptions& options) {
  auto folder = io::ModelFolder::open(set.model_dir());
  auto vae = models::load_vae(folder, options.device, torch::kFloat32);
  CaseTensors tensors(c);
  if (!tensors.has("x") && !tensors.has("z") && !tensors.has("latents"))
    throw FormatError(c.file +
                      ": a vae case needs an input 'x' (encode), 'z' or 'latents' (decode)");
  const auto& vc = vae->config();

  const double atol = c.tol("atol", 1e-4), rtol = c.tol("rtol", 0.0);
  CaseResult result;
  models::Intermediates captured;
  if (tensors.has("x")) {
    auto dist = vae->encode(tensors.get("x").to(options.device), &captured);
    for (const auto& [name, got] : {std::pair<std::string, torch::Tensor>{"mean", dist.mean},
                                    {"logvar", dist.logvar},
                                    {"std", dist.std}})
      if (tensors.has(name)) result.add(name, compare(name, got, tensors.get(name), atol, rtol));
    if (tensors.has("latents_e1"))
      result.add("latents_e1", compare("latents_e1", vc.to_latents(dist.mean),
                                       tensors.get("latents_e1"), atol, rtol));
  }
  if (tensors.has("z") || tensors.has("latents")) {
    torch::Tensor z;
    if (tensors.has("z")) {
      z = tensors.get("z").to(options.device);
    } else {
      z = vc.from_latents(tensors.get("latents").to(options.device));
      if (tensors.has("decoder_input"))
        result.add("decoder_input",
                   compare("decoder_input", z, tensors.get("decoder_input"), atol, rtol));
    }
    auto image = vae->decode(z, &captured);
    if (tensors.has("sample"))
      result.add("sample", compare("sample", image, tensors.get("sample"), atol, rtol));
  }
  compare_intermediates(result, tensors, captured, atol, rtol);
  return result;
}

}  // namespace diffuse::verify
