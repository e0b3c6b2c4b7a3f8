// diffuse serve over HTTP on 127.0.0.1 with the demo model: the native API (jobs, events,
// cancel, queue limit), AUTOMATIC1111's and OpenAI's APIs, auth, CORS, and bad requests that
// must be answered 4xx while the server stays healthy.
#include <gtest/gtest.h>
#include <poll.h>

#include "server/base64.h"
#include "server_test_util.h"
#include "test_util.h"

namespace diffuse {
namespace test_server {

using nlohmann::json;
using test::demo_png_base64;
using test::expect_error;
using test::finished_job;
using test::image_at;
using test::json_of;
using test::read_events;
using test::TestServer;

constexpr const char* kPrompt =
    "a red circle on the left and a blue square on the right on a yellow background";

void expect_healthy(httplib::Client& c) {
  auto status = c.Get("/v1/status");
  ASSERT_TRUE(status);
  EXPECT_EQ(status->status, 200);
  auto r = c.Post("/v1/jobs", json{{"prompt", kPrompt}, {"steps", 2}, {"seed", 1}}.dump(),
                  "application/json");
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 202) << r->body;
  EXPECT_EQ(finished_job(c, json_of(r)["id"])["state"], "succeeded");
}

TEST(Server, StatusReportsModelDeviceMemoryAndQueue) {
  TestServer server;
  auto c = server.client();
  auto s = json_of(c->Get("/v1/status"));
  EXPECT_EQ(s["engine"], "diffuse");
  EXPECT_EQ(s["model"], "demo");
  EXPECT_EQ(s["device"], "cpu");
  EXPECT_FALSE(s["dtype"].get<std::string>().empty());
  EXPECT_FALSE(s["attention"].get<std::string>().empty());
  EXPECT_GT(s["memory"]["rss_bytes"].get<int64_t>(), 0);
  EXPECT_GE(s["memory"]["peak_rss_bytes"].get<int64_t>(), s["memory"]["rss_bytes"].get<int64_t>());
  EXPECT_EQ(s["queue"]["waiting"], 0);
  EXPECT_TRUE(s["queue"]["running"].is_null());
  EXPECT_EQ(s["default_width"], 128);
}

TEST(Server, NativeJobStreamsEveryStepThenServesPngWithParameters) {
  TestServer server;
  auto c = server.client();
  auto r = c->Post("/v1/jobs", json{{"prompt", kPrompt}, {"steps", 5}, {"seed", 7}}.dump(),
                   "application/json");
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 202) << r->body;
  const std::string id = json_of(r)["id"];
  EXPECT_EQ(r->get_header_value("Location"), "/v1/jobs/" + id);
  auto events = read_events(*c, id);
  // Events carry the job's latest state: a client slower than the steps (a loaded machine)
  // sees fewer than one per step, but never one out of order, and the stream ends with "done".
  int progress = 0, previews = 0, last_step = 0;
  for (const auto& [name, data] : events) {
    if (name != "progress" || data["state"] != "running" || data["progress"]["step"] == 0) continue;
    ++progress;
    EXPECT_EQ(data["progress"]["total"], 5);
    EXPECT_GT(data["progress"]["step"].get<int>(), last_step);
    last_step = data["progress"]["step"].get<int>();
    if (data.contains("preview")) ++previews;
  }
  EXPECT_GE(progress, 1);
  EXPECT_LE(progress, 5);
  EXPECT_GE(previews, 1);
  ASSERT_EQ(events.back().first, "done");
  auto job = events.back().second;
  EXPECT_EQ(job["state"], "succeeded");
  EXPECT_EQ(job["progress"]["step"], 5);
  ASSERT_EQ(job["images"].size(), 1u);
  EXPECT_GT(job["timings"]["s_per_step"].get<double>(), 0);
  // The threads the steps ran on and whether other work crowded them out.
  EXPECT_GE(job["timings"]["cpu"]["threads"].get<int>(), 1);
  EXPECT_TRUE(job["timings"]["cpu"]["crowded"].is_boolean());
  std::map<std::string, std::string> text;
  Image img = image_at(*c, job["images"][0]["url"], &text);
  EXPECT_EQ(img.width, 128);
  EXPECT_EQ(img.height, 128);
  EXPECT_NE(text["parameters"].find("Seed: 7"), std::string::npos);
  EXPECT_NE(text["parameters"].find("Steps: 5"), std::string::npos);
  EXPECT_EQ(text["parameters"].rfind(kPrompt, 0), 0u);
  // The preview of the last step is kept.
  EXPECT_EQ(image_at(*c, "/v1/jobs/" + id + "/preview.png").width, 16);

