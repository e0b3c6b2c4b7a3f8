// The server's parsers of untrusted input (base64, JSON bodies, uploaded PNGs in memory):
// strict, with errors that say what and where, and no crash or runaway allocation on any input
// (these run under the sanitizer job too).
#include <gtest/gtest.h>

#include <random>

#include "diffuse/errors.h"
#include "diffuse/image.h"
#include "server/base64.h"
#include "server/json_fields.h"
#include "test_util.h"

namespace diffuse {
namespace test_server_parsers {

using server::base64_decode;
using server::base64_encode;

TEST(Base64, RoundTripsEveryLengthAndByte) {
  std::string bytes;
  for (int i = 0; i < 256; ++i) bytes += static_cast<char>(i);
  for (size_t n = 0; n <= bytes.size(); n += 7) {
    const std::string part = bytes.substr(0, n);
    if (part.empty()) continue;
    EXPECT_EQ(base64_decode(base64_encode(part), "x"), part) << n;
  }
  EXPECT_EQ(base64_encode("Man"), "TWFu");
  EXPECT_EQ(base64_encode("Ma"), "TWE=");
  EXPECT_EQ(base64_encode("M"), "TQ==");
}

TEST(Base64, AcceptsDataUrlsWhitespaceUrlSafeAndMissingPadding) {
  EXPECT_EQ(base64_decode("data:image/png;base64,TWFu", "x"), "Man");
  EXPECT_EQ(base64_decode("TW\nFu\r\n", "x"), "Man");
  EXPECT_EQ(base64_decode("TWE", "x"), "Ma");
  EXPECT_EQ(base64_decode("-_8", "x"), base64_decode("+/8", "x"));
}

TEST(Base64, RejectsGarbageWithItsOffset) {
  auto m = test::expect_throw<InvalidArgument>([] { base64_decode("TWFu!!", "init_image"); });
  EXPECT_NE(m.find("init_image"), std::string::npos);
  EXPECT_NE(m.find("offset 4"), std::string::npos);
  EXPECT_THROW(base64_decode("TQ==TQ==", "x"), InvalidArgument);  // data after padding
  EXPECT_THROW(base64_decode("T", "x"), InvalidArgument);         // 6 bits cannot be a byte
  EXPECT_THROW(base64_decode("", "x"), InvalidArgument);
  EXPECT_THROW(base64_decode("data:image/png,TWFu", "x"), InvalidArgument);  // not base64
}

TEST(Base64, RandomInputNeverCrashes) {
  std::mt19937 rng(1);
  for (int i = 0; i < 2000; ++i) {
    std::string s(rng() % 64, '\0');
    for (auto& c : s) c = static_cast<char>(rng());
    try {
      EXPECT_LE(base64_decode(s, "x").size(), s.size());
    } catch (const InvalidArgument&) {
    }
  }
}

TEST(JsonFields, TypesAndRangesAreCheckedWithTheFieldName) {
  auto body = server::parse_json_body(
      R"({"steps": 20, "cfg": 7.5, "name": "x", "on": true, "list": ["a", "b"], "big": 512.0, "bad": "ten"})");
  server::JsonFields f(body);
  EXPECT_EQ(f.integer("steps", 1, 150), 20);
  EXPECT_EQ(f.integer("big", 0, 1024), 512);
  EXPECT_DOUBLE_EQ(*f.number("cfg", 0, 30), 7.5);
  EXPECT_EQ(f.string("name", 10), "x");
  EXPECT_EQ(f.boolean("on"), true);
  EXPECT_EQ(f.strings("list", 4, 10)->size(), 2u);
  EXPECT_FALSE(f.integer("absent", 0, 1).has_value());
  auto m = test::expect_throw<InvalidArgument>([&] { f.integer("bad", 1, 150); });
  EXPECT_NE(m.find("bad: expected an integer in [1, 150], got \"ten\" (string)"), std::string::npos)
      << m;
  EXPECT_THROW(f.integer("steps", 30, 40), InvalidArgument);
  EXPECT_THROW(f.integer("cfg", 0, 10), InvalidArgument);   // 7.5 is not an integer
  EXPECT_THROW(f.string("name", 0), InvalidArgument);       // too long
  EXPECT_THROW(f.strings("list", 1, 10), InvalidArgument);  // too many
  f.reject_unknown();                                       // every field was read
  server::JsonFields g(body);
  g.integer("steps", 1, 150);
  EXPECT_EQ(g.unknown().size(), 6u);
  EXPECT_THROW(g.reject_unknown(), InvalidArgument);
}

TEST(JsonFields, BodiesThatAreNotObjectsOrTooDeepAreRefused) {
  EXPECT_THROW(server::parse_json_body("{"), InvalidArgument);
  EXPECT_THROW(server::parse_json_body("[]"), InvalidArgument);
  EXPECT_THROW(server::parse_json_body(""), InvalidArgument);
  EXPECT_THROW(server::parse_json_body(std::string(100000, '[')), InvalidArgument);
  auto j = server::parse_json_body(R"({"n": 18446744073709551615})");
  server::JsonFields f(j);
  EXPECT_THROW(f.integer("n", 0, 10), InvalidArgument);
}

TEST(PngInMemory, RoundTripsWithTextAndRefusesBadData) {
  Image img{5, 3, std::vector<uint8_t>(5 * 3 * 3)};
  for (size_t i = 0; i < img.rgb.size(); ++i) img.rgb[i] = static_cast<uint8_t>(i * 7);
  const std::string png = encode_png(img, {{"parameters", "Seed: 1"}});
  std::map<std::string, std::string> text;
  Image back = decode_png(png, "upload", 100, &text);
  EXPECT_EQ(back.rgb, img.rgb);
  EXPECT_EQ(text["parameters"], "Seed: 1");
  auto m =
      test::expect_throw<FormatError>([&] { decode_png(png, "upload", 10); });  // 15 pixels > 10
  EXPECT_NE(m.find("at most 10 pixels"), std::string::npos) << m;
  EXPECT_THROW(decode_png("not a png", "upload", 100), FormatError);
  EXPECT_THROW(decode_png(png.substr(0, png.size() / 2), "upload", 100), FormatError);  // truncated
  std::mt19937 rng(2);
  for (int i = 0; i < 100; ++i) {  // corrupted bytes: an error, never a crash
    std::string bad = png;
    for (int k = 0; k < 4; ++k) bad[8 + rng() % (bad.size() - 8)] = static_cast<char>(rng());
    try {
      decode_png(bad, "upload", 100);
    } catch (const FormatError&) {
    }
  }
}

}  // namespace test_server_parsers
}  // namespace diffuse
