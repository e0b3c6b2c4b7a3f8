// A C++ program outside the project on diffuse's torch-free C++ API (diffuse/engine.h), built
// against the installed package without LibTorch's headers: the same image as the C consumer.
// Usage: consumer_cpp MODEL OUT.png
#include <diffuse/engine.h>

#include <cstdio>

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: consumer_cpp MODEL OUT.png\n");
    return 2;
  }
  try {
    auto engine = diffuse::Engine::open(argv[1], "cpu", "fp32");
    diffuse::JobRequest r;
    r.prompt = "a red circle on the left and a blue square on the right on a yellow background";
    r.steps = 3;
    r.seed = 42;
    const auto result = engine.txt2img(r);
    diffuse::write_png(argv[2], result.image);
    std::printf("%s: %dx%d image in %.2f s\n", engine.family().c_str(), result.image.width,
                result.image.height, result.seconds);
  } catch (const diffuse::Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