  // Same request, same seed: the same pixels.
  auto again = c->Post("/v1/jobs", json{{"prompt", kPrompt}, {"steps", 5}, {"seed", 7}}.dump(),
                       "application/json");
  auto job2 = finished_job(*c, json_of(again)["id"]);
  EXPECT_EQ(image_at(*c, job2["images"][0]["url"]).rgb, img.rgb);
}

TEST(Server, NativeImg2ImgAndBatchOfPrompts) {
  TestServer server;
  auto c = server.client();
  auto r = c->Post("/v1/jobs",
                   json{{"prompt", kPrompt},
                        {"steps", 4},
                        {"strength", 0.5},
                        {"init_image", demo_png_base64(96, 64)}}
                       .dump(),
                   "application/json");
  ASSERT_EQ(r->status, 202) << r->body;
  auto job = finished_job(*c, json_of(r)["id"]);
  EXPECT_EQ(job["mode"], "img2img");
  ASSERT_EQ(job["state"], "succeeded") << job.dump();
  EXPECT_EQ(job["images"][0]["width"], 96);
  EXPECT_EQ(job["images"][0]["height"], 64);

  auto batch = c->Post(
      "/v1/jobs",
      json{{"prompt", {kPrompt, "a large green triangle in the center on a black background"}},
           {"steps", 2},
           {"num_images", 2},
           {"seed", 3}}
          .dump(),
      "application/json");
  auto b = finished_job(*c, json_of(batch)["id"]);
  ASSERT_EQ(b["images"].size(), 4u);
  EXPECT_EQ(b["images"][3]["prompt"], "a large green triangle in the center on a black background");
}

TEST(Server, CancelWaitingAndQueueFullWith503) {
  server::ServerOptions o;
  o.max_waiting = 2;
  TestServer server(o);
  auto c = server.client();
  server.queue().set_paused(true);  // nothing starts: the queue fills deterministically
  const std::string body = json{{"prompt", kPrompt}, {"steps", 2}}.dump();
  auto a = c->Post("/v1/jobs", body, "application/json");
  auto b = c->Post("/v1/jobs", body, "application/json");
  ASSERT_EQ(a->status, 202);
  ASSERT_EQ(b->status, 202);
  EXPECT_EQ(json_of(b)["position"], 2);
  auto full = c->Post("/v1/jobs", body, "application/json");
  expect_error(full, 503, "queue is full");
  EXPECT_GE(std::stoi(full->get_header_value("Retry-After")), 1);
  const std::string bid = json_of(b)["id"];
  auto del = c->Delete("/v1/jobs/" + bid);
  ASSERT_EQ(del->status, 202);
  EXPECT_EQ(json_of(del)["state"], "cancelled");
  EXPECT_EQ(json_of(c->Get("/v1/status"))["queue"]["rejected"], 1);
  server.queue().set_paused(false);
  EXPECT_EQ(finished_job(*c, json_of(a)["id"])["state"], "succeeded");
  EXPECT_EQ(json_of(c->Get("/v1/jobs/" + bid))["state"], "cancelled");
  expect_error(c->Delete("/v1/jobs/ffffffffffffffff"), 404, "no job");
}

TEST(Server, CancelRunningJobStopsItAtTheNextStep) {
  TestServer server;
  auto c = server.client();
  auto r =
      c->Post("/v1/jobs", json{{"prompt", kPrompt}, {"steps", 150}}.dump(), "application/json");
  const std::string id = json_of(r)["id"];
  // Cancel from the event stream as soon as the job reports its first step.
  std::string text;
  bool cancelled = false;
  auto cancel_client = server.client();
  c->Get("/v1/jobs/" + id + "/events", [&](const char* data, size_t n) {
    text.append(data, n);
    if (!cancelled && text.find("\"state\":\"running\"") != std::string::npos) {
      cancelled = true;
      EXPECT_EQ(cancel_client->Delete("/v1/jobs/" + id)->status, 202);
    }
    return true;
  });
  auto job = json_of(c->Get("/v1/jobs/" + id));
  EXPECT_EQ(job["state"], "cancelled");
  EXPECT_LT(job["progress"]["step"].get<int>(), 150);
  EXPECT_TRUE(job["images"].empty());
  expect_healthy(*c);
}

