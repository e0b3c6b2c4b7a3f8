#include "train/scene_edit.h"

#include <algorithm>
#include <iterator>
#include <sstream>

#include "diffuse/errors.h"

namespace diffuse::train {
namespace {

// The gap two objects keep from the middle line in a two-object scene (scene.cpp's layout).
constexpr double kHalfGap = 0.01;

int pick(std::mt19937_64& rng, int n) {
  return static_cast<int>(rng() % static_cast<uint64_t>(n));
}

template <typename T>
const T& pick(std::mt19937_64& rng, const std::vector<T>& options) {
  return options[pick(rng, static_cast<int>(options.size()))];
}

// Replaces every "{key}" in `text`.
std::string fill(std::string text, const std::vector<std::pair<std::string, std::string>>& keys) {
  for (const auto& [key, value] : keys)
    for (size_t at; (at = text.find("{" + key + "}")) != std::string::npos;)
      text.replace(at, key.size() + 2, value);
  return text;
}

const char* position_word(Region r) {
  switch (r) {
    case Region::kLeft:
      return "left";
    case Region::kRight:
      return "right";
    case Region::kTop:
      return "top";
    case Region::kBottom:
      return "bottom";
    case Region::kCenter:
      return "center";
  }
  return "";
}

Region opposite(Region r) {
  switch (r) {
    case Region::kLeft:
      return Region::kRight;
    case Region::kRight:
      return Region::kLeft;
    case Region::kTop:
      return Region::kBottom;
    case Region::kBottom:
      return Region::kTop;
    case Region::kCenter:
      break;
  }
  return Region::kCenter;
}

// Names object i of the scene so that no other object fits the words.
std::string reference(const Scene& scene, size_t i, std::mt19937_64& rng) {
  const auto& o = scene.objects[i];
  bool shape_unique = true, colour_shape_unique = true;
  for (size_t j = 0; j < scene.objects.size(); ++j) {
    if (j == i) continue;
    const auto& other = scene.objects[j];
    shape_unique = shape_unique && other.shape != o.shape;
    colour_shape_unique =
        colour_shape_unique && !(other.shape == o.shape && other.colour == o.colour);
  }
  std::vector<std::string> names;
  if (shape_unique) names.push_back(shape_name(o.shape));
  if (colour_shape_unique)
    names.push_back(std::string(colour_name(o.colour)) + " " + shape_name(o.shape));
  if (scene.objects.size() > 1 || names.empty())
    names.push_back(std::string(shape_name(o.shape)) + " " + region_phrase(o.region));
  return pick(rng, names);
}

Colour other_colour(std::mt19937_64& rng, const std::vector<Colour>& excluded) {
  std::vector<Colour> allowed;
  for (int c = 0; c < kNumColours; ++c)
    if (std::find(excluded.begin(), excluded.end(), static_cast<Colour>(c)) == excluded.end())
      allowed.push_back(static_cast<Colour>(c));
  return pick(rng, allowed);
}

std::vector<Colour> object_colours(const Scene& s) {
  std::vector<Colour> cs;
  for (const auto& o : s.objects) cs.push_back(o.colour);
  return cs;
}

// A lone object on one side that leaves the other half free for a second object.
bool fits_in_half(const SceneObject& o) {
  const double h = o.size / 2;
  switch (o.region) {
    case Region::kLeft:
      return o.cx + h <= 0.5 - kHalfGap;
    case Region::kRight:
      return o.cx - h >= 0.5 + kHalfGap;
    case Region::kTop:
      return o.cy + h <= 0.5 - kHalfGap;
    case Region::kBottom:
      return o.cy - h >= 0.5 + kHalfGap;
    case Region::kCenter:
      break;
  }
  return false;
}

}  // namespace

const char* edit_kind_name(EditKind kind) {
  switch (kind) {
    case EditKind::kBackground:
      return "background";
    case EditKind::kRecolour:
      return "recolour";
    case EditKind::kMove:
      return "move";
    case EditKind::kReshape:
      return "reshape";
    case EditKind::kRemove:
      return "remove";
    case EditKind::kAdd:
      return "add";
  }
  return "";
}

bool edit_applies(EditKind kind, const Scene& scene) {
  const size_t n = scene.objects.size();
  switch (kind) {
    case EditKind::kBackground:
    case EditKind::kRecolour:
    case EditKind::kReshape:
      return n >= 1;
    case EditKind::kMove:
      return n == 1;
    case EditKind::kRemove:
      return n == 2;
    case EditKind::kAdd:
      return n == 1 && fits_in_half(scene.objects[0]);
  }
  return false;
}

SceneEdit make_edit(EditKind kind, const Scene& source, std::mt19937_64& rng) {
  if (!edit_applies(kind, source))
    throw InvalidArgument(std::string("a '") + edit_kind_name(kind) +
                          "' edit does not apply to a scene with " +
                          std::to_string(source.objects.size()) + " object(s)");
  SceneEdit e;
  e.kind = kind;
  e.source = source;
  e.target = source;
  const size_t i = static_cast<size_t>(pick(rng, static_cast<int>(source.objects.size())));
  auto& object = e.target.objects[i];
  const std::string ref = reference(source, i, rng);
  switch (kind) {
    case EditKind::kBackground: {
      auto excluded = object_colours(source);
      excluded.push_back(source.background);
      e.target.background = other_colour(rng, excluded);
      e.instruction = fill(
          pick(rng,
               std::vector<std::string>{"make the background {c}", "change the background to {c}",
                                        "turn the background {c}", "paint the background {c}",
                                        "set the background to {c}", "give it a {c} background"}),
          {{"c", colour_name(e.target.background)}});
      break;
    }
    case EditKind::kRecolour: {
      object.colour = other_colour(rng, {object.colour, source.background});
      e.instruction =
          fill(pick(rng, std::vector<std::string>{"make the {o} {c}", "change the {o} to {c}",
                                                  "turn the {o} {c}", "paint the {o} {c}",
                                                  "color the {o} {c}"}),
               {{"o", ref}, {"c", colour_name(object.colour)}});
      break;
    }
    case EditKind::kMove: {
      std::vector<Region> regions;
      for (Region r :
           {Region::kLeft, Region::kRight, Region::kTop, Region::kBottom, Region::kCenter})
        if (r != object.region) regions.push_back(r);
      object.region = pick(rng, regions);
      place_object(object, /*alone=*/true, rng);
      e.instruction = fill(
          pick(rng, std::vector<std::string>{"move the {o} to the {p}", "put the {o} {r}",
                                             "shift the {o} to the {p}", "move the {o} {r}"}),
          {{"o", ref}, {"p", position_word(object.region)}, {"r", region_phrase(object.region)}});
      break;
    }
    case EditKind::kReshape: {
      std::vector<Shape> shapes;
      for (int s = 0; s < kNumShapes; ++s)
        if (static_cast<Shape>(s) != object.shape) shapes.push_back(static_cast<Shape>(s));
      object.shape = pick(rng, shapes);
      e.instruction = fill(
          pick(rng, std::vector<std::string>{"turn the {o} into a {s}", "change the {o} into a {s}",
                                             "make the {o} a {s}", "replace the {o} with a {s}"}),
          {{"o", ref}, {"s", shape_name(object.shape)}});
      break;
    }
    case EditKind::kRemove: {
      e.target.objects.erase(e.target.objects.begin() + static_cast<std::ptrdiff_t>(i));
      e.instruction = fill(pick(rng, std::vector<std::string>{"remove the {o}", "delete the {o}",
                                                              "take away the {o}", "erase the {o}",
                                                              "get rid of the {o}"}),
                           {{"o", ref}});
      break;
    }
    case EditKind::kAdd: {
      SceneObject added;
      added.shape = static_cast<Shape>(pick(rng, kNumShapes));
      added.colour = other_colour(rng, {source.background});
      added.region = opposite(source.objects[0].region);
      const double u = static_cast<double>(rng() >> 11) * (1.0 / 9007199254740992.0);
      added.size = kMinObjectSize + (kMaxObjectSize - kMinObjectSize) * u;
      place_object(added, /*alone=*/false, rng);
      // Captions name the left (top) object first.
      const bool first = added.region == Region::kLeft || added.region == Region::kTop;
      e.target.objects.insert(first ? e.target.objects.begin() : e.target.objects.end(), added);
      e.instruction = fill(pick(rng, std::vector<std::string>{"add {a} {r}", "put {a} {r}",
                                                              "draw {a} {r}", "insert {a} {r}"}),
                           {{"a", object_words({added.shape, added.colour, added.region})},
                            {"r", region_phrase(added.region)}});
      break;
    }
  }
  return e;
}

SceneEdit sample_edit(const Scene& source, std::mt19937_64& rng) {
  std::vector<EditKind> kinds;
  for (int k = 0; k < kNumEditKinds; ++k)
    if (edit_applies(static_cast<EditKind>(k), source)) kinds.push_back(static_cast<EditKind>(k));
  return make_edit(pick(rng, kinds), source, rng);
}

EditMix parse_edit_mix(const std::string& spec) {
  EditMix mix;
  if (spec.empty() || spec == "natural") return mix;
  mix.natural = false;
  size_t start = 0;
  while (start <= spec.size()) {
    const size_t end = std::min(spec.find(',', start), spec.size());
    const std::string part = spec.substr(start, end - start);
    const size_t eq = part.find('=');
    int kind = -1;
    for (int k = 0; k < kNumEditKinds && eq != std::string::npos; ++k)
      if (part.compare(0, eq, edit_kind_name(static_cast<EditKind>(k))) == 0 &&
          eq == std::string(edit_kind_name(static_cast<EditKind>(k))).size())
        kind = k;
    if (kind < 0)
      throw InvalidArgument("edit mix '" + spec + "': '" + part +
                            "' is not KIND=WEIGHT with KIND one of background, recolour, move, "
                            "reshape, remove, add");
    const std::string value = part.substr(eq + 1);
    size_t used = 0;
    double w = -1;
    try {
      w = std::stod(value, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used == 0 || used != value.size() || !(w >= 0) || w > 1e6)
      throw InvalidArgument("edit mix '" + spec + "': the weight of '" + part.substr(0, eq) +
                            "' must be a number from 0 to 1e6, got '" + value + "'");
    mix.weight[kind] = w;
    start = end + 1;
  }
  double sum = 0;
  for (double w : mix.weight) sum += w;
  if (!(sum > 0)) throw InvalidArgument("edit mix '" + spec + "': every weight is 0");
  return mix;
}

std::string edit_mix_spec(const EditMix& mix) {
  if (mix.natural) return "natural";
  std::string out;
  for (int k = 0; k < kNumEditKinds; ++k) {
    std::ostringstream w;
    w << mix.weight[k];
    out += (k ? "," : "") + std::string(edit_kind_name(static_cast<EditKind>(k))) + "=" + w.str();
  }
  return out;
}

EditKind draw_edit_kind(const EditMix& mix, std::mt19937_64& rng) {
  std::discrete_distribution<int> kinds(std::begin(mix.weight), std::end(mix.weight));
  return static_cast<EditKind>(kinds(rng));
}

void throw_no_scene_for(EditKind kind, int tries) {
  throw InvalidArgument(std::string("no scene a '") + edit_kind_name(kind) +
                        "' edit applies to in " + std::to_string(tries) + " draws");
}

std::string e1_prompt(const std::string& instruction, const std::string& target_description) {
  return "Editing Instruction: " + instruction +
         ". Target Image Description: " + target_description + ".";
}

std::vector<SceneEdit> held_out_edits(int n) {
  std::mt19937_64 rng(0xED17ED17ull);
  const auto prompts = held_out_prompts();
  std::vector<SceneEdit> edits;
  size_t next_prompt = 0;
  // Kinds in equal turns; each takes the next held-out source it applies to.
  for (int j = 0; j < n; ++j) {
    const auto kind = static_cast<EditKind>(j % kNumEditKinds);
    for (;;) {
      const auto spec = parse_caption(prompts[next_prompt++ % prompts.size()]);
      const Scene source = sample_scene(*spec, rng);
      if (!edit_applies(kind, source)) continue;
      edits.push_back(make_edit(kind, source, rng));
      break;
    }
  }
  return edits;
}

}  // namespace diffuse::train
