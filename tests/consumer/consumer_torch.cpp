// A C++ program outside the project on diffuse's LibTorch-facing API (diffuse/pipeline.h), built
// against the installed package with find_package(diffuse COMPONENTS torch): every installed
// header compiles here, and the image equals the C consumer's (the latents come back as a
// LibTorch tensor). Usage: consumer_torch MODEL OUT.png
#include <diffuse/cpu_share.h>
#include <diffuse/diffuse.h>
#include <diffuse/engine.h>
#include <diffuse/errors.h>
#include <diffuse/image.h>
#include <diffuse/pipeline.h>
#include <diffuse/timings.h>

#include <cstdio>

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: consumer_torch MODEL OUT.png\n");
    return 2;
  }
  try {
    diffuse::LoadOptions load;
    load.device = "cpu";
    load.dtype = "fp32";
    auto pipe = diffuse::Text2Image::load(argv[1], load);
    diffuse::GenerationConfig config;
    config.prompts = {
        "a red circle on the left and a blue square on the right on a yellow background"};
    config.steps = 3;
    config.seed = 42;
    const auto result = pipe.generate(config);
    diffuse::write_png(argv[2], result.images.at(0));
    const torch::Tensor& latents = result.latents;
    std::printf("pipeline.h: %dx%d image, latents %s\n", result.images[0].width,
                result.images[0].height, c10::str(latents.sizes()).c_str());
  } catch (const diffuse::Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