TEST(Server, A1111Txt2ImgImg2ImgAndMetadata) {
  TestServer server;
  auto c = server.client();
  auto r = c->Post("/sdapi/v1/txt2img",
                   json{{"prompt", kPrompt},
                        {"steps", 3},
                        {"seed", 5},
                        {"sampler_name", "Euler a"},
                        {"batch_size", 2},
                        {"cfg_scale", 7},
                        {"restore_faces", false}}
                       .dump(),
                   "application/json");
  ASSERT_EQ(r->status, 200) << r->body;
  auto j = json_of(r);
  ASSERT_EQ(j["images"].size(), 2u);
  for (const auto& b64 : j["images"]) {
    Image img =
        decode_png(server::base64_decode(b64.get<std::string>(), "image"), "image", 1 << 20);
    EXPECT_EQ(img.width, 128);
  }
  EXPECT_EQ(j["parameters"]["sampler_name"], "Euler a");
  EXPECT_EQ(j["parameters"]["seed"], 5);
  auto info = json::parse(j["info"].get<std::string>());
  EXPECT_EQ(info["seed"], 5);
  EXPECT_EQ(info["all_seeds"].size(), 2u);
  EXPECT_NE(info["infotexts"][0].get<std::string>().find("Sampler: euler_a"), std::string::npos);
  EXPECT_EQ(info["ignored_fields"], json::array({"restore_faces"}));

  auto i2i = c->Post("/sdapi/v1/img2img",
                     json{{"prompt", kPrompt},
                          {"steps", 4},
                          {"denoising_strength", 0.5},
                          {"init_images", {"data:image/png;base64," + demo_png_base64(64, 64)}}}
                         .dump(),
                     "application/json");
  ASSERT_EQ(i2i->status, 200) << i2i->body;
  EXPECT_EQ(json::parse(json_of(i2i)["info"].get<std::string>())["width"], 64);

  // A random seed (-1) is reported.
  auto rnd = json_of(c->Post("/sdapi/v1/txt2img",
                             json{{"prompt", kPrompt}, {"steps", 1}, {"seed", -1}}.dump(),
                             "application/json"));
  EXPECT_GE(json::parse(rnd["info"].get<std::string>())["seed"].get<int64_t>(), 0);
}

TEST(Server, A1111InfoEndpoints) {
  TestServer server;
  auto c = server.client();
  auto samplers = json_of(c->Get("/sdapi/v1/samplers"));
  ASSERT_TRUE(samplers.is_array());
  std::set<std::string> names;
  for (const auto& s : samplers) names.insert(s["name"]);
  EXPECT_TRUE(names.count("Euler a") && names.count("DPM++ 2M") && names.count("DDIM"));
  auto models = json_of(c->Get("/sdapi/v1/sd-models"));
  ASSERT_EQ(models.size(), 1u);
  EXPECT_EQ(models[0]["model_name"], "demo");
  EXPECT_EQ(json_of(c->Get("/sdapi/v1/options"))["sd_model_checkpoint"], "demo");
  EXPECT_EQ(
      c->Post("/sdapi/v1/options", R"({"sd_model_checkpoint": "demo", "samples_format": "png"})",
              "application/json")
          ->status,
      200);
  expect_error(
      c->Post("/sdapi/v1/options", R"({"sd_model_checkpoint": "sdxl"})", "application/json"), 400,
      "serves one model");
  auto progress = json_of(c->Get("/sdapi/v1/progress"));
  EXPECT_EQ(progress["progress"], 0.0);
  EXPECT_TRUE(progress["state"].contains("sampling_steps"));
  EXPECT_EQ(c->Post("/sdapi/v1/interrupt", "", "application/json")->status,
            200);  // nothing running: no-op
}

