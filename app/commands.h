// Sub-commands of the `diffuse` CLI. Each registers its flags on a CLI11 sub-app and returns
// the exit code when run. The CLI is thin: parse flags, call the library, print.
#pragma once
#include <CLI/CLI.hpp>

#include "bench/pipeline_bench.h"

#include <functional>
#include <utility>

namespace diffuse::app {

using Command = std::function<int()>;

Command add_verify_command(CLI::App& app);
Command add_txt2img_command(CLI::App& app);
Command add_img2img_command(CLI::App& app);
Command add_create_demo_command(CLI::App& app);
Command add_doctor_command(CLI::App& app);
Command add_bench_command(CLI::App& app);
Command add_train_demo_command(CLI::App& app);
// `bench --arch hidream-i1`: the HiDream block benchmark with the bench command's options.
int run_hidream_block_bench(const bench::PipelineBenchOptions& options, bool as_json);
// `bench --arch t5-xxl | llama-3.1-8b`: one forward of a full-size text encoder.
int run_text_encoder_bench(const bench::PipelineBenchOptions& options, bool as_json);
// `bench demo-quality`, registered on the bench sub-app: the sub-app and its runner.
std::pair<CLI::App*, Command> add_bench_demo_quality(CLI::App& bench);

}  // namespace diffuse::app
