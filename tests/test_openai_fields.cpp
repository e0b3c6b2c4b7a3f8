// OpenAI's Images API fields as real clients send them (openai-python, LangChain, Open WebUI):
// every value the API defines is taken (and the formats it names are produced), every other
// value is refused naming the field; and the JPEG / WebP encoders behind output_format.
#include <gtest/gtest.h>

#include <random>

#include "diffuse/errors.h"
#include "diffuse/image.h"
#include "server/requests.h"
#include "test_util.h"

namespace diffuse {
namespace test_openai_fields {

using nlohmann::json;

server::ModelDefaults served() {
  server::ModelDefaults m;
  m.name = "demo";
  m.scheduler = "ddim";
  m.schedulers = {"ddim"};
  return m;
}

server::OpenAiRequest parse(const json& extra) {
  json body = {{"prompt", "a red circle"}};
  if (extra.is_object()) body.update(extra);
  return server::parse_openai_generation(body, served(), server::ServerLimits{});
}

TEST(OpenAiFields, TakesEveryValueTheApiDefines) {
  const std::vector<json> bodies = {
      {{"model", "demo"}},
      {{"model", "dall-e-3"}, {"quality", "hd"}, {"style", "vivid"}},
      {{"model", "dall-e-2"}, {"quality", "standard"}, {"style", "natural"}, {"user", "u-1"}},
      {{"model", "gpt-image-1"},
       {"quality", "low"},
       {"background", "opaque"},
       {"moderation", "low"},
       {"output_format", "webp"},
       {"output_compression", 50}},
      {{"quality", "auto"}, {"background", "auto"}, {"moderation", "auto"}},
      {{"output_format", "jpeg"}, {"output_compression", 0}},
      {{"output_format", "png"}, {"response_format", "url"}},
  };
  for (const auto& b : bodies) EXPECT_NO_THROW(parse(b)) << b.dump();
  const auto o = parse({{"output_format", "jpeg"}, {"output_compression", 70}});
  EXPECT_EQ(o.output_format, "jpeg");
  EXPECT_EQ(o.output_compression, 70);
  EXPECT_EQ(parse({}).output_format, "png");
  EXPECT_EQ(parse({}).output_compression, 100);
}

TEST(OpenAiFields, RefusesOtherValuesNamingTheField) {
  const std::vector<std::pair<json, std::string>> cases = {
      {{{"model", "sdxl-turbo"}}, "model: \"sdxl-turbo\" is not served here"},
      {{{"quality", "ultra"}}, "quality: expected one of"},
      {{{"style", "anime"}}, "style: expected one of \"vivid\", \"natural\""},
      {{{"background", "transparent"}}, "background: \"transparent\" is not supported"},
      {{{"background", "green"}}, "background: expected one of"},
      {{{"moderation", "none"}}, "moderation: expected one of"},
      {{{"output_format", "gif"}}, "output_format: expected one of \"png\", \"jpeg\", \"webp\""},
      {{{"output_format", "jpeg"}, {"response_format", "url"}}, "b64_json only"},
      {{{"output_compression", 101}}, "output_compression"},
      {{{"output_compression", -1}}, "output_compression"},
      {{{"output_compression", "high"}}, "output_compression: expected an integer"},
      {{{"quality", 3}}, "quality: expected a string"},
      {{{"user", std::string(300, 'u')}}, "user"},
  };
  for (const auto& [extra, expected] : cases) {
    const auto m = test::expect_throw<InvalidArgument>([&] { parse(extra); });
    EXPECT_NE(m.find(expected), std::string::npos) << extra.dump() << " -> " << m;
  }
}

Image noise_image(int w, int h) {
  Image img{w, h, std::vector<uint8_t>(static_cast<size_t>(w) * h * 3)};
  std::mt19937 rng(7);
  for (size_t i = 0; i < img.rgb.size(); ++i)
    img.rgb[i] = static_cast<uint8_t>((i / 3 % w) * 2 + rng() % 32);
  return img;
}

TEST(ImageCodecs, JpegAndWebpAreWellFormedAndQualityCounts) {
  const Image img = noise_image(64, 48);
  const auto jpeg_hi = encode_jpeg(img, 95), jpeg_lo = encode_jpeg(img, 10);
  ASSERT_GT(jpeg_lo.size(), 4u);
  EXPECT_EQ(static_cast<unsigned char>(jpeg_hi[0]), 0xFF);
  EXPECT_EQ(static_cast<unsigned char>(jpeg_hi[1]), 0xD8);  // SOI
  EXPECT_EQ(static_cast<unsigned char>(jpeg_hi[jpeg_hi.size() - 2]), 0xFF);
  EXPECT_EQ(static_cast<unsigned char>(jpeg_hi.back()), 0xD9);  // EOI
  EXPECT_LT(jpeg_lo.size(), jpeg_hi.size());
  const auto webp_lossless = encode_webp(img, 100), webp_lo = encode_webp(img, 10);
  for (const auto* w : {&webp_lossless, &webp_lo}) {
    ASSERT_GT(w->size(), 12u);
    EXPECT_EQ(w->substr(0, 4), "RIFF");
    EXPECT_EQ(w->substr(8, 4), "WEBP");
  }
  EXPECT_EQ(webp_lossless.substr(12, 4), "VP8L");  // the lossless bitstream
  EXPECT_LT(webp_lo.size(), webp_lossless.size());
}

TEST(ImageCodecs, BadInputIsRefused) {
  const Image img = noise_image(8, 8);
  EXPECT_THROW(encode_jpeg(img, 101), InvalidArgument);
  EXPECT_THROW(encode_webp(img, -1), InvalidArgument);
  EXPECT_THROW(encode_jpeg(Image{}, 90), InvalidArgument);
  Image short_pixels{8, 8, std::vector<uint8_t>(10)};
  EXPECT_THROW(encode_webp(short_pixels, 90), InvalidArgument);
  EXPECT_THROW(encode_jpeg(short_pixels, 90), InvalidArgument);
}

}  // namespace test_openai_fields
}  // namespace diffuse
