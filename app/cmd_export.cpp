// `diffuse export onnx`: one component of a Stable Diffusion folder as an ONNX file (for ONNX
// Runtime, TensorRT, or Ascend's ATC -> offline OM models; docs/ascend.md).
#include <cstdio>

#include "commands.h"
#include "diffuse/errors.h"
#include "export/onnx_export.h"

namespace diffuse::app {

Command add_export_command(CLI::App& app) {
  app.require_subcommand(1);
  auto* onnx = app.add_subcommand("onnx", "Write a component as a standard ONNX file");
  auto r = std::make_shared<onnx_export::ExportRequest>();
  auto list = std::make_shared<bool>(false);
  onnx->add_option("-m,--model", r->model_dir, "A diffusers folder")->required();
  onnx->add_option("--component", r->component,
                   "text_encoder, text_encoder_2, unet, controlnet, vae_decoder, vae_encoder or "
                   "transformer (--list: what this folder has)");
  onnx->add_flag("--list", *list, "Print the components this folder exports and exit");
  onnx->add_option("-o,--out", r->output,
                   "The .onnx file to write (weights past 2 GiB go to "
                   "FILE.onnx.data beside it)");
  onnx->add_option("--opset", r->opset, "ONNX opset, 13 to 17 (ATC: see docs/ascend.md)")
      ->capture_default_str();
  onnx->add_option("--precision", r->precision, "fp32 or fp16 weights and activations")
      ->capture_default_str();
  onnx->add_option("--batch", r->batch, "Static batch size (2 for CFG in one call)")
      ->capture_default_str();
  onnx->add_option("--height", r->height,
                   "Image height in pixels (default: the UNet's sample_size x the VAE factor)");
  onnx->add_option("--width", r->width, "Image width in pixels (default as --height)");
  onnx->add_option("--tokens", r->tokens,
                   "Text length (default: the text encoder's positions, 77)");
  onnx->add_option("--max-seq", r->max_seq,
                   "HiDream: image tokens a non-square latent is padded to (default: the "
                   "config's; HiDream-E1's side-by-side input: its own token count)");
  onnx->add_flag("--dynamic", r->dynamic,
                 "Symbolic batch, sizes and sequence instead of static shapes");
  onnx->add_flag("--control-residuals", r->control_residuals,
                 "unet: also take a ControlNet's residuals as inputs "
                 "(down_block_additional_residuals.N, mid_block_additional_residual)");
  onnx->add_flag("--external-data", r->external_data,
                 "Weights in FILE.onnx.data even when the file would hold them");
  onnx->add_flag("--overwrite", r->overwrite, "Replace existing output files");
  return [r, list, onnx]() {
    if (*list) {
      for (const auto& c : onnx_export::exportable_components(r->model_dir))
        std::printf("%s\n", c.c_str());
      return 0;
    }
    if (r->component.empty()) throw InvalidArgument("--component is required (or --list)");
    if (r->output.empty()) throw InvalidArgument("-o FILE.onnx is required");
    const auto res = onnx_export::export_onnx(*r);
    std::printf("wrote %s (%.1f MB", res.model_path.c_str(), res.model_bytes / 1e6);
    if (!res.data_path.empty())
      std::printf(", weights in %s, %.1f MB", res.data_path.c_str(), res.data_bytes / 1e6);
    std::printf("), opset %d, %s\n", r->opset, r->precision.c_str());
    for (const auto& in : res.inputs) std::printf("  input  %s\n", in.describe().c_str());
    for (const auto& out : res.outputs) std::printf("  output %s\n", out.describe().c_str());
    std::printf("  ops:");
    for (const auto& [op, n] : res.op_counts)
      std::printf(" %s x%lld", op.c_str(), static_cast<long long>(n));
    std::printf("\n");
    return 0;
  };
}

}  // namespace diffuse::app