TEST(Server, A1111InterruptFinishesTheRunningRequestWithItsImageSoFar) {
  TestServer server;
  auto c = server.client();
  std::unique_ptr<httplib::Result> result;
  std::thread caller([&] {
    auto own = server.client();
    result = std::make_unique<httplib::Result>(own->Post(
        "/sdapi/v1/txt2img", json{{"prompt", kPrompt}, {"steps", 150}}.dump(), "application/json"));
  });
  // Wait until the job runs, then interrupt.
  std::string id;
  for (int tries = 0; id.empty() && tries < 100000; ++tries) {
    auto running = json_of(c->Get("/v1/status"))["queue"]["running"];
    if (running.is_object()) id = running["id"];
  }
  ASSERT_FALSE(id.empty());
  // As A1111 clients send it: requests.post(url + "/sdapi/v1/interrupt"), no body.
  EXPECT_EQ(c->Post("/sdapi/v1/interrupt")->status, 200);
  caller.join();
  ASSERT_TRUE(*result);
  ASSERT_EQ((*result)->status, 200) << (*result)->body;
  const auto body = json_of(*result);
  ASSERT_EQ(body["images"].size(), 1u);
  const auto image = decode_png(
      server::base64_decode(body["images"][0].get<std::string>(), "image"), "image", 1 << 20);
  EXPECT_EQ(image.width, 128);
  const auto info = nlohmann::json::parse(body["info"].get<std::string>());
  EXPECT_NE(info["warnings"].dump().find("interrupted after step"), std::string::npos)
      << info["warnings"].dump();
  EXPECT_EQ(json_of(c->Get("/sdapi/v1/progress"))["state"]["interrupted"], true);
  EXPECT_EQ(json_of(c->Get("/v1/jobs/" + id))["state"], "succeeded");
}

// Routes that A1111 and OpenAI clients call without a body answer the same to no body, an empty
// one and {} (issue 36: no body got 400).
TEST(Server, BodylessRoutesTakeNoBodyAnEmptyOneOrAnEmptyObject) {
  TestServer server;
  auto c = server.client();
  for (const char* path : {"/sdapi/v1/interrupt", "/sdapi/v1/skip"}) {
    SCOPED_TRACE(path);
    EXPECT_EQ(c->Post(path)->status, 200);
    EXPECT_EQ(c->Post(path, "", "application/json")->status, 200);
    EXPECT_EQ(c->Post(path, "{}", "application/json")->status, 200);
    EXPECT_EQ(c->Post(path, "", "text/plain")->status, 200);
  }
  // Neither Content-Length nor a body, as curl -X POST sends it (httplib's client always adds
  // Content-Length).
  for (const char* path : {"/sdapi/v1/interrupt", "/sdapi/v1/skip"}) {
    const std::string reply = test::raw_http_exchange(
        server.port(),
        std::string("POST ") + path + " HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n");
    EXPECT_EQ(reply.find("HTTP/1.1 200"), 0u) << path << ": " << reply;
  }
  // A route that needs a body says what is missing.
  const std::string reply = test::raw_http_exchange(
      server.port(),
      "POST /sdapi/v1/txt2img HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n");
  EXPECT_EQ(reply.find("HTTP/1.1 400"), 0u) << reply;
  EXPECT_NE(reply.find("has no Content-Length"), std::string::npos) << reply;
}

