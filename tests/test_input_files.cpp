// Input files are checked before they are trusted (issue 18 classes 4 and 5): a FIFO given as
// any input file is refused instead of blocking forever, shard and case file names cannot
// leave their folder, and a golden set that is empty, malformed or damaged is an error, never
// "0 failed" or an engine mismatch.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <nlohmann/json.hpp>
#include <thread>

#include "diffuse/errors.h"
#include "diffuse/image.h"
#include "io/input_file.h"
#include "io/json_config.h"
#include "io/ldm_checkpoint.h"
#include "io/model_folder.h"
#include "io/safetensors.h"
#include "io/sha256.h"
#include "test_util.h"
#include "text/sentencepiece_model.h"
#include "text/tokenizer_files.h"
#include "verify/golden.h"

namespace fs = std::filesystem;

namespace diffuse {
namespace test_input_files {

using nlohmann::json;
using test::expect_throw;

void write(const fs::path& p, const std::string& content) {
  std::ofstream(p, std::ios::binary) << content;
}

// FIPS 180-4 / NIST CSHA256 example vectors (libcrypto underneath; checks the wiring): empty, one
// block, two blocks, a million bytes.
TEST(InputFiles, Sha256MatchesTheStandardVectors) {
  EXPECT_EQ(io::sha256_hex(""), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(io::sha256_hex("abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  const std::string two_blocks = "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq";
  EXPECT_EQ(io::sha256_hex(two_blocks),
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  const std::string million(1000000, 'a');
  EXPECT_EQ(io::sha256_hex(million),
            "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
  test::TempDir dir;
  write(dir.path() / "a", million);
  EXPECT_EQ(io::sha256_file_hex(dir.file("a")), io::sha256_hex(million));
}

// Opens the FIFO's write end whenever a reader has opened it, and closes it at once: a reader
// that opened the FIFO despite the check then reads end-of-file and fails its test instead of
// blocking forever (no timing involved).
class FifoUnblocker {
 public:
  explicit FifoUnblocker(std::string path)
      : path_(std::move(path)), thread_([this] {
          while (!stop_) {
            const int fd = ::open(path_.c_str(), O_WRONLY | O_NONBLOCK | O_CLOEXEC);
            if (fd >= 0) ::close(fd);
            std::this_thread::yield();
          }
        }) {}
  ~FifoUnblocker() {
    stop_ = true;
    thread_.join();
  }

 private:
  std::string path_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

// Each reader refuses the FIFO from its type: opening it would block until a writer appears.
TEST(InputFiles, AFifoIsRefusedByEveryReaderWithoutOpeningIt) {
  test::TempDir dir;
  const std::string fifo = dir.file("pipe");
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  FifoUnblocker unblocker(fifo);
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
  expect_fifo("sentencepiece", [&] { text::SentencePieceModel::load(fifo); });
  expect_fifo("checkpoint", [&] { io::load_single_file_checkpoint(fifo, {}); });
  expect_fifo("weights", [&] { io::load_weights_file(fifo); });
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

// A minimal golden set: one case file and one model file, listed with size and digest.
struct TinyGoldenSet {
  test::TempDir dir;
  json cases;
  TinyGoldenSet() {
    fs::create_directories(dir.path() / "cases");
    fs::create_directories(dir.path() / "model");
    io::save_safetensors(case_file(), {{"out", torch::arange(4, torch::kFloat32)}});
    write(dir.path() / "model" / "config.json", "{}");
    cases = {{"cases", {{{"name", "a"}, {"component", "vae"}, {"file", "cases/a.safetensors"}}}},
             {"files",
              {{"cases/a.safetensors", listing(case_file())},
               {"model/config.json", listing(dir.file("model/config.json"))}}}};
    save();
  }
  static json listing(const std::string& path) {
    return {{"bytes", fs::file_size(path)}, {"sha256", io::sha256_file_hex(path)}};
  }
  std::string case_file() const { return dir.file("cases/a.safetensors"); }
  void save() const { write(dir.path() / "cases.json", cases.dump()); }
  std::string path() const { return dir.path().string(); }
  verify::GoldenSet load() const { return verify::GoldenSet::load(path()); }
};

TEST(GoldenSetChecks, EmptyMalformedOrEscapingSetsAreErrors) {
  TinyGoldenSet g;
  EXPECT_NO_THROW(g.load().check_model_files());
  EXPECT_NO_THROW(verify::CaseTensors(g.load().cases.at(0)).get("out"));
  auto expect_load_error = [&](const std::function<void(json&)>& damage,
                               const std::string& needle) {
    SCOPED_TRACE(needle);
    TinyGoldenSet t;
    damage(t.cases);
    t.save();
    const auto msg = expect_throw<FormatError>([&] { t.load(); });
    EXPECT_NE(msg.find(needle), std::string::npos) << msg;
    EXPECT_NE(msg.find(t.dir.file("cases.json")), std::string::npos) << msg;
  };
  expect_load_error([](json& j) { j["cases"] = json::array(); }, "'cases' is empty");
  expect_load_error([](json& j) { j["cases"][0]["params"] = "garbage"; },
                    "case 'a': 'params' is \"garbage\", expected an object");
  expect_load_error([](json& j) { j["cases"][0]["tolerance"] = 1e-4; },
                    "case 'a': 'tolerance' is 0.0001, expected an object");
  expect_load_error([](json& j) { j["cases"][0]["name"] = 1; }, "string fields");
  expect_load_error([](json& j) { j["cases"].push_back(j["cases"][0]); },
                    "two cases are named 'a'");
  for (const std::string escape : {"../../../etc/passwd", "/etc/passwd", "cases/../../x"})
    expect_load_error([&](json& j) { j["cases"][0]["file"] = escape; },
                      "case 'a' file '" + escape + "' is not a file name inside the folder");
  expect_load_error([](json& j) { j["model_dir"] = "/usr"; },
                    "model_dir '/usr' is not a file name inside the folder");
  expect_load_error([](json& j) { j["files"]["cases/a.safetensors"]["sha256"] = "00"; },
                    "files['cases/a.safetensors'] is");
  expect_load_error([](json& j) { j["files"].erase("cases/a.safetensors"); },
                    "case 'a': file 'cases/a.safetensors' is not listed in 'files'");
}

// Params and tolerances are read through typed accessors: a value of the wrong type is an
// error naming the file, case, key and value, not a silent default.
TEST(GoldenSetChecks, ParamsOfTheWrongTypeAreErrors) {
  TinyGoldenSet g;
  g.cases["cases"][0]["params"] = {{"max_seq", "64"},           {"steps", 5},
                                   {"guidance_scale", 7.5},     {"prompt", {"a", 3}},
                                   {"negative_prompt", "b"},    {"huge", 1ll << 40},
                                   {"scheduler", json::array()}};
  g.cases["cases"][0]["tolerance"] = {{"atol", "1e-4"}, {"rtol", -1}, {"latents_rtol", 0.5}};
  g.save();
  const auto set = g.load();
  const auto& c = set.cases.at(0);
  EXPECT_EQ(c.param("steps", 1), 5);
  EXPECT_EQ(c.param("guidance_scale", 1.0), 7.5);
  EXPECT_EQ(c.param("absent", 3), 3);
  EXPECT_EQ(c.param_strings("negative_prompt"), std::vector<std::string>{"b"});
  EXPECT_EQ(c.tol("latents_rtol", 0.0), 0.5);
  EXPECT_EQ(c.tol("absent", 0.25), 0.25);
  const std::string where = g.dir.file("cases.json") + ": case 'a': ";
  auto expect_error = [&](const std::function<void()>& read, const std::string& message) {
    EXPECT_EQ(expect_throw<FormatError>(read), where + message);
  };
  expect_error([&] { c.param("max_seq", int64_t{0}); },
               "params.max_seq is \"64\", expected an integer");
  expect_error([&] { c.param("steps", std::string()); }, "params.steps is 5, expected a string");
  expect_error([&] { c.param("huge", 0); }, "params.huge is 1099511627776, expected an integer");
  expect_error([&] { c.param("scheduler", json()); }, "params.scheduler is [], expected an object");
  expect_error([&] { c.param_strings("prompt"); },
               "params.prompt is [\"a\",3], expected a string or a list of strings");
  expect_error([&] { c.tol("atol", 0.0); }, "tolerance.atol is \"1e-4\", expected a number >= 0");
  expect_error([&] { c.tol("rtol", 0.0); }, "tolerance.rtol is -1, expected a number >= 0");
}

TEST(GoldenSetChecks, ADamagedFileIsReportedAsCorruptedNotAsAMismatch) {
  TinyGoldenSet g;
  const std::string want = g.cases["files"]["cases/a.safetensors"]["sha256"];
  std::string bytes;
  {
    std::ifstream in(g.case_file(), std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), {});
  }
  bytes.back() ^= 1;  // one bit of the last value: still a valid safetensors file
  write(g.case_file(), bytes);
  const auto set = g.load();
  EXPECT_NO_THROW(io::SafetensorsFile::open(g.case_file())->get("out"));
  auto msg = expect_throw<FormatError>([&] { verify::CaseTensors{set.cases.at(0)}; });
  EXPECT_EQ(msg, "golden file corrupted: " + g.case_file() + ": sha256 " + io::sha256_hex(bytes) +
                     ", cases.json says " + want);
  write(g.case_file(), "short");
  msg = expect_throw<FormatError>([&] { verify::CaseTensors{set.cases.at(0)}; });
  EXPECT_NE(msg.find("5 bytes, cases.json says"), std::string::npos) << msg;
  fs::remove(g.case_file());
  msg = expect_throw<FormatError>([&] { verify::CaseTensors{set.cases.at(0)}; });
  EXPECT_NE(msg.find("golden file missing"), std::string::npos) << msg;

  write(g.dir.path() / "model" / "config.json", "[]");
  msg = expect_throw<FormatError>([&] { set.check_model_files(); });
  EXPECT_NE(msg.find("golden file corrupted: " + g.dir.file("model/config.json") + ": sha256 "),
            std::string::npos)
      << msg;
}

TEST(GoldenSetChecks, TheRealSetsAreIntact) {
  for (const auto& dir : {test::golden_dir(), test::hidream_golden_dir()}) {
    if (!fs::exists(fs::path(dir) / "cases.json")) continue;
    SCOPED_TRACE(dir);
    const auto set = verify::GoldenSet::load(dir);
    EXPECT_FALSE(set.files.empty());
    EXPECT_NO_THROW(set.check_model_files());
    for (const auto& c : set.cases) EXPECT_NO_THROW(verify::CaseTensors{c}) << c.name;
  }
}

}  // namespace test_input_files
}  // namespace diffuse
