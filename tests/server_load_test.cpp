// A bounded load test of diffuse serve (CTest label "load"): 8 concurrent clients make 200
// requests in all, a mix of small generations (native, AUTOMATIC1111, OpenAI), status polls
// and cancels, against one server with the demo model. Passes when no request failed other
// than the intended 503 (queue full) and cancel answers, every finished job's PNG decodes, and
// the process RSS after the run is within 10 % of the RSS after the first 20 requests.
#include <gtest/gtest.h>

#include <atomic>
#include <cstdio>
#include <mutex>

#include "device/memory.h"
#include "server/base64.h"
#include "server_test_util.h"

namespace diffuse {
namespace server_load_test {

using nlohmann::json;
using test::json_of;

constexpr int kClients = 8;
constexpr int kRequests = 200;
constexpr const char* kPrompt =
    "a yellow square at the top and a purple triangle at the bottom on a white background";

struct Tally {
  std::atomic<int> generations{0}, polls{0}, cancels{0}, busy{0}, failures{0}, pngs{0}, http{0};
  std::mutex m;
  std::vector<std::string> failure_notes;
  void fail(const std::string& what) {
    ++failures;
    std::lock_guard<std::mutex> lock(m);
    if (failure_notes.size() < 10) failure_notes.push_back(what);
  }
};

bool valid_png(const std::string& bytes) {
  try {
    Image img = decode_png(bytes, "result", 1 << 20);
    return img.width == 64 && img.height == 64;
  } catch (const std::exception&) {
    return false;
  }
}

void one_request(int i, httplib::Client& c, Tally& t) {
  const std::string small =
      json{{"prompt", kPrompt}, {"steps", 3}, {"width", 64}, {"height", 64}}.dump();
  switch (i % 10) {
    case 0:
    case 1:
    case 2: {  // native: submit, poll to the end, fetch the PNG
      ++t.http;
      auto r = c.Post("/v1/jobs", small, "application/json");
      if (r && r->status == 503) {
        ++t.busy;
        return;
      }
      if (!r || r->status != 202)
        return t.fail("POST /v1/jobs " + (r ? std::to_string(r->status) : "no answer"));
      const std::string id = json_of(r)["id"];
      ++t.http;
      c.Get("/v1/jobs/" + id + "/events?preview=0", [](const char*, size_t) { return true; });
      ++t.http;
      auto job = json_of(c.Get("/v1/jobs/" + id));
      if (job["state"] != "succeeded") return t.fail("job " + id + " " + job.dump().substr(0, 200));
      ++t.http;
      auto png = c.Get(job["images"][0]["url"].get<std::string>());
      if (!png || png->status != 200 || !valid_png(png->body))
        return t.fail("bad PNG of job " + id);
      ++t.generations;
      ++t.pngs;
      return;
    }
    case 3:
    case 4: {  // AUTOMATIC1111, synchronous
      ++t.http;
      auto r = c.Post("/sdapi/v1/txt2img", small, "application/json");
      if (r && r->status == 503) {
        ++t.busy;
        return;
      }
      if (!r || r->status != 200)
        return t.fail("a1111 " + (r ? std::to_string(r->status) + r->body : "no answer"));
      const auto images = json_of(r)["images"];
      if (images.size() != 1 ||
          !valid_png(server::base64_decode(images[0].get<std::string>(), "image")))
        return t.fail("a1111: bad image");
      ++t.generations;
      ++t.pngs;
      return;
    }
    case 5: {  // OpenAI, synchronous
      ++t.http;
      auto r = c.Post("/v1/images/generations", json{{"prompt", kPrompt}, {"size", "64x64"}}.dump(),
                      "application/json");
      if (r && r->status == 503) {
        ++t.busy;
        return;
      }
      if (!r || r->status != 200)
        return t.fail("openai " + (r ? std::to_string(r->status) : "no answer"));
      const auto data = json_of(r)["data"];
      if (data.size() != 1 ||
          !valid_png(server::base64_decode(data[0]["b64_json"].get<std::string>(), "image")))
        return t.fail("openai: bad image");
      ++t.generations;
      ++t.pngs;
      return;
    }
    case 6:
    case 7:
    case 8: {  // status polls
      ++t.http;
      auto r = c.Get(i % 2 ? "/v1/status" : "/sdapi/v1/progress?skip_current_image=true");
      if (!r || r->status != 200 || !json_of(r).is_object()) return t.fail("status poll");
      ++t.polls;
      return;
    }
    default: {  // submit and cancel at once: cancelled, or already done
      ++t.http;
      auto r =
          c.Post("/v1/jobs",
                 json{{"prompt", kPrompt}, {"steps", 20}, {"width", 64}, {"height", 64}}.dump(),
                 "application/json");
      if (r && r->status == 503) {
        ++t.busy;
        return;
      }
      if (!r || r->status != 202) return t.fail("POST for cancel");
      const std::string id = json_of(r)["id"];
      ++t.http;
      auto d = c.Delete("/v1/jobs/" + id);
      if (!d || (d->status != 202 && d->status != 200)) return t.fail("DELETE " + id);
      ++t.http;
      c.Get("/v1/jobs/" + id + "/events?preview=0", [](const char*, size_t) { return true; });
      const std::string state = json_of(c.Get("/v1/jobs/" + id))["state"];
      if (state != "cancelled" && state != "succeeded")
        return t.fail("cancelled job ended " + state);
      ++t.cancels;
      return;
    }
  }
}

TEST(ServerLoad, EightClientsTwoHundredRequests) {
  test::TestServer server;
  Tally t;
  std::atomic<int> next{0};
  std::atomic<int64_t> rss_after_20{0};
  std::atomic<int> done{0};
  std::vector<std::thread> clients;
  for (int k = 0; k < kClients; ++k)
    clients.emplace_back([&] {
      auto c = server.client();
      for (int i; (i = next++) < kRequests;) {
        one_request(i, *c, t);
        if (++done == 20) rss_after_20 = device::memory_stats().rss_bytes;
      }
    });
  for (auto& th : clients) th.join();
  const int64_t rss_end = device::memory_stats().rss_bytes;
  const double growth =
      static_cast<double>(rss_end) / static_cast<double>(rss_after_20.load()) - 1.0;
  const auto counts = server.queue().counts();
  std::printf(
      "load: %d clients, %d requests (%d HTTP calls): %d generations with valid PNGs, %d status "
      "polls, %d "
      "cancels, %d answered 503 (queue full), %d failed\n",
      kClients, kRequests, t.http.load(), t.pngs.load(), t.polls.load(), t.cancels.load(),
      t.busy.load(), t.failures.load());
  std::printf(
      "load: queue submitted %llu, succeeded %llu, cancelled %llu, failed %llu, rejected %llu\n",
      static_cast<unsigned long long>(counts.submitted),
      static_cast<unsigned long long>(counts.succeeded),
      static_cast<unsigned long long>(counts.cancelled),
      static_cast<unsigned long long>(counts.failed),
      static_cast<unsigned long long>(counts.rejected));
  std::printf("load: RSS after 20 requests %.1f MiB, after %d: %.1f MiB (%+.1f %%)\n",
              static_cast<double>(rss_after_20.load()) / 1048576.0, kRequests,
              static_cast<double>(rss_end) / 1048576.0, growth * 100.0);
  for (const auto& note : t.failure_notes) std::printf("load: failure: %s\n", note.c_str());
  EXPECT_EQ(t.failures.load(), 0);
  EXPECT_EQ(counts.failed, 0u);
  EXPECT_EQ(t.generations + t.polls + t.cancels + t.busy + t.failures, kRequests);
  EXPECT_GT(t.pngs.load(), 0);
#if defined(__SANITIZE_ADDRESS__)
  constexpr bool kAddressSanitizer = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
  constexpr bool kAddressSanitizer = true;
#else
  constexpr bool kAddressSanitizer = false;
#endif
#else
  constexpr bool kAddressSanitizer = false;
#endif
  // AddressSanitizer keeps freed memory in quarantine (256 MiB by default), so the RSS figure
  // says nothing about leaks there (+13 % measured). The release build keeps the check.
  if (!kAddressSanitizer) {
    EXPECT_LT(growth, 0.10);
  }
}

}  // namespace server_load_test
}  // namespace diffuse