TEST(Server, OpenAiGenerationsAndEdits) {
  TestServer server;
  auto c = server.client();
  auto r = c->Post(
      "/v1/images/generations",
      json{{"prompt", kPrompt}, {"n", 2}, {"size", "128x128"}, {"model", "dall-e-3"}}.dump(),
      "application/json");
  ASSERT_EQ(r->status, 200) << r->body;
  auto j = json_of(r);
  EXPECT_GT(j["created"].get<int64_t>(), 0);
  ASSERT_EQ(j["data"].size(), 2u);
  EXPECT_EQ(
      decode_png(server::base64_decode(j["data"][0]["b64_json"].get<std::string>(), "b64_json"),
                 "x", 1 << 20)
          .width,
      128);

  auto u = json_of(
      c->Post("/v1/images/generations",
              json{{"prompt", kPrompt}, {"size", "64x96"}, {"response_format", "url"}}.dump(),
              "application/json"));
  const std::string url = u["data"][0]["url"];
  const std::string path = url.substr(url.find("/v1/"));
  Image img = image_at(*c, path);
  EXPECT_EQ(img.width, 64);
  EXPECT_EQ(img.height, 96);

  httplib::MultipartFormDataItems items = {
      {"image", server::base64_decode(demo_png_base64(128, 128), "png"), "in.png", "image/png"},
      {"prompt", kPrompt, "", ""},
      {"n", "1", "", ""}};
  auto e = c->Post("/v1/images/edits", items);
  ASSERT_EQ(e->status, 200) << e->body;
  EXPECT_EQ(json_of(e)["data"].size(), 1u);

  // The formats gpt-image-1 clients ask for, in JSON and in multipart fields.
  auto jpeg = c->Post("/v1/images/generations",
                      json{{"prompt", kPrompt},
                           {"size", "64x64"},
                           {"output_format", "jpeg"},
                           {"output_compression", 80}}
                          .dump(),
                      "application/json");
  ASSERT_EQ(jpeg->status, 200) << jpeg->body;
  EXPECT_EQ(json_of(jpeg)["output_format"], "jpeg");
  const auto jpeg_bytes =
      server::base64_decode(json_of(jpeg)["data"][0]["b64_json"].get<std::string>(), "b64_json");
  EXPECT_EQ(jpeg_bytes.substr(0, 2), "\xFF\xD8");
  httplib::MultipartFormDataItems webp_items = items;
  webp_items.push_back({"output_format", "webp", "", ""});
  webp_items.push_back({"output_compression", "60", "", ""});
  auto webp = c->Post("/v1/images/edits", webp_items);
  ASSERT_EQ(webp->status, 200) << webp->body;
  const auto webp_bytes =
      server::base64_decode(json_of(webp)["data"][0]["b64_json"].get<std::string>(), "b64_json");
  EXPECT_EQ(webp_bytes.substr(0, 4), "RIFF");
  EXPECT_EQ(webp_bytes.substr(8, 4), "WEBP");
  // A tiny upload is judged by the request rules (an image or a 4xx), never a 500.
  httplib::MultipartFormDataItems tiny = {
      {"image", server::base64_decode(demo_png_base64(8, 8), "png"), "in.png", "image/png"},
      {"prompt", kPrompt, "", ""}};
  auto t = c->Post("/v1/images/edits", tiny);
  ASSERT_TRUE(t);
  EXPECT_TRUE(t->status == 200 || (t->status >= 400 && t->status < 500)) << t->status << t->body;
  httplib::MultipartFormDataItems masked = items;
  masked.push_back({"mask", "x", "mask.png", "image/png"});
  expect_error(c->Post("/v1/images/edits", masked), 400, "mask is not a PNG");
  httplib::MultipartFormDataItems bad_n = {items[0], items[1], {"n", "two", "", ""}};
  expect_error(c->Post("/v1/images/edits", bad_n), 400, "n: expected an integer");
}

TEST(Server, ApiKeyGuardsEveryApiButNotThePage) {
  server::ServerOptions o;
  o.api_key = "s3cret-key";
  TestServer server(o);
  auto anon = server.client();
  expect_error(anon->Get("/v1/status"), 401, "API key");
  expect_error(anon->Post("/sdapi/v1/txt2img", "{}", "application/json"), 401, "API key");
  expect_error(server.client("wrong-key")->Get("/v1/status"), 401, "not valid");
  expect_error(server.client("s3cret-key-and-more")->Get("/v1/status"), 401, "not valid");
  EXPECT_EQ(server.client("s3cret-key")->Get("/v1/status")->status, 200);
  auto page = anon->Get("/");
  ASSERT_EQ(page->status, 200);
  EXPECT_NE(page->body.find("<html"), std::string::npos);
  EXPECT_EQ(anon->Get("/app.js")->status, 200);
}

TEST(Server, NonLoopbackHostNeedsAnApiKey) {
  server::ServerOptions o;
  o.host = "0.0.0.0";
  auto message =
      test::expect_throw<InvalidArgument>([&] { server::HttpServer s(test::demo_engine(), o); });
  EXPECT_NE(message.find("API key"), std::string::npos);
}

