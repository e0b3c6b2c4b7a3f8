#include "export/onnx_export.h"

#include <torch/torch.h>

#include <algorithm>
#include <filesystem>

#include "diffuse/errors.h"
#include "export/onnx_components.h"
#include "export/onnx_graph.h"
#include "io/model_folder.h"
#include "pipeline/flux.h"
#include "pipeline/hidream.h"

namespace diffuse::onnx_export {
namespace {

torch::Dtype precision_dtype(const std::string& precision) {
  if (precision == "fp32" || precision == "float32") return torch::kFloat32;
  if (precision == "fp16" || precision == "float16") return torch::kFloat16;
  throw InvalidArgument("--precision " + precision + ": expected fp32 or fp16");
}

bool is_flux(const io::ModelFolder& folder) {
  return pipeline::is_flux_folder(folder.dir());
}
bool is_hidream(const io::ModelFolder& folder) {
  return pipeline::is_hidream_folder(folder.dir());
}

std::string family_refusal(const io::ModelFolder& folder) {
  const std::string cls = folder.model_index().get<std::string>("_class_name", "");
  if (cls.rfind("StableDiffusion", 0) == 0 || is_flux(folder) || is_hidream(folder)) return "";
  return "ONNX export covers Stable Diffusion 1.x/2.x/XL, FLUX.1 and HiDream folders; " +
         folder.dir() + " holds a " +
         (cls.empty() ? std::string("pipeline of unknown class") : cls);
}

}  // namespace

std::string TensorSpec::describe() const {
  const std::string type = dtype == torch::kFloat32   ? "float32"
                           : dtype == torch::kFloat16 ? "float16"
                           : dtype == torch::kInt64   ? "int64"
                                                      : c10::toString(dtype);
  std::string s = name + " " + type + " [";
  for (size_t i = 0; i < dims.size(); ++i)
    s += (i ? ", " : "") + (dims[i] < 0 ? std::string("?") : std::to_string(dims[i]));
  return s + "]";
}

std::vector<std::string> exportable_components(const std::string& model_dir) {
  const auto folder = io::ModelFolder::open(model_dir);
  std::vector<std::string> out;
  if (!family_refusal(folder).empty()) return out;
  for (const char* te : {"text_encoder", "text_encoder_2", "text_encoder_3", "text_encoder_4"})
    if (folder.has_component(te) && (folder.component_class(te).rfind("CLIPTextModel", 0) == 0 ||
                                     folder.component_class(te) == "T5EncoderModel" ||
                                     folder.component_class(te) == "LlamaForCausalLM"))
      out.push_back(te);
  if (folder.has_component("unet")) out.push_back("unet");
  if (folder.has_component("unet") && folder.has_component("controlnet") &&
      folder.component_class("controlnet") == "ControlNetModel")
    out.push_back("controlnet");
  // FLUX folders may hold more than one transformer (dev and schnell in one folder).
  for (const char* t : {"transformer", "transformer_schnell"})
    if (folder.has_component(t) && (folder.component_class(t) == "FluxTransformer2DModel" ||
                                    folder.component_class(t) == "HiDreamImageTransformer2DModel"))
      out.push_back(t);
  if (folder.has_component("vae")) {
    out.push_back("vae_decoder");
    out.push_back("vae_encoder");
  }
  return out;
}

ExportResult export_onnx(const ExportRequest& r) {
  const auto dtype = precision_dtype(r.precision);
  if (r.output.empty()) throw InvalidArgument("ONNX export: no output file (-o FILE.onnx)");
  if (r.batch < 1 || r.batch > kMaxBatch)
    throw InvalidArgument("--batch " + std::to_string(r.batch) + ": expected 1 to " +
                          std::to_string(kMaxBatch));
  if (r.height < 0 || r.width < 0 || r.tokens < 0 || r.max_seq < 0)
    throw InvalidArgument("--height, --width, --tokens and --max-seq must be positive");
  // Refused before any loading: existing files (a rerun would otherwise replace them silently).
  for (const auto& p : {r.output, r.output + ".data"})
    if (!r.overwrite && std::filesystem::exists(p))
      throw IoError(p + " exists; choose another -o or pass --overwrite");
  const auto folder = io::ModelFolder::open(r.model_dir);
  if (const auto why = family_refusal(folder); !why.empty()) throw InvalidArgument(why);
  const auto components = exportable_components(r.model_dir);
  if (std::find(components.begin(), components.end(), r.component) == components.end()) {
    std::string list;
    for (const auto& c : components) list += (list.empty() ? "" : ", ") + c;
    throw InvalidArgument("--component " + r.component + ": " + r.model_dir + " exports " + list);
  }
  torch::NoGradGuard no_grad;
  OnnxGraph g(r.opset, dtype, r.component);
  ExportResult result;
  if (r.control_residuals && r.component != "unet")
    throw InvalidArgument(
        "--control-residuals: only the unet takes a ControlNet's residuals, not " + r.component);
  if (r.component == "unet")
    write_unet(r, folder, g, result);
  else if (r.component == "controlnet")
    write_controlnet(r, folder, g, result);
  else if (r.component.rfind("transformer", 0) == 0 && is_hidream(folder))
    write_hidream_transformer(r, folder, g, result);
  else if (r.component.rfind("transformer", 0) == 0)
    write_flux_transformer(r, folder, g, result);
  else if (r.component == "vae_decoder" || r.component == "vae_encoder")
    write_vae(r, folder, g, result, r.component == "vae_decoder");
  else if (folder.component_class(r.component) == "T5EncoderModel")
    write_t5_encoder(r, folder, g, result);
  else if (folder.component_class(r.component) == "LlamaForCausalLM")
    write_llama_encoder(r, folder, g, result);
  else
    write_text_encoder(r, folder, g, result);
  OnnxGraph::SaveOptions options;
  options.external_data = r.external_data;
  const auto saved = g.save(r.output, options);
  // An earlier export's weights beside a file that now holds its own.
  if (saved.data_path.empty()) std::filesystem::remove(r.output + ".data");
  result.model_path = saved.model_path;
  result.data_path = saved.data_path;
  result.model_bytes = saved.model_bytes;
  result.data_bytes = saved.data_bytes;
  result.weight_bytes = g.weight_bytes();
  result.op_counts = g.op_counts();
  return result;
}

}  // namespace diffuse::onnx_export
