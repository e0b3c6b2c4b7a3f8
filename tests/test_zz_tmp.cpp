#include <gtest/gtest.h>
#include <torch/torch.h>
#include <ATen/record_function.h>
#include <chrono>
#include <map>
#include "bench/arch_configs.h"
#include "models/unet2d_condition.h"
#include "nn/layers.h"
#include "nn/random_init.h"
#include "nn/attention.h"
using namespace diffuse;
static double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }
static thread_local int depth = 0;
static std::map<std::string, std::pair<double,int>> stats;
struct Ctx : at::ObserverContext { double t; std::string name; };
static std::unique_ptr<at::ObserverContext> st(const at::RecordFunction& fn) {
  auto c = std::make_unique<Ctx>(); c->t = now(); c->name = fn.name();
  if (depth == 0) { std::string s; for (auto& i : fn.inputs()) if (i.isTensor()) { s += c10::str(i.toTensor().sizes()); s += i.toTensor().is_contiguous() ? "" : "nc"; break;} c->name += " " + s; }
  else c->name = "";
  depth++; return c;
}
static void en(const at::RecordFunction&, at::ObserverContext* c) { depth--; auto* x = (Ctx*)c; if (!x->name.empty()) { auto& e = stats[x->name]; e.first += now() - x->t; e.second++; } }
TEST(ZZTmp, Unet) {
  torch::InferenceMode g;
  auto cfg = models::UNet2DConditionConfig::from_json(io::JsonConfig(bench::builtin_arch("sd2.1-base").unet, "x"));
  auto dt = getenv("ZZ_FP32") ? torch::kFloat32 : torch::kBFloat16;
  models::UNet2DConditionModel m{nullptr};
  { nn::SkipInitGuard gd(dt); m = models::UNet2DConditionModel(cfg); } { nn::init_pooled_random_weights(*m, 1); m->to(dt); }
  if (getenv("ZZ_ATT")) nn::set_default_attention_backend(nn::parse_attention_backend(getenv("ZZ_ATT")));
  auto x = torch::randn({2, 4, 64, 64}).to(dt), ctx = torch::randn({2, 77, 1024}).to(dt);
  m->forward(x, torch::tensor(500), ctx);
  auto h = at::addThreadLocalCallback(at::RecordFunctionCallback(st, en).needsInputs(true));
  double t = now(); m->forward(x, torch::tensor(500), ctx); double total = now() - t;
  at::removeCallback(h);
  std::map<std::string, std::pair<double,int>> byop;
  for (auto& kv : stats) { auto op = kv.first.substr(0, kv.first.find(' ')); byop[op].first += kv.second.first; byop[op].second += kv.second.second; }
  std::vector<std::pair<double, std::string>> v; for (auto& kv : byop) v.push_back({kv.second.first, kv.first + " x" + std::to_string(kv.second.second)});
  std::sort(v.rbegin(), v.rend());
  printf("total %.3f\n", total); for (auto& e : v) if (e.first > 0.01) printf("%8.3f %s\n", e.first, e.second.c_str());
  std::vector<std::pair<double, std::string>> w; for (auto& kv : stats) w.push_back({kv.second.first, kv.first + " x" + std::to_string(kv.second.second)});
  std::sort(w.rbegin(), w.rend()); for (int i = 0; i < 40 && i < (int)w.size(); ++i) printf("   %8.3f %s\n", w[i].first, w[i].second.c_str());
}