// cpp-httplib listens with a backlog of 5: with nobody accepting, the sixth connection of a
// burst would wait for a SYN retry (or be reset) instead of queueing for its 503.
TEST(Server, ABurstOfConnectionsQueuesForTheServer) {
  server::ServerOptions o;
  o.port = 0;
  server::HttpServer http(test::demo_engine(), o);
  const int port = http.bind();  // bound and listening, not yet accepting
  constexpr int kClients = 40;
  std::vector<pollfd> fds;
  for (int i = 0; i < kClients; ++i) {
    const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
    ASSERT_GE(fd, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>(port));
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
    fds.push_back({fd, POLLOUT, 0});
  }
  // Loopback handshakes complete at once when the queue has room; 20 s is only a bound.
  int connected = 0;
  for (int round = 0; round < 200 && connected < kClients; ++round) {
    ::poll(fds.data(), fds.size(), 100);
    connected = 0;
    for (auto& p : fds) {
      int error = 0;
      socklen_t len = sizeof error;
      if ((p.revents & POLLOUT) && ::getsockopt(p.fd, SOL_SOCKET, SO_ERROR, &error, &len) == 0 &&
          error == 0)
        ++connected;
    }
  }
  for (auto& p : fds) ::close(p.fd);
  EXPECT_EQ(connected, kClients);
}

TEST(Server, CorsOnlyWhenAsked) {
  {
    TestServer server;
    auto r = server.client()->Options("/v1/status");
    EXPECT_EQ(r->status, 405);
    EXPECT_FALSE(r->has_header("Access-Control-Allow-Origin"));
  }
  server::ServerOptions o;
  o.cors_origin = "http://localhost:3000";
  TestServer server(o);
  auto c = server.client();
  auto r = c->Options("/v1/jobs");
  EXPECT_EQ(r->status, 204);
  EXPECT_EQ(r->get_header_value("Access-Control-Allow-Origin"), "http://localhost:3000");
  EXPECT_EQ(c->Get("/v1/status")->get_header_value("Access-Control-Allow-Origin"),
            "http://localhost:3000");
}

