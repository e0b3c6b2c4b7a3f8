#include "train/scene.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <sstream>

namespace diffuse::train {
namespace {

constexpr Rgb kPalette[kNumColours] = {{220, 40, 40},  {40, 170, 60},   {40, 80, 220},
                                       {240, 210, 40}, {245, 245, 245}, {20, 20, 20},
                                       {245, 140, 30}, {140, 60, 190}};
constexpr const char* kColourNames[kNumColours] = {"red",   "green", "blue",   "yellow",
                                                   "white", "black", "orange", "purple"};
constexpr const char* kShapeNames[kNumShapes] = {"circle", "square", "triangle"};

constexpr double kMargin = 0.02;  // gap between an object and the image border, in widths

double uniform(std::mt19937_64& rng, double lo, double hi) {
  // Not std::uniform_real_distribution: its output is implementation-defined, and scenes
  // must be the same for a seed with every standard library.
  const double u = static_cast<double>(rng() >> 11) * (1.0 / 9007199254740992.0);
  return lo + (hi - lo) * u;
}

int uniform_int(std::mt19937_64& rng, int n) {
  return static_cast<int>(rng() % static_cast<uint64_t>(n));
}

double size_for(SizeWord w, std::mt19937_64& rng) {
  switch (w) {
    case SizeWord::kSmall:
      return uniform(rng, kMinObjectSize, kSmallBelow);
    case SizeWord::kLarge:
      return uniform(rng, kLargeAbove, kMaxObjectSize);
    case SizeWord::kNone:
      break;
  }
  return uniform(rng, kMinObjectSize, kMaxObjectSize);
}

SizeWord size_word(double size) {
  if (size < kSmallBelow) return SizeWord::kSmall;
  if (size > kLargeAbove) return SizeWord::kLarge;
  return SizeWord::kNone;
}

// Places the centre of an object of `size` (in widths; the image is taken as square) so that
// it lies inside the image and its centre inside `region`. With `alone` false the object must
// fit entirely in its half, since the other half holds the second object.
}  // namespace

void place_object(SceneObject& o, bool alone, std::mt19937_64& rng) {
  const double h = o.size / 2;
  const double lo = h + kMargin, hi = 1 - h - kMargin;
  auto along_free = [&]() { return uniform(rng, lo, hi); };
  // Centre range along the axis that the region constrains, for the first half.
  const double first_hi = alone ? 0.45 : 0.5 - h - 0.01;
  switch (o.region) {
    case Region::kLeft:
      o.cx = uniform(rng, lo, first_hi);
      o.cy = along_free();
      break;
    case Region::kRight:
      o.cx = 1 - uniform(rng, lo, first_hi);
      o.cy = along_free();
      break;
    case Region::kTop:
      o.cy = uniform(rng, lo, first_hi);
      o.cx = along_free();
      break;
    case Region::kBottom:
      o.cy = 1 - uniform(rng, lo, first_hi);
      o.cx = along_free();
      break;
    case Region::kCenter:
      o.cx = uniform(rng, 0.4, 0.6);
      o.cy = uniform(rng, 0.4, 0.6);
      break;
  }
}

namespace {

Colour random_background(const std::vector<SceneObject>& objects, std::mt19937_64& rng) {
  std::vector<Colour> allowed;
  for (int c = 0; c < kNumColours; ++c) {
    bool used = false;
    for (const auto& o : objects) used |= static_cast<int>(o.colour) == c;
    if (!used) allowed.push_back(static_cast<Colour>(c));
  }
  return allowed[uniform_int(rng, static_cast<int>(allowed.size()))];
}

// Coverage test of one sample point (in pixels) against an object.
bool covers(const SceneObject& o, double px, double py, double width, double height) {
  const double s = o.size * width, cx = o.cx * width, cy = o.cy * height;
  const double dx = px - cx, dy = py - cy;
  switch (o.shape) {
    case Shape::kCircle:
      return dx * dx + dy * dy <= 0.25 * s * s;
    case Shape::kSquare:
      return std::abs(dx) <= s / 2 && std::abs(dy) <= s / 2;
    case Shape::kTriangle: {
      // Apex up, base at the bottom; base width and height both s.
      const double from_top = dy + s / 2;
      if (from_top < 0 || from_top > s) return false;
      return std::abs(dx) <= from_top / 2;
    }
  }
  return false;
}

std::string normalise(const std::string& text) {
  std::string out;
  bool space = false;
  for (unsigned char ch : text) {
    if (std::isspace(ch)) {
      space = !out.empty();
      continue;
    }
    if (space) out += ' ';
    space = false;
    out += static_cast<char>(std::tolower(ch));
  }
  if (!out.empty() && out.back() == '.') out.pop_back();
  while (!out.empty() && out.back() == ' ') out.pop_back();
  return out;
}

// Recursive-descent reader over the caption's words.
class CaptionReader {
 public:
  explicit CaptionReader(const std::string& text) {
    std::istringstream in(text);
    for (std::string w; in >> w;) words_.push_back(w);
  }

