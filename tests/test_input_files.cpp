// Input files are checked before they are trusted (issue 18 classes 4 and 5): a FIFO given as
// any input file is refused instead of blocking forever, shard and case file names cannot
// leave their folder, and a golden set that is empty, malformed or damaged is an error, never
// "0 failed" or an engine mismatch.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>

#include "diffuse/errors.h"
#include "diffuse/image.h"
#include "io/input_file.h"
#include "io/json_config.h"
#include "io/model_folder.h"
#include "io/safetensors.h"
#include "io/sha256.h"
#include "test_util.h"
#include "text/tokenizer_files.h"
#include "verify/golden.h"

namespace fs = std::filesystem;

namespace diffuse {
namespace {

using nlohmann::json;
using test::expect_throw;

void write(const fs::path& p, const std::string& content) {
  std::ofstream(p, std::ios::binary) << content;
}

TEST(InputFiles, Sha256MatchesTheStandardVectors) {
  EXPECT_EQ(io::sha256_hex(""), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(io::sha256_hex("abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  test::TempDir dir;
  write(dir.path() / "abc", "abc");
  EXPECT_EQ(io::sha256_file_hex(dir.file("abc")), io::sha256_hex("abc"));
}

// Each reader refuses the FIFO from its type: opening it would block until a writer appears.
TEST(InputFiles, AFifoIsRefusedByEveryReaderWithoutOpeningIt) {
  test::TempDir dir;
  const std::string fifo = dir.file("pipe");
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  auto expect_fifo = [&](const char* what, const std::function<void()>& read) {
    SCOPED_TRACE(what);
    const auto msg = expect_throw<IoError>(read);
    EXPECT_NE(msg.find("FIFO"), std::string::npos) << msg;
    EXPECT_NE(msg.find(fifo), std::string::npos) << msg;
  };
  expect_fifo("safetensors", [&] { io::SafetensorsFile::open(fifo); });
  expect_fifo("json", [&] { io::JsonConfig::load(fifo); });
  expect_fifo("png", [&] { read_png(fifo); });
  expect_fifo("tokenizer", [&] { text::read_tokenizer_file(fifo); });
  expect_fifo("sha256", [&] { io::sha256_file_hex(fifo); });
  const auto msg = expect_throw<IoError>([&] { io::require_regular_file(dir.file("none"), "x"); });
  EXPECT_NE(msg.find("No such file"), std::string::npos) << msg;
  EXPECT_NE(expect_throw<IoError>([&] { read_png(dir.path().string()); }).find("a directory"),
            std::string::npos);
}

TEST(InputFiles, ShardNamesCannotLeaveTheModelFolder) {
  test::TempDir dir;
  for (const std::string shard :
       {"../../../etc/passwd", "/etc/passwd", "sub/../../x.safetensors"}) {
    SCOPED_TRACE(shard);
    const auto index = dir.path() / "model.safetensors.index.json";
    write(index, json{{"weight_map", {{"w", shard}}}}.dump());
    const auto msg = expect_throw<FormatError>([&] { io::load_weights_file(index.string()); });
    EXPECT_NE(msg.find("not a file name inside the folder"), std::string::npos) << msg;
  }
}

// A minimal golden set: one case file, listed with its size and digest.
struct TinyGoldenSet {
  test::TempDir dir;
  json cases;
  TinyGoldenSet() {
    fs::create_directories(dir.path() / "cases");
    write(dir.path() / "cases" / "a.safetensors", "expected output bytes");
    cases = {{"cases", {{{"name", "a"}, {"component", "vae"}, {"file", "cases/a.safetensors"}}}},
             {"files",
              {{"cases/a.safetensors",
                {{"bytes", 21}, {"sha256", io::sha256_hex("expected output bytes")}}}}}};
    save();
  }
  void save() const { write(dir.path() / "cases.json", cases.dump()); }
  std::string path() const { return dir.path().string(); }
};

TEST(GoldenSetChecks, EmptyMalformedOrEscapingSetsAreErrors) {
  TinyGoldenSet g;
  EXPECT_NO_THROW(verify::GoldenSet::load(g.path()).check_files());
  auto expect_load_error = [&](const json& cases, const std::string& needle) {
    SCOPED_TRACE(needle);
    TinyGoldenSet t;
    t.cases = cases;
    t.save();
    const auto msg = expect_throw<FormatError>([&] { verify::GoldenSet::load(t.path()); });
    EXPECT_NE(msg.find(needle), std::string::npos) << msg;
    EXPECT_NE(msg.find("cases.json"), std::string::npos) << msg;
  };
  expect_load_error({{"cases", json::array()}}, "'cases' is empty");
  expect_load_error(
      {{"cases", {{{"name", "a"}, {"component", "vae"}, {"file", "x"}, {"params", "garbage"}}}}},
      "'params' must be an object");
  expect_load_error({{"cases", {{{"name", 1}, {"component", "vae"}, {"file", "x"}}}}},
                    "string fields");
  expect_load_error(
      {{"cases", {{{"name", "a"}, {"component", "vae"}, {"file", "../../../etc/passwd"}}}}},
      "not a file name inside the folder");
}

TEST(GoldenSetChecks, ADamagedFileIsReportedAsCorruptedNotAsAMismatch) {
  TinyGoldenSet g;
  write(g.dir.path() / "cases" / "a.safetensors", "expected output bytez");  // one byte flipped
  auto msg = expect_throw<FormatError>([&] { verify::GoldenSet::load(g.path()).check_files(); });
  EXPECT_NE(msg.find("golden file corrupted"), std::string::npos) << msg;
  EXPECT_NE(msg.find("sha256"), std::string::npos) << msg;
  write(g.dir.path() / "cases" / "a.safetensors", "short");
  msg = expect_throw<FormatError>([&] { verify::GoldenSet::load(g.path()).check_files(); });
  EXPECT_NE(msg.find("5 bytes, cases.json says 21"), std::string::npos) << msg;
  fs::remove(g.dir.path() / "cases" / "a.safetensors");
  msg = expect_throw<FormatError>([&] { verify::GoldenSet::load(g.path()).check_files(); });
  EXPECT_NE(msg.find("golden file missing"), std::string::npos) << msg;
}

TEST(GoldenSetChecks, TheRealSetsAreIntact) {
  for (const auto& dir : {test::golden_dir(), test::hidream_golden_dir()}) {
    if (!fs::exists(fs::path(dir) / "cases.json")) continue;
    SCOPED_TRACE(dir);
    EXPECT_NO_THROW(verify::GoldenSet::load(dir).check_files());
  }
}

}  // namespace
}  // namespace diffuse
