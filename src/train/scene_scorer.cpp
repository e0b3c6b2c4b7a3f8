#include "train/scene_scorer.h"

#include <algorithm>
#include <array>

#include "diffuse/errors.h"

namespace diffuse::train {
namespace {

// Pixels further than this from every palette colour (RGB distance) belong to none: blends
// at anti-aliased edges and a generator's smudges.
constexpr int kMaxColourDistance = 70;

std::vector<int8_t> classify(const Image& image) {
  std::vector<int8_t> cls(static_cast<size_t>(image.width) * image.height, -1);
  for (size_t i = 0; i < cls.size(); ++i) {
    const uint8_t* p = &image.rgb[i * 3];
    int best = -1, best_d = kMaxColourDistance * kMaxColourDistance + 1;
    for (int c = 0; c < kNumColours; ++c) {
      const Rgb q = colour_rgb(static_cast<Colour>(c));
      const int dr = p[0] - q.r, dg = p[1] - q.g, db = p[2] - q.b;
      const int d = dr * dr + dg * dg + db * db;
      if (d < best_d) {
        best_d = d;
        best = c;
      }
    }
    cls[i] = static_cast<int8_t>(best);
  }
  return cls;
}

struct Box {
  int x0, y0, x1, y1;  // half-open
  bool contains(double x, double y) const { return x >= x0 && x < x1 && y >= y0 && y < y1; }
};

Box region_box(Region r, int w, int h) {
  switch (r) {
    case Region::kLeft:
      return {0, 0, w / 2, h};
    case Region::kRight:
      return {w / 2, 0, w, h};
    case Region::kTop:
      return {0, 0, w, h / 2};
    case Region::kBottom:
      return {0, h / 2, w, h};
    case Region::kCenter:
      return {w / 3, h / 3, w - w / 3, h - h / 3};
  }
  return {0, 0, w, h};
}

// Value at fraction q of the sorted values.
int quantile(std::vector<int>& v, double q) {
  const size_t k = std::min(v.size() - 1, static_cast<size_t>(q * static_cast<double>(v.size())));
  std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(k), v.end());
  return v[k];
}

// The shape of the blob of pixels (xs, ys): a triangle (apex up) has about a quarter of its
// area in the upper half of its bounding box, a circle and a square half; a square fills its
// box, a circle pi/4 of it.
std::string blob_shape(std::vector<int> xs, std::vector<int> ys) {
  if (xs.size() < 16) return "none";
  const int x0 = quantile(xs, 0.01), x1 = quantile(xs, 0.99);
  const int y0 = quantile(ys, 0.01), y1 = quantile(ys, 0.99);
  const double bw = x1 - x0 + 1, bh = y1 - y0 + 1;
  double inside = 0, upper = 0;
  const double ymid = (y0 + y1 + 1) / 2.0;
  for (size_t i = 0; i < xs.size(); ++i) {
    if (xs[i] < x0 || xs[i] > x1 || ys[i] < y0 || ys[i] > y1) continue;
    inside += 1;
    if (ys[i] + 0.5 < ymid) upper += 1;
  }
  const double fill = inside / (bw * bh);
  const double upper_share = upper / std::max(1.0, inside);
  if (upper_share < 0.38) return "triangle";
  return fill >= 0.89 ? "square" : "circle";
}

}  // namespace

bool SceneScore::all() const {
  if (!background || !nothing_else) return false;
  for (const auto& o : objects)
    if (!o.colour_position || !o.shape) return false;
  return true;
}