  std::optional<SceneSpec> read(std::string& why) {
    SceneSpec spec;
    auto first = object(why);
    if (!first) return std::nullopt;
    auto region = region_phrase(why);
    if (!region) return std::nullopt;
    first->region = *region;
    spec.objects.push_back(*first);
    if (accept("and")) {
      auto second = object(why);
      if (!second) return std::nullopt;
      auto region2 = region_phrase(why);
      if (!region2) return std::nullopt;
      second->region = *region2;
      const bool left_right = *region == Region::kLeft && *region2 == Region::kRight;
      const bool top_bottom = *region == Region::kTop && *region2 == Region::kBottom;
      if (!left_right && !top_bottom) {
        why =
            "two objects must be 'X on the left and Y on the right' or 'X at the top and Y at "
            "the bottom'";
        return std::nullopt;
      }
      spec.objects.push_back(*second);
    }
    if (!(accept("on") && (accept("a") || accept("an"))))
      return fail(why, "'on a <colour> background'");
    auto bg = colour();
    if (!bg) return fail(why, "a background colour");
    if (!accept("background")) return fail(why, "'background'");
    if (pos_ != words_.size()) return fail(why, "the end of the caption");
    spec.background = *bg;
    for (const auto& o : spec.objects)
      if (o.colour == spec.background) {
        why = std::string("the background cannot have an object's colour (") +
              colour_name(o.colour) + ")";
        return std::nullopt;
      }
    return spec;
  }

 private:
  std::optional<SceneSpec> fail(std::string& why, const std::string& expected) {
    why = "expected " + expected + " at word " + std::to_string(pos_ + 1) +
          (pos_ < words_.size() ? " ('" + words_[pos_] + "')" : " (end of caption)");
    return std::nullopt;
  }

  bool accept(const char* word) {
    if (pos_ < words_.size() && words_[pos_] == word) {
      ++pos_;
      return true;
    }
    return false;
  }

  std::optional<Colour> colour() {
    for (int c = 0; c < kNumColours; ++c)
      if (accept(kColourNames[c])) return static_cast<Colour>(c);
    return std::nullopt;
  }

  std::optional<SceneSpec::Object> object(std::string& why) {
    if (!(accept("a") || accept("an"))) {
      fail(why, "'a' or 'an'");
      return std::nullopt;
    }
    SceneSpec::Object o{};
    if (accept("small"))
      o.size = SizeWord::kSmall;
    else if (accept("large"))
      o.size = SizeWord::kLarge;
    auto c = colour();
    if (!c) {
      fail(why, "a colour (red, green, blue, yellow, white, black, orange, purple)");
      return std::nullopt;
    }
    o.colour = *c;
    bool found = false;
    for (int s = 0; s < kNumShapes && !found; ++s)
      if (accept(kShapeNames[s])) {
        o.shape = static_cast<Shape>(s);
        found = true;
      }
    if (!found) {
      fail(why, "a shape (circle, square, triangle)");
      return std::nullopt;
    }
    return o;
  }

  std::optional<Region> region_phrase(std::string& why) {
    const size_t start = pos_;
    if (accept("on") && accept("the")) {
      if (accept("left")) return Region::kLeft;
      if (accept("right")) return Region::kRight;
    }
    pos_ = start;
    if (accept("at") && accept("the")) {
      if (accept("top")) return Region::kTop;
      if (accept("bottom")) return Region::kBottom;
    }
    pos_ = start;
    if (accept("in") && accept("the") && (accept("center") || accept("centre")))
      return Region::kCenter;
    pos_ = start;
    fail(why, "a position (on the left/right, at the top/bottom, in the center)");
    return std::nullopt;
  }

