// `diffuse train-demo --arch hidream-e1`: a small HiDream-architecture model trained from scratch
// on the demo world with the engine's own modules and LibTorch's autograd: the Flux-style
// 16-channel AutoencoderKL first, then the sparse DiT (HiDreamImageTransformer2DModel) together
// with all four text encoders (CLIP-L and CLIP-G with the project's BPE vocabulary, T5 with a
// SentencePiece model and Llama with a byte-level BPE tokenizer.json, both trained here on the
// world's captions), by flow matching, on two jobs at once: HiDream-I1 text-to-image on
// captions and HiDream-E1 instruction editing (the source latents beside the noisy target along
// the width, E1's prompt format, text and image dropped for both guidances). The folder loads
// through the normal HiDream path, like a real HiDream folder.
#pragma once
#include "train/demo_trainer.h"

namespace diffuse::train {

TrainReport train_hidream_demo(const TrainDemoOptions& options, const TrainCallback& on_progress,
                               const std::atomic<bool>* cancel);

}  // namespace diffuse::train
