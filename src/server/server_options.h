// How `diffuse serve` listens, and what it accepts from a request.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

namespace diffuse::server {

// Every limit is checked before anything big is allocated; a request beyond one is answered
// 4xx with a JSON error naming the limit.
struct ServerLimits {
  size_t max_body_bytes = 50u << 20;        // request body (base64 images included)
  int max_side = 2048;                      // width / height of a generated image
  int64_t max_pixels = 2048 * 2048;         // width * height of a generated image
  int64_t max_upload_pixels = 4096 * 4096;  // an uploaded image, checked from its header
  int max_steps = 150;
  int max_images = 16;  // per job: prompts x images per prompt x batch count
  size_t max_prompt_chars = 4000;
};

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 7860;  // 0 = any free port
  // Required to listen on anything but a loopback address; then every API request needs
  // "Authorization: Bearer KEY".
  std::string api_key;
  std::string cors_origin;  // empty = no CORS headers
  size_t max_waiting = 16;  // jobs waiting behind the running one; beyond: 503
  size_t keep_finished = 64;
  int http_threads = 32;       // connections served at once (event streams hold one each)
  std::string lora_dir;        // <lora:NAME:SCALE> in A1111 prompts: NAME.safetensors in here
  std::string controlnet_dir;  // ControlNet folders that requests name
  ServerLimits limits;
};

// Whether `host` is a loopback address (127.0.0.0/8, ::1, localhost).
bool is_loopback_host(const std::string& host);

}  // namespace diffuse::server
