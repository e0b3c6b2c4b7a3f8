// Instruction edits of the demo world (train/scene.h): a scene, an instruction as a user might
// type it, and the scene the instruction asks for, with everything it does not name kept
// exactly (colours, places, sizes). The trainer of the HiDream-architecture demo model learns
// from these pairs and `diffuse bench demo-quality --edit` scores on held-out ones, so both
// share this one definition.
#pragma once
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "train/scene.h"

namespace diffuse::train {

enum class EditKind { kBackground, kRecolour, kMove, kReshape, kRemove, kAdd };
constexpr int kNumEditKinds = 6;
const char* edit_kind_name(EditKind kind);  // "background", "recolour", ...

struct SceneEdit {
  EditKind kind = EditKind::kBackground;
  std::string instruction;  // e.g. "make the circle blue"
  Scene source, target;
};

// Whether `kind` applies to `scene` (a move or an add needs a lone object with room to spare,
// a removal two objects).
bool edit_applies(EditKind kind, const Scene& scene);

// A random edit of `kind` (which must apply) with a random phrasing of the instruction: the
// paraphrases of each kind, and objects named by shape, by colour and shape, or by shape and
// place, whichever names one object unambiguously.
SceneEdit make_edit(EditKind kind, const Scene& source, std::mt19937_64& rng);
// A random edit of a kind that applies to `source`.
SceneEdit sample_edit(const Scene& source, std::mt19937_64& rng);

// How often each kind is drawn in training. Natural (the default): each scene takes one of the
// kinds that apply to it, uniformly, so kinds that need a lone object (move, add) come up less
// often than the others. Weighted: the kind is drawn first by its weight and scenes are drawn
// until one it applies to comes up, so a trainer can give the kinds its model finds hard more
// examples.
struct EditMix {
  bool natural = true;
  double weight[kNumEditKinds] = {1, 1, 1, 1, 1, 1};
};
// "kind=weight,..." (kinds as edit_kind_name spells them; kinds not named keep weight 1);
// empty or "natural" gives the natural mix. InvalidArgument names the bad part.
EditMix parse_edit_mix(const std::string& spec);
std::string edit_mix_spec(const EditMix& mix);  // as parse_edit_mix reads it
// An edit drawn by `mix`, its source from `next_scene`.
template <class NextScene>
SceneEdit sample_edit(const EditMix& mix, NextScene&& next_scene, std::mt19937_64& rng);

// HiDream-E1's prompt format: "Editing Instruction: <instruction>. Target Image Description:
// <description>."
std::string e1_prompt(const std::string& instruction, const std::string& target_description);

// Held-out edits for scoring: sources drawn from the held-out prompts (train/scene.h, never
// trained on as sources), the kinds in equal turns, with a fixed seed.
std::vector<SceneEdit> held_out_edits(int n);

EditKind draw_edit_kind(const EditMix& mix, std::mt19937_64& rng);
[[noreturn]] void throw_no_scene_for(EditKind kind, int tries);

template <class NextScene>
SceneEdit sample_edit(const EditMix& mix, NextScene&& next_scene, std::mt19937_64& rng) {
  if (mix.natural) return sample_edit(next_scene(), rng);
  const EditKind kind = draw_edit_kind(mix, rng);
  // Every kind applies to a fair share of the world's scenes (a lone object: about half), so
  // the bound is never reached by a sound scene source.
  constexpr int kTries = 10000;
  for (int i = 0; i < kTries; ++i) {
    Scene source = next_scene();
    if (edit_applies(kind, source)) return make_edit(kind, source, rng);
  }
  throw_no_scene_for(kind, kTries);
}

}  // namespace diffuse::train
