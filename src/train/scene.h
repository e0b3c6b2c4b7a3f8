// The demo model's world: one or two flat shapes (circle, square, triangle) in one of eight
// colours on a plain background of another colour, described by a caption built from the same
// description. Scenes are sampled, captioned, rendered (anti-aliased) and parsed back from a
// caption here, so the trainer, the scorer and the tests share one definition of the world.
#pragma once
#include <array>
#include <cstdint>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "diffuse/image.h"

namespace diffuse::train {

enum class Shape { kCircle, kSquare, kTriangle };
enum class Colour { kRed, kGreen, kBlue, kYellow, kWhite, kBlack, kOrange, kPurple };
// Where an object's centre lies: a half of the image, or the middle third in both axes.
enum class Region { kLeft, kRight, kTop, kBottom, kCenter };
// Size words of captions: small (25-31 % of the width), large (39-45 %), or no word.
enum class SizeWord { kNone, kSmall, kLarge };

constexpr int kNumColours = 8;
constexpr int kNumShapes = 3;

struct Rgb {
  uint8_t r, g, b;
};

// The exact sRGB values of the world's colours.
Rgb colour_rgb(Colour c);
const char* colour_name(Colour c);
const char* shape_name(Shape s);
const char* region_phrase(Region r);  // "on the left", "in the center", ...

// Size of an object, as a fraction of the image width.
constexpr double kMinObjectSize = 0.25;
constexpr double kMaxObjectSize = 0.45;
constexpr double kSmallBelow = 0.31;  // "small" objects are smaller than this
constexpr double kLargeAbove = 0.39;  // "large" objects are larger than this

struct SceneObject {
  Shape shape = Shape::kCircle;
  Colour colour = Colour::kRed;
  Region region = Region::kCenter;
  double size = 0.3;          // circle diameter / square side / triangle base and height, in widths
  double cx = 0.5, cy = 0.5;  // centre, in fractions of the width and height
};

struct Scene {
  Colour background = Colour::kWhite;
  std::vector<SceneObject> objects;  // one or two
};

// What a caption asks for: the scene minus what captions do not say (exact sizes and places).
struct SceneSpec {
  struct Object {
    Shape shape;
    Colour colour;
    Region region;
    SizeWord size = SizeWord::kNone;
  };
  Colour background;
  std::vector<Object> objects;
};

// A random scene of the world (two objects in half of the cases, each in its own half).
Scene sample_scene(std::mt19937_64& rng);

// A random scene that satisfies `spec` (sizes and places drawn within what the words allow).
Scene sample_scene(const SceneSpec& spec, std::mt19937_64& rng);

// Places the centre of an object of o.size so that it lies inside the image and its centre in
// o.region. With `alone` false the object fits entirely in its half (two-object scenes).
void place_object(SceneObject& o, bool alone, std::mt19937_64& rng);

// The caption of a scene. Size words are optional (`rng` decides whether to say them), so
// the model learns that an unsized caption allows any size.
std::string caption(const Scene& scene, std::mt19937_64& rng);
// One object as captions name it, with its article and size word: "an orange circle",
// "a small red square".
std::string object_words(const SceneSpec::Object& object);
// The caption with every applicable size word, deterministically.
std::string caption(const SceneSpec& spec);
SceneSpec spec_of(const Scene& scene, bool with_size_words);

// Parses a caption of this world: case and spacing are free, a trailing period is allowed,
// "a"/"an" both work. Returns nullopt (and the reason in *why) for anything else.
std::optional<SceneSpec> parse_caption(const std::string& text, std::string* why = nullptr);

// Prompts kept out of training (captions without size words, drawn with a fixed seed), so
// the demo model's quality is measured on prompts it never saw verbatim.
std::vector<std::string> held_out_prompts(int n = 50);

// Renders the scene at width x height with 4x4 supersampling per pixel.
Image render_scene(const Scene& scene, int width, int height);

}  // namespace diffuse::train
