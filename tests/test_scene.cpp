// The demo world: captions parse back to their scenes, rendered scenes score perfectly, and the
// scorer notices what is wrong.
#include <gtest/gtest.h>

#include <set>

#include "train/scene.h"
#include "train/scene_scorer.h"

namespace diffuse::train {
namespace test_scene {

TEST(Scene, CaptionsOfSampledScenesParseBackToTheSameScene) {
  std::mt19937_64 rng(7);
  std::set<size_t> object_counts;
  for (int i = 0; i < 500; ++i) {
    const Scene s = sample_scene(rng);
    object_counts.insert(s.objects.size());
    for (const auto& o : s.objects) {
      EXPECT_NE(o.colour, s.background);
      EXPECT_GE(o.size, kMinObjectSize);
      EXPECT_LE(o.size, kMaxObjectSize);
    }
    const std::string text = caption(s, rng);
    std::string why;
    const auto spec = parse_caption(text, &why);
    ASSERT_TRUE(spec) << text << ": " << why;
    EXPECT_EQ(spec->background, s.background) << text;
    ASSERT_EQ(spec->objects.size(), s.objects.size()) << text;
    for (size_t k = 0; k < s.objects.size(); ++k) {
      EXPECT_EQ(spec->objects[k].shape, s.objects[k].shape) << text;
      EXPECT_EQ(spec->objects[k].colour, s.objects[k].colour) << text;
      EXPECT_EQ(spec->objects[k].region, s.objects[k].region) << text;
    }
    // Size words are said or left out at random, never wrong.
    const auto sized = spec_of(s, true);
    for (size_t k = 0; k < s.objects.size(); ++k)
      EXPECT_TRUE(spec->objects[k].size == SizeWord::kNone ||
                  spec->objects[k].size == sized.objects[k].size)
          << text;
    EXPECT_EQ(caption(*parse_caption(caption(sized))), caption(sized));
  }
  EXPECT_EQ(object_counts, (std::set<size_t>{1, 2}));
}

TEST(Scene, ParsingIgnoresCaseSpacesAndATrailingPeriod) {
  const auto a = parse_caption(
      "a red circle on the left and a blue square on the right on a "
      "yellow background");
  const auto b = parse_caption(
      "  A Red   CIRCLE on the left AND a blue square on the right on "
      "a Yellow background. ");
  ASSERT_TRUE(a);
  ASSERT_TRUE(b);
  EXPECT_EQ(caption(*a), caption(*b));
  const auto c = parse_caption("a large green triangle in the center on a black background");
  ASSERT_TRUE(c);
  EXPECT_EQ(c->objects[0].size, SizeWord::kLarge);
  EXPECT_EQ(c->objects[0].region, Region::kCenter);
  EXPECT_TRUE(
      parse_caption("an orange square at the top and a small white circle at the "
                    "bottom on a purple background"));
}

TEST(Scene, RejectsCaptionsOutsideTheWorldWithAReason) {
  const std::pair<const char*, const char*> bad[] = {
      {"", "'a' or 'an'"},
      {"a fox in the snow", "colour"},
      {"a red hexagon on the left on a blue background", "shape"},
      {"a red circle somewhere on a blue background", "position"},
      {"a red circle on the left on a red background", "background cannot"},
      {"a red circle on the right and a blue square on the left on a white background",
       "two objects"},
      {"a red circle on the left on a blue background and more", "end of the caption"},
      {"a red circle on the left on a blue", "'background'"},
  };
  for (const auto& [text, expected] : bad) {
    std::string why;
    EXPECT_FALSE(parse_caption(text, &why)) << text;
    EXPECT_NE(why.find(expected), std::string::npos) << text << " -> " << why;
  }
}

TEST(Scene, ObjectsLieInTheirRegionAndInsideTheImage) {
  std::mt19937_64 rng(11);
  for (int i = 0; i < 300; ++i) {
    const Scene s = sample_scene(rng);
    for (const auto& o : s.objects) {
      const double h = o.size / 2;
      EXPECT_GE(o.cx - h, 0.0);
      EXPECT_LE(o.cx + h, 1.0);
      EXPECT_GE(o.cy - h, 0.0);
      EXPECT_LE(o.cy + h, 1.0);
      switch (o.region) {
        case Region::kLeft:
          EXPECT_LT(o.cx, 0.5);
          break;
        case Region::kRight:
          EXPECT_GT(o.cx, 0.5);
          break;
        case Region::kTop:
          EXPECT_LT(o.cy, 0.5);
          break;
        case Region::kBottom:
          EXPECT_GT(o.cy, 0.5);
          break;
        case Region::kCenter:
          EXPECT_GT(o.cx, 1.0 / 3);
          EXPECT_LT(o.cx, 2.0 / 3);
          EXPECT_GT(o.cy, 1.0 / 3);
          EXPECT_LT(o.cy, 2.0 / 3);
          break;
      }
    }
  }
}

TEST(Scene, RendersExactPaletteColoursWithAntiAliasedEdges) {
  Scene s;
  s.background = Colour::kYellow;
  s.objects.push_back({Shape::kCircle, Colour::kBlue, Region::kCenter, 0.4, 0.5, 0.5});
  const Image img = render_scene(s, 64, 64);
  ASSERT_EQ(img.rgb.size(), 64u * 64 * 3);
  auto px = [&](int x, int y) {
    const uint8_t* p = &img.rgb[(y * 64 + x) * 3];
    return Rgb{p[0], p[1], p[2]};
  };
  EXPECT_EQ(px(0, 0).r, 240);    // yellow corner
  EXPECT_EQ(px(32, 32).b, 220);  // blue centre
  int blends = 0;
  for (int x = 0; x < 64; ++x) {
    const Rgb c = px(x, 32);
    const bool pure =
        (c.r == 240 && c.g == 210 && c.b == 40) || (c.r == 40 && c.g == 80 && c.b == 220);
    blends += !pure;
  }
  EXPECT_GE(blends, 1);  // edge pixels mix the two colours
  EXPECT_LE(blends, 4);
}

TEST(SceneScorer, RenderedScenesScorePerfectly) {
  std::mt19937_64 rng(3);
  QualityTally tally;
  for (int i = 0; i < 200; ++i) {
    const Scene s = sample_scene(rng);
    tally.add(score_scene(render_scene(s, 128, 128), spec_of(s, false)));
  }
  EXPECT_EQ(tally.background_accuracy(), 1.0);
  EXPECT_EQ(tally.colour_position_accuracy(), 1.0);
  EXPECT_GE(tally.shape_accuracy(), 0.99);
}

TEST(SceneScorer, NoticesAWrongBackgroundColourPositionAndShape) {
  Scene s;
  s.background = Colour::kWhite;
  s.objects.push_back({Shape::kTriangle, Colour::kRed, Region::kLeft, 0.35, 0.25, 0.5});
  const Image img = render_scene(s, 128, 128);
  auto spec = spec_of(s, false);
  EXPECT_TRUE(score_scene(img, spec).all());

  auto wrong_bg = spec;
  wrong_bg.background = Colour::kBlack;
  EXPECT_FALSE(score_scene(img, wrong_bg).background);

  auto wrong_place = spec;
  wrong_place.objects[0].region = Region::kRight;
  EXPECT_FALSE(score_scene(img, wrong_place).objects[0].colour_position);

  auto wrong_colour = spec;
  wrong_colour.objects[0].colour = Colour::kGreen;
  EXPECT_FALSE(score_scene(img, wrong_colour).objects[0].colour_position);

  auto wrong_shape = spec;
  wrong_shape.objects[0].shape = Shape::kSquare;
  const auto sc = score_scene(img, wrong_shape);
  EXPECT_TRUE(sc.objects[0].colour_position);
  EXPECT_FALSE(sc.objects[0].shape);
  EXPECT_EQ(sc.objects[0].detected_shape, "triangle");
}

TEST(SceneScorer, TellsTheThreeShapesApart) {
  for (Shape shape : {Shape::kCircle, Shape::kSquare, Shape::kTriangle})
    for (double size : {kMinObjectSize, kMaxObjectSize}) {
      Scene s;
      s.background = Colour::kBlack;
      s.objects.push_back({shape, Colour::kWhite, Region::kCenter, size, 0.5, 0.5});
      const auto sc = score_scene(render_scene(s, 128, 128), spec_of(s, false));
      EXPECT_EQ(sc.objects[0].detected_shape, shape_name(shape)) << size;
    }
}

TEST(SceneScorer, RejectsMalformedImages) {
  Image tiny;
  tiny.width = 4;
  tiny.height = 4;
  tiny.rgb.resize(48);
  EXPECT_THROW(score_scene(tiny, *parse_caption("a red circle on the left on a blue background")),
               std::exception);
}

TEST(Scene, HeldOutPromptsAreDistinctParseableAndStable) {
  const auto a = held_out_prompts(50), b = held_out_prompts(50);
  EXPECT_EQ(a, b);
  EXPECT_EQ(std::set<std::string>(a.begin(), a.end()).size(), 50u);
  for (const auto& p : a) EXPECT_TRUE(parse_caption(p)) << p;
}

}  // namespace test_scene
}  // namespace diffuse::train