TEST(Server, BadRequestsAre4xxAndTheServerStaysHealthy) {
  server::ServerOptions o;
  o.limits.max_body_bytes = 1 << 20;
  TestServer server(o);
  auto c = server.client();
  auto post = [&](const std::string& path, const std::string& body) {
    return c->Post(path, body, "application/json");
  };
  expect_error(post("/v1/jobs", "{\"prompt\": "), 400, "not valid JSON");
  expect_error(post("/v1/jobs", "[1, 2]"), 400, "must be a JSON object");
  expect_error(post("/v1/jobs", std::string(100, '[') + std::string(100, ']')), 400, "deeper than");
  expect_error(post("/v1/jobs", R"({"prompt": "x", "steps": "ten"})"), 400,
               "steps: expected an integer");
  expect_error(post("/v1/jobs", R"({"prompt": "x", "steps": 0})"), 400, "steps: 0 is out of range");
  expect_error(post("/v1/jobs", R"({"prompt": "x", "steps": 100000})"), 400, "steps");
  expect_error(post("/v1/jobs", R"({"prompt": 42})"), 400, "prompt: expected a string");
  expect_error(post("/v1/jobs", R"({"steps": 2})"), 400, "prompt: required");
  expect_error(post("/v1/jobs", R"({"prompt": "x", "width": 100000, "height": 100000})"), 400,
               "width");
  expect_error(post("/v1/jobs", R"({"prompt": ["x", "y"], "num_images": 9})"), 400,
               "limit per request");
  expect_error(post("/v1/jobs", R"({"prompt": "x", "width": 100})"), 400, "multiples of 8");
  expect_error(post("/v1/jobs", R"({"prompt": "x", "scheduler": "heun"})"), 400, "unknown 'heun'");
  expect_error(post("/v1/jobs", R"({"prompt": "x", "colour": "red"})"), 400,
               "unknown field 'colour'");
  expect_error(post("/v1/jobs", R"({"prompt": "x", "cache": "fbcache"})"), 400, "UNet");
  expect_error(post("/v1/jobs", R"({"prompt": "x", "vae_tile_size": 7})"), 400,
               "vae_tile_size: expected a multiple of 8 of at least 16");
  expect_error(post("/v1/jobs", R"({"prompt": "x", "guidance_scale": 1e400})"), 400,
               "number overflow");
  expect_error(post("/v1/jobs", R"({"prompt": "x", "guidance_scale": -3})"), 400, "guidance_scale");
  expect_error(post("/v1/jobs", json{{"prompt", std::string(5000, 'a')}}.dump()), 400,
               "at most 4000");
  expect_error(post("/v1/jobs", R"({"prompt": "x", "init_image": "@@not base64@@"})"), 400,
               "invalid base64");
  expect_error(
      post("/v1/jobs",
           json{{"prompt", "x"}, {"init_image", server::base64_encode("GIF89a....")}}.dump()),
      400, "not a PNG");
  // A PNG whose header claims 100000x100000 pixels: refused from the header.
  {
    std::string png = encode_png(Image{8, 8, std::vector<uint8_t>(8 * 8 * 3, 0)});
    const unsigned char big[4] = {0x00, 0x01, 0x86, 0xA0};  // 100000
    png.replace(16, 4, reinterpret_cast<const char*>(big), 4);
    png.replace(20, 4, reinterpret_cast<const char*>(big), 4);
    expect_error(
        post("/v1/jobs", json{{"prompt", "x"}, {"init_image", server::base64_encode(png)}}.dump()),
        400, "init_image");
  }
  expect_error(post("/v1/jobs", json{{"prompt", "x"}, {"blob", std::string(2 << 20, 'a')}}.dump()),
               413, "larger than");
  expect_error(post("/sdapi/v1/txt2img", R"({"prompt": "x", "sampler_name": "Heun++ 9000"})"), 400,
               "not available");
  expect_error(post("/sdapi/v1/txt2img", R"({"prompt": "x", "enable_hr": true})"), 400, "hires");
  expect_error(post("/sdapi/v1/img2img", R"({"prompt": "x"})"), 400, "init_images");
  expect_error(post("/sdapi/v1/img2img", R"({"prompt": "x", "init_images": ["AAAA"]})"), 400,
               "not a PNG");
  expect_error(post("/v1/images/generations", R"({"prompt": "x", "size": "huge"})"), 400, "size");
  expect_error(post("/v1/images/generations", R"({"prompt": "x", "size": "99999x99999"})"), 400,
               "limit");
  expect_error(post("/v1/images/generations", R"({"prompt": "x", "response_format": "jpeg"})"), 400,
               "response_format");
  expect_error(post("/v1/images/generations", R"({"prompt": "x", "background": "transparent"})"),
               400, "background");
  expect_error(post("/v1/images/generations", R"({"prompt": "x", "model": "midjourney"})"), 400,
               "not served here");
  expect_error(post("/sdapi/v1/txt2img", R"({"prompt": "x", "denoising_strength": 5})"), 400,
               "denoising_strength");
  expect_error(post("/v1/images/edits", R"({"prompt": "x"})"), 400, "multipart");
  expect_error(
      post("/v1/jobs", json{{"prompt", "x"}, {"init_image", demo_png_base64(1, 1)}}.dump()), 400,
      "the init image is 1x1 pixels: each side needs at least 8");
  expect_error(c->Post("/v1/images/edits", "no boundary anywhere in here",
                       "multipart/form-data; boundary=XYZ"),
               400, "could not be read");
  expect_error(c->Get("/v1/nothing-here"), 404, "no route");
  expect_error(c->Get("/v1/jobs/0123456789abcdef"), 404, "no job");
  expect_error(c->Get("/v1/jobs/0123456789abcdef/images/0.png"), 404, "no job");
  expect_healthy(*c);
}

TEST(Server, StopCancelsTheRunningJobAndServeReturns) {
  auto server = std::make_unique<TestServer>();
  auto c = server->client();
  auto r =
      c->Post("/v1/jobs", json{{"prompt", kPrompt}, {"steps", 150}}.dump(), "application/json");
  const std::string id = json_of(r)["id"];
  auto waiting =
      c->Post("/v1/jobs", json{{"prompt", kPrompt}, {"steps", 2}}.dump(), "application/json");
  for (int tries = 0; tries < 100000; ++tries)
    if (json_of(c->Get("/v1/jobs/" + id))["state"] == "running") break;
  server->http().stop(true);
  auto job = server->queue().get(id);
  ASSERT_TRUE(job);
  EXPECT_EQ(server::to_string(job->state), std::string("cancelled"));
  EXPECT_EQ(server::to_string(server->queue().get(json_of(waiting)["id"])->state),
            std::string("cancelled"));
  EXPECT_THROW(server->queue().submit(server::JobRequest{}), server::ShuttingDown);
  server.reset();  // joins the serving thread: serve() returned
}

}  // namespace test_server
}  // namespace diffuse