  std::vector<std::string> words_;
  size_t pos_ = 0;
};

}  // namespace

std::string object_words(const SceneSpec::Object& o) {
  std::string words = "a ";
  if (o.size == SizeWord::kSmall)
    words += "small ";
  else if (o.size == SizeWord::kLarge)
    words += "large ";
  else if (o.colour == Colour::kOrange)
    words = "an ";
  return words + colour_name(o.colour) + " " + shape_name(o.shape);
}

Rgb colour_rgb(Colour c) {
  return kPalette[static_cast<int>(c)];
}
const char* colour_name(Colour c) {
  return kColourNames[static_cast<int>(c)];
}
const char* shape_name(Shape s) {
  return kShapeNames[static_cast<int>(s)];
}
const char* region_phrase(Region r) {
  switch (r) {
    case Region::kLeft:
      return "on the left";
    case Region::kRight:
      return "on the right";
    case Region::kTop:
      return "at the top";
    case Region::kBottom:
      return "at the bottom";
    case Region::kCenter:
      return "in the center";
  }
  return "";
}

Scene sample_scene(std::mt19937_64& rng) {
  SceneSpec spec;
  const bool two = uniform_int(rng, 2) == 1;
  const Region singles[] = {Region::kLeft, Region::kRight, Region::kTop, Region::kBottom,
                            Region::kCenter};
  std::vector<Region> regions;
  if (two) {
    regions = uniform_int(rng, 2) ? std::vector<Region>{Region::kLeft, Region::kRight}
                                  : std::vector<Region>{Region::kTop, Region::kBottom};
  } else {
    regions = {singles[uniform_int(rng, 5)]};
  }
  for (Region r : regions)
    spec.objects.push_back({static_cast<Shape>(uniform_int(rng, kNumShapes)),
                            static_cast<Colour>(uniform_int(rng, kNumColours)), r,
                            SizeWord::kNone});
  Scene scene = sample_scene(spec, rng);
  scene.background = random_background(scene.objects, rng);
  return scene;
}

Scene sample_scene(const SceneSpec& spec, std::mt19937_64& rng) {
  Scene scene;
  scene.background = spec.background;
  for (const auto& so : spec.objects) {
    SceneObject o;
    o.shape = so.shape;
    o.colour = so.colour;
    o.region = so.region;
    o.size = size_for(so.size, rng);
    place_object(o, spec.objects.size() == 1, rng);
    scene.objects.push_back(o);
  }
  return scene;
}

SceneSpec spec_of(const Scene& scene, bool with_size_words) {
  SceneSpec spec;
  spec.background = scene.background;
  for (const auto& o : scene.objects)
    spec.objects.push_back(
        {o.shape, o.colour, o.region, with_size_words ? size_word(o.size) : SizeWord::kNone});
  return spec;
}

std::string caption(const SceneSpec& spec) {
  std::string text;
  for (size_t i = 0; i < spec.objects.size(); ++i) {
    if (i) text += " and ";
    text += object_words(spec.objects[i]) + " " + region_phrase(spec.objects[i].region);
  }
  const Colour bg = spec.background;
  return text + (bg == Colour::kOrange ? " on an " : " on a ") + colour_name(bg) + " background";
}

std::string caption(const Scene& scene, std::mt19937_64& rng) {
  SceneSpec spec = spec_of(scene, true);
  for (auto& o : spec.objects)
    if (o.size != SizeWord::kNone && uniform_int(rng, 3) == 0) o.size = SizeWord::kNone;
  return caption(spec);
}

std::optional<SceneSpec> parse_caption(const std::string& text, std::string* why) {
  std::string reason;
  auto spec = CaptionReader(normalise(text)).read(reason);
  if (!spec && why) *why = reason;
  return spec;
}

std::vector<std::string> held_out_prompts(int n) {
  std::mt19937_64 rng(0x5EED0F7E57ull);
  std::vector<std::string> prompts;
  while (static_cast<int>(prompts.size()) < n) {
    std::string p = caption(spec_of(sample_scene(rng), false));
    if (std::find(prompts.begin(), prompts.end(), p) == prompts.end()) prompts.push_back(p);
  }
  return prompts;
}

Image render_scene(const Scene& scene, int width, int height) {
  Image img;
  img.width = width;
  img.height = height;
  img.rgb.resize(static_cast<size_t>(width) * height * 3);
  constexpr int kSub = 4;
  const Rgb bg = colour_rgb(scene.background);
  for (int y = 0; y < height; ++y)
    for (int x = 0; x < width; ++x) {
      double acc[3] = {0, 0, 0};
      for (int sy = 0; sy < kSub; ++sy)
        for (int sx = 0; sx < kSub; ++sx) {
          const double px = x + (sx + 0.5) / kSub, py = y + (sy + 0.5) / kSub;
          Rgb c = bg;
          for (const auto& o : scene.objects)
            if (covers(o, px, py, width, height)) c = colour_rgb(o.colour);
          acc[0] += c.r;
          acc[1] += c.g;
          acc[2] += c.b;
        }
      uint8_t* p = &img.rgb[(static_cast<size_t>(y) * width + x) * 3];
      for (int k = 0; k < 3; ++k) p[k] = static_cast<uint8_t>(std::lround(acc[k] / (kSub * kSub)));
    }
  return img;
}

}  // namespace diffuse::train
