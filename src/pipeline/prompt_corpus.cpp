#include "pipeline/prompt_corpus.h"

#include <iterator>

namespace diffuse::pipeline {
namespace {

// Text the demo tokenizer learns its merges from: the kind of words prompts are made of.
const char* const kCorpus[] = {
    "a photograph of an astronaut riding a horse on the moon",
    "a watercolor painting of a fox in the snow",
    "a cozy cabin in the mountains at sunset, warm light in the windows",
    "portrait of an old sailor with a grey beard, oil painting, dramatic lighting",
    "a bowl of ramen with a soft boiled egg, studio photo, shallow depth of field",
    "a futuristic city at night with neon signs and flying cars, cinematic",
    "a red sports car parked on a wet street, reflections, high detail",
    "an ancient castle on a misty hill at sunrise, volumetric light",
    "a cat sleeping on a stack of books next to a window, soft morning light",
    "a lighthouse on a rocky coast during a storm, crashing waves",
    "a field of sunflowers under a blue sky with white clouds",
    "a dragon flying over a medieval village, fantasy art, highly detailed",
    "a close up photo of a hummingbird drinking from a flower",
    "a minimalist living room with large windows and plants, interior design",
    "a forest path in autumn with orange and yellow leaves",
    "a robot playing chess in a park, digital art",
    "a plate of pancakes with blueberries and maple syrup, food photography",
    "a snowy mountain peak reflected in a calm lake, landscape photography",
    "an underwater scene with coral reefs and tropical fish, vibrant colors",
    "a steampunk airship above the clouds, intricate brass details",
    "a black and white photo of a busy train station in the rain",
    "a golden retriever puppy running through a meadow, sharp focus",
    "a bustling market street in marrakech, colorful fabrics and spices",
    "a desert landscape with sand dunes and a starry night sky, milky way",
    "a still life of apples, pears and grapes on a wooden table, renaissance style",
    "a small wooden boat on a river in a green valley, peaceful, morning fog",
    "a knight in shining armor holding a sword, concept art, trending on artstation",
    "a tiny house made of mushrooms in an enchanted forest, whimsical illustration",
    "a vintage poster of a beach resort, bold colors, art deco",
    "an astronaut floating in space with the earth in the background, realistic",
    "blurry, low quality, ugly, deformed, watermark, text, signature, bad anatomy",
    "best quality, masterpiece, ultra realistic, 8k resolution, sharp, detailed",
};

}  // namespace

const std::vector<std::string>& demo_prompt_corpus() {
  static const std::vector<std::string> corpus(std::begin(kCorpus), std::end(kCorpus));
  return corpus;
}

}  // namespace diffuse::pipeline
