// The memory plan of a generation, decided before any weight loads: which networks stay
// resident, which stream block by block from their files, which are freed after their stage,
// and whether the VAE runs in tiles. One planner for every family; each family only says what
// its networks weigh and what its stages hold (pipeline/memory_plan_folder.h builds that from a
// folder's configs and weight headers).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace diffuse::pipeline {

// One network as it will sit in memory.
struct NetworkWeights {
  std::string component;      // "text_encoder_4", "transformer", "vae"
  std::string label;          // what a user calls it: "Llama", "T5", "transformer", "UNet"
  int64_t bytes = 0;          // resident in the run dtype (or as stored when quantized)
  int64_t largest_unit = 0;   // the largest block streaming holds at once; 0 = cannot stream
  int64_t outside_units = 0;  // what stays resident while the blocks stream (embeddings, heads)
  // The same network under --weights (its linear layers in blocks); 0 when not quantizable.
  int64_t quantized_bytes = 0;
  int64_t parameters = 0;  // elements (a GGUF: its bytes, about one per element at q8_0)
};

struct PlanRequest {
  std::string device;  // "cpu", "cuda:0": for the line and the messages
  int64_t budget = 0;  // bytes the run may hold; <= 0: unknown (nothing is decided for memory)
  bool budget_given = false;  // from --max-memory rather than what the device has free
  std::vector<NetworkWeights> text_encoders;  // run in this order
  NetworkWeights denoiser;                    // the UNet or transformer
  NetworkWeights vae;
  // Held beside the others through every stage (Stable Diffusion's ControlNets).
  std::vector<NetworkWeights> held;
  std::string denoiser_dtype;  // "bf16": for the line
  // Working memory of the stages beyond the weights (estimates, see memory_plan_folder.h).
  int64_t text_activations = 0;
  int64_t step_activations = 0;
  int64_t vae_activations = 0;        // the whole image at once
  int64_t vae_tiled_activations = 0;  // in tiles (0: the VAE cannot tile)
  std::string size;                   // "1024x1024": for the advice
  // What the user asked for.
  std::string streaming = "auto";           // auto|on|off
  std::string weight_type;                  // "" (plain) or "q8_0", "q4_0", "int8"
  std::string vae_tiling = "auto";          // auto|on|off
  bool keep_text_encoders = false;          // kept after encoding (a server) instead of freed
  bool text_one_at_a_time_possible = true;  // the pipeline can load its encoders one by one
  // How the pipeline holds its networks. kPlanned: as the plan decides (the DiT pipelines).
  // kPerStage: each network loaded for its stage and freed after it (Stable Diffusion's single
  // generation). kAllResident: every network loaded once and kept (Stable Diffusion's batch
  // and server).
  enum class Residency { kPlanned, kPerStage, kAllResident } residency = Residency::kPlanned;
};

struct StagePeak {
  std::string stage;  // "text encode", "denoise", "VAE decode"
  int64_t bytes = 0;
};

struct MemoryPlan {
  bool fits = true;
  bool text_one_at_a_time = false;  // each encoder loaded, run and freed before the next
  bool keep_text_encoders = false;  // after encoding (only when asked and it fits)
  bool stream_denoiser = false;
  bool quantized_denoiser = false;
  // The denoiser is freed before the next prompt's encoders load (they do not fit beside it).
  bool free_denoiser_for_text = false;
  bool vae_tiled = false;
  std::vector<StagePeak> peaks;
  int64_t peak = 0;
  int64_t denoiser_parameters = 0;
  int64_t budget = 0;
  std::string line;    // "plan: ..." for a user
  std::string advice;  // when !fits: why, and what would fit
};

// The plan for `request`: the cheapest one in time that fits the budget (resident before
// streamed, encoders together before one at a time, the whole VAE before tiles), honouring
// what the user forced. With an unknown budget everything stays as asked (resident, together).
MemoryPlan plan_memory(const PlanRequest& request);

// A denoiser call's multiply-adds as FLOPs: 2 per parameter per token, for the CPU thread policy
// (device/cpu_threads.h: tiny models run on one thread).
inline double denoiser_call_flops(const MemoryPlan& plan, int64_t tokens) {
  return 2.0 * static_cast<double>(plan.denoiser_parameters) * static_cast<double>(tokens);
}

// "16.5 GiB" / "850 MiB".
std::string format_memory(int64_t bytes);
// "24G", "24GiB", "24000M", "1.5T", plain bytes: InvalidArgument naming `flag` otherwise.
int64_t parse_memory_size(const std::string& text, const std::string& flag);

}  // namespace diffuse::pipeline