SceneScore score_scene(const Image& image, const SceneSpec& spec) {
  const int w = image.width, h = image.height;
  if (w < 8 || h < 8 || image.rgb.size() != static_cast<size_t>(w) * h * 3)
    throw InvalidArgument("score_scene: image must be RGB and at least 8x8, got " +
                          std::to_string(w) + "x" + std::to_string(h));
  const auto cls = classify(image);
  SceneScore score;

  // Background: the majority colour of a frame of border pixels.
  const int frame = std::max(1, w / 32);
  std::array<int, kNumColours> votes{};
  for (int y = 0; y < h; ++y)
    for (int x = 0; x < w; ++x) {
      const bool border = x < frame || y < frame || x >= w - frame || y >= h - frame;
      const int c = cls[static_cast<size_t>(y) * w + x];
      if (border && c >= 0) ++votes[c];
    }
  const int bg = static_cast<int>(std::max_element(votes.begin(), votes.end()) - votes.begin());
  score.detected_background = votes[bg] > 0 ? colour_name(static_cast<Colour>(bg)) : "none";
  score.background = votes[bg] > 0 && bg == static_cast<int>(spec.background);

  // The smallest object of the world (a triangle of base and height 25 % of the width)
  // covers 3.1 % of the image; a third of that must show in the region.
  const double min_pixels = 0.3 * 0.5 * kMinObjectSize * kMinObjectSize * w * h;
  for (size_t i = 0; i < spec.objects.size(); ++i) {
    const auto& o = spec.objects[i];
    const int colour = static_cast<int>(o.colour);
    bool shared = false;
    for (size_t j = 0; j < spec.objects.size(); ++j)
      shared |= j != i && spec.objects[j].colour == o.colour;
    const Box box = region_box(o.region, w, h);
    // The pixels that belong to this object: its colour anywhere, or only in its half when the
    // other object has the same colour.
    const Box search = shared ? box : Box{0, 0, w, h};
    std::vector<int> xs, ys;
    double in_region = 0, sx = 0, sy = 0;
    for (int y = search.y0; y < search.y1; ++y)
      for (int x = search.x0; x < search.x1; ++x) {
        if (cls[static_cast<size_t>(y) * w + x] != colour) continue;
        xs.push_back(x);
        ys.push_back(y);
        sx += x + 0.5;
        sy += y + 0.5;
        if (box.contains(x, y)) in_region += 1;
      }
    ObjectScore os;
    const double n = static_cast<double>(xs.size());
    const bool centred = n > 0 && box.contains(sx / n, sy / n);
    os.colour_position = in_region >= min_pixels && centred;
    os.detected_shape = blob_shape(xs, ys);
    os.shape = os.colour_position && os.detected_shape == shape_name(o.shape);
    score.objects.push_back(os);
  }

  // Stray colour: interior pixels (all four neighbours alike, so anti-aliased edges, whose
  // blends may land near a third palette colour, do not count) of a colour nobody named.
  std::array<bool, kNumColours> named{};
  named[static_cast<size_t>(spec.background)] = true;
  for (const auto& o : spec.objects) named[static_cast<size_t>(o.colour)] = true;
  double stray = 0;
  for (int y = 1; y + 1 < h; ++y)
    for (int x = 1; x + 1 < w; ++x) {
      const size_t i = static_cast<size_t>(y) * w + x;
      const int c = cls[i];
      if (c < 0 || named[static_cast<size_t>(c)]) continue;
      if (cls[i - 1] == c && cls[i + 1] == c && cls[i - w] == c && cls[i + w] == c) stray += 1;
    }
  score.nothing_else = stray < min_pixels;
  return score;
}

void QualityTally::add(const SceneScore& s) {
  ++images;
  background_ok += s.background;
  for (const auto& o : s.objects) {
    ++objects;
    colour_position_ok += o.colour_position;
    shape_ok += o.shape;
  }
}

double QualityTally::background_accuracy() const {
  return images ? static_cast<double>(background_ok) / images : 0;
}
double QualityTally::colour_position_accuracy() const {
  return objects ? static_cast<double>(colour_position_ok) / objects : 0;
}
double QualityTally::shape_accuracy() const {
  return objects ? static_cast<double>(shape_ok) / objects : 0;
}

}  // namespace diffuse::train
