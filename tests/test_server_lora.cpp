// LoRA per request in diffuse serve: A1111's <lora:NAME:SCALE> in a prompt swaps the adapter
// NAME.safetensors from --lora-dir in for that job only (no reload); the next job without it
// gets the plain model back, pixel for pixel. Names that leave the folder, unknown names and
// tags on a server without --lora-dir are 400s.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>

#include "io/safetensors.h"
#include "server/base64.h"
#include "server_test_util.h"
#include "test_util.h"

namespace diffuse {
namespace test_server_lora {

using nlohmann::json;
using test::json_of;
using test::TestServer;

constexpr const char* kPrompt = "a large green triangle in the center on a black background";

// A kohya adapter over every to_q / to_k of the demo UNet, strong enough to change the image.
void write_demo_adapter(const std::string& path) {
  torch::manual_seed(5);
  auto unet = io::SafetensorsFile::open(test::demo_model_dir() +
                                        "/unet/diffusion_pytorch_model.safetensors");
  std::vector<std::pair<std::string, torch::Tensor>> t;
  for (const auto& k : unet->names()) {
    const std::string suffix = ".weight";
    if (k.find(".to_q.weight") == std::string::npos && k.find(".to_k.weight") == std::string::npos)
      continue;
    const auto w = unet->get(k);
    std::string flat = k.substr(0, k.size() - suffix.size());
    std::replace(flat.begin(), flat.end(), '.', '_');
    t.emplace_back("lora_unet_" + flat + ".lora_down.weight", torch::randn({4, w.size(1)}));
    t.emplace_back("lora_unet_" + flat + ".lora_up.weight", torch::randn({w.size(0), 4}) * 0.5);
    t.emplace_back("lora_unet_" + flat + ".alpha", torch::tensor(4.0));
  }
  io::save_safetensors(path, t);
}

torch::Tensor txt2img(httplib::Client& c, const std::string& prompt, int* status = nullptr,
                      std::string* body = nullptr) {
  auto r = c.Post("/sdapi/v1/txt2img", json{{"prompt", prompt}, {"steps", 3}, {"seed", 7}}.dump(),
                  "application/json");
  if (status) *status = r ? r->status : -1;
  if (body) *body = r ? r->body : "";
  if (!r || r->status != 200) return {};
  const auto b64 = json_of(r)["images"][0].get<std::string>();
  const Image img = decode_png(server::base64_decode(b64, "image"), "image", 1 << 20);
  return torch::from_blob(const_cast<uint8_t*>(img.rgb.data()), {img.height, img.width, 3},
                          torch::kUInt8)
      .clone();
}

TEST(ServerLora, PromptTagSwapsTheAdapterInForOneJob) {
  test::TempDir dir;
  write_demo_adapter(dir.file("shapes.safetensors"));
  server::ServerOptions o;
  o.lora_dir = dir.path().string();
  TestServer server(o);
  auto c = server.client();
  const auto plain = txt2img(*c, kPrompt);
  ASSERT_TRUE(plain.defined());
  const auto with = txt2img(*c, std::string("<lora:shapes:0.8> ") + kPrompt);
  ASSERT_TRUE(with.defined());
  EXPECT_FALSE(torch::equal(with, plain));
  EXPECT_TRUE(torch::equal(txt2img(*c, kPrompt), plain));  // the model as loaded
  EXPECT_TRUE(torch::equal(txt2img(*c, std::string("<lora:shapes:0.8> ") + kPrompt), with));
  EXPECT_TRUE(torch::equal(txt2img(*c, std::string("<lora:shapes:0> ") + kPrompt), plain));

  for (const std::string bad : {"<lora:nope:1> ", "<lora:../shapes:1> ", "<lora:shapes:inf> "}) {
    SCOPED_TRACE(bad);
    int status = 0;
    std::string body;
    txt2img(*c, bad + kPrompt, &status, &body);
    EXPECT_EQ(status, 400) << body;
  }
  EXPECT_TRUE(torch::equal(txt2img(*c, kPrompt), plain));
}

TEST(ServerLora, TagsNeedALoraDir) {
  TestServer server;
  auto c = server.client();
  int status = 0;
  std::string body;
  txt2img(*c, std::string("<lora:shapes:1> ") + kPrompt, &status, &body);
  EXPECT_EQ(status, 400) << body;
  EXPECT_NE(body.find("lora"), std::string::npos) << body;
}

}  // namespace test_server_lora
}  // namespace diffuse
