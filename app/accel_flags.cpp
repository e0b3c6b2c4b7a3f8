#include "accel_flags.h"

#include <cerrno>
#include <cmath>
#include <cstdlib>

#include "accel/dit_cache.h"
#include "diffuse/errors.h"
#include "io/string_split.h"

namespace diffuse::app {
namespace {

int parse_int(const std::string& text, const std::string& what) {
  errno = 0;
  char* end = nullptr;
  const long v = std::strtol(text.c_str(), &end, 10);
  if (text.empty() || *end != '\0' || errno == ERANGE || v < 0 || v > 1000000)
    throw InvalidArgument(what + ": expected a non-negative integer, got '" + text + "'");
  return static_cast<int>(v);
}

}  // namespace

void add_accel_flags(CLI::App& app, AccelFlags& f) {
  app.add_option("--deepcache", f.deepcache,
                 "DeepCache: a full UNet step every N steps, the shallow branch between "
                 "(N[:LAYER:BLOCK], cache_interval[:cache_layer_id:cache_block_id]; 1 = off)");
  app.add_option("--deepcache-schedule", f.deepcache_schedule,
                 "Where DeepCache's full steps go: uniform, or non-uniform (denser early)")
      ->capture_default_str()
      ->check(CLI::IsMember({"uniform", "non-uniform"}));
  app.add_option("--tome", f.tome,
                 "Token merging ratio in [0, 1): the fraction of tokens merged in the "
                 "highest-resolution self-attentions (0 = off)");
  app.add_option("--tome-layers", f.tome_layers,
                 "Transformers token merging applies to (e.g. down_blocks.0.attentions.0); "
                 "default: the first two down and last two up at the highest resolution");
  app.add_option("--tome-policy", f.tome_policy,
                 "auto: time the merged self-attentions against the plain ones at the run's "
                 "size first and leave merging out (with a warning) where it is not faster; "
                 "always: merge without measuring")
      ->capture_default_str()
      ->check(CLI::IsMember({"auto", "always"}));
  app.add_flag("--graph", f.graph,
               "CUDA / Ascend npu: record the UNet step once as a device graph (CUDA graph, "
               "torch_npu's NPUGraph) and replay it (bit-identical, less host work per step; not "
               "with --deepcache or --tome)");
  app.add_option("--cache", f.cache,
                 "DiT models (HiDream): skip part of the transformer on some steps: off, "
                 "fbcache[:THRESHOLD] (0.1), taylorseer[:INTERVAL[:ORDER]] (3:1), "
                 "ditcache[:FIRST:LAST[:INTERVAL]] (the middle half of the single-stream blocks, "
                 "every 2nd step)");
}

bool any_accel_flag(const AccelFlags& f) {
  return !f.deepcache.empty() || !f.tome.empty() || !f.tome_layers.empty() ||
         f.tome_policy != AccelFlags{}.tome_policy || f.graph;
}

void apply_accel_flags(const AccelFlags& f, GenerationConfig& g) {
  g.cuda_graph = f.graph;
  if (!f.deepcache.empty()) {
    const std::string flag = "--deepcache '" + f.deepcache + "'";
    const auto parts = io::split_fields(f.deepcache, ':');
    if (parts.size() != 1 && parts.size() != 3)
      throw InvalidArgument(flag +
                            ": expected N or N:LAYER:BLOCK (interval, cache_layer_id, "
                            "cache_block_id), e.g. 3 or 3:0:0");
    g.deep_cache.interval = parse_int(parts[0], flag + " interval");
    if (g.deep_cache.interval < 1)
      throw InvalidArgument(flag +
                            ": the interval must be >= 1 (1 = off, N = a full UNet "
                            "step every N steps), got " +
                            parts[0]);
    if (parts.size() == 3) {
      g.deep_cache.layer_id = parse_int(parts[1], flag + " layer id");
      g.deep_cache.block_id = parse_int(parts[2], flag + " block id");
    }
  }
  g.deep_cache.non_uniform = f.deepcache_schedule == "non-uniform";
  if (!f.tome.empty()) {
    errno = 0;
    char* end = nullptr;
    const double ratio = std::strtod(f.tome.c_str(), &end);
    if (*end != '\0' || errno == ERANGE || !(ratio >= 0 && ratio < 1))
      throw InvalidArgument("--tome '" + f.tome +
                            "': expected a ratio in [0, 1) (the fraction of tokens merged; 0 = "
                            "off)");
    g.token_merging.ratio = ratio;
  }
  g.token_merging.layers = f.tome_layers;
  g.token_merging.always = f.tome_policy == "always";
  if (!f.cache.empty()) g.dit_cache = accel::parse_dit_cache(f.cache);
}

}  // namespace diffuse::app
