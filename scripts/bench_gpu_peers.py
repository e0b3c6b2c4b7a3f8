#!/usr/bin/env python3
"""diffusers on the same GPU, the same shapes as `diffuse bench`: the peer half of
scripts/bench_gpu_peers.sh, which runs diffuse first and then this.

Times (wall clock, the device synchronised around each call, as diffuse's bench does):
  - the SD2.1-base UNet step (512x512, batch 2, fp16, SDPA), eager NCHW, eager channels-last,
    torch.compile (channels-last, as diffusers' docs advise), and compile mode reduce-overhead
    (CUDA graphs) when the time budget allows;
  - the VAE decode of one 512x512 image;
  - the whole 20-step image through StableDiffusionPipeline (DPM++ 2M from the folder's
    scheduler config, guidance 7.5), eager and with the compiled UNet;
  - the image from diffuse's own float32 noise through diffusers in fp16 and fp32 (parity:
    saved for --summarize, which compares them with diffuse's images of the same seed);
  - one full-size HiDream-I1 dual-stream and single-stream block (1024x1024: 4096 image tokens,
    384 text tokens, batch 2, bf16), eager and compiled.
Then `--summarize` prints both sides against the roofline diffuse measured in the same run.

Every phase runs under its own try: a phase that fails prints why and the others still run.
This is a measuring script for a lent GPU machine, not part of the product (which is C++).
"""
import argparse
import json
import os
import statistics
import sys
import time
import traceback


def log(msg):
    print(f"[peers {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def wall_times(fn, warmup, iters, sync):
    for _ in range(warmup):
        fn()
    sync()
    times = []
    for _ in range(iters):
        t0 = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t0)
    return times


def stats(times):
    return {"median_s": statistics.median(times), "min_s": min(times), "runs_s": times}


def run_peers(args):
    import torch

    out = {"phases": {}, "errors": {}}
    deadline = time.time() + args.budget_s

    def left():
        return deadline - time.time()

    def phase(name, fn, need_s=0):
        if args.phases and name not in args.phases.split(",") and name != "load":
            return
        if left() < need_s:
            out["errors"][name] = f"skipped: {left():.0f} s of the budget left, needs ~{need_s}"
            log(out["errors"][name])
            return
        log(f"{name} ...")
        t0 = time.time()
        try:
            out["phases"][name] = fn()
            log(f"{name}: {json.dumps(out['phases'][name], default=str)[:300]} ({time.time() - t0:.1f} s)")
        except Exception as e:  # noqa: BLE001 - a measuring script reports and goes on
            out["errors"][name] = f"{type(e).__name__}: {e}"
            log(f"{name} FAILED: {e}")
            traceback.print_exc()
        with open(args.out, "w") as f:
            json.dump(out, f, indent=1, default=str)

    import diffusers

    out["versions"] = {
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version(),
        "diffusers": diffusers.__version__,
        "gpu": torch.cuda.get_device_name(0),
    }
    try:
        import transformers

        out["versions"]["transformers"] = transformers.__version__
    except Exception as e:  # noqa: BLE001
        out["versions"]["transformers"] = f"unavailable: {e}"
    log(f"versions: {out['versions']}")
    dev = torch.device("cuda")
    sync = torch.cuda.synchronize
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_grad_enabled(False)

    state = {}

    def load():
        from diffusers import StableDiffusionPipeline

        t0 = time.time()
        pipe = StableDiffusionPipeline.from_pretrained(
            args.model, torch_dtype=torch.float16, safety_checker=None,
            requires_safety_checker=False)
        pipe = pipe.to(dev)
        pipe.set_progress_bar_config(disable=True)
        # diffuse's bench and txt2img run DPM++ 2M (--scheduler dpmpp_2m); a folder may name
        # another scheduler (create-demo-model writes SD's PNDM).
        from diffusers import DPMSolverMultistepScheduler

        pipe.scheduler = DPMSolverMultistepScheduler.from_config(pipe.scheduler.config)
        state["pipe"] = pipe
        return {"load_s": time.time() - t0, "scheduler": type(pipe.scheduler).__name__,
                "attention": type(pipe.unet.attn_processors[next(iter(pipe.unet.attn_processors))]).__name__}

    phase("load", load)
    if "pipe" not in state:
        return out
    pipe = state["pipe"]
    unet, vae = pipe.unet, pipe.vae
    g = torch.Generator("cpu").manual_seed(7)
    sample = torch.randn(2, unet.config.in_channels, args.height // 8, args.width // 8,
                         generator=g).to(dev, torch.float16)
    ctx = torch.randn(2, 77, unet.config.cross_attention_dim, generator=g).to(dev, torch.float16)
    t = torch.tensor(981.0, device=dev)
    z = torch.randn(1, vae.config.latent_channels, args.height // 8, args.width // 8,
                    generator=g).to(dev, torch.float16)

    def unet_step(m):
        return lambda: m(sample, t, encoder_hidden_states=ctx, return_dict=False)[0]

    phase("unet_eager", lambda: stats(wall_times(unet_step(unet), 5, args.steps, sync)))

    def unet_cl():
        unet.to(memory_format=torch.channels_last)
        r = stats(wall_times(unet_step(unet), 5, args.steps, sync))
        return r

    phase("unet_eager_channels_last", unet_cl)
    unet.to(memory_format=torch.contiguous_format)

    phase("vae_decode_eager",
          lambda: stats(wall_times(lambda: vae.decode(z, return_dict=False)[0], 2, 10, sync)))

    def image(tag):
        def run():
            gen = torch.Generator("cpu").manual_seed(args.seed)
            return pipe(args.prompt, num_inference_steps=args.image_steps, guidance_scale=7.5,
                        height=args.height, width=args.width, generator=gen,
                        output_type="np").images[0]

        sync()
        t0 = time.perf_counter()
        img = run()
        sync()
        first = time.perf_counter() - t0
        times = wall_times(run, 0, args.image_runs, sync)
        if tag == "eager":
            import numpy as np

            np.save(os.path.join(os.path.dirname(args.out), "diffusers_image.npy"),
                    (img * 255).round().astype("uint8"))
        r = stats(times)
        r["first_s"] = first
        return r

    phase("image_eager", lambda: image("eager"))

    def parity():
        """diffuse draws its noise as float32 from a CPU generator; diffusers' fp16 pipeline
        draws it in fp16 (11 random bits per value, not 24). The same float32 noise goes
        through diffusers in fp16 and in fp32, so --summarize can tell what the pipelines do
        apart from what the draw does apart."""
        import numpy as np
        from diffusers import DPMSolverMultistepScheduler, StableDiffusionPipeline

        shape = (1, unet.config.in_channels, args.height // 8, args.width // 8)
        noise = torch.randn(shape, generator=torch.Generator("cpu").manual_seed(args.seed),
                            dtype=torch.float32)
        r = {}

        def draw(p, latents, tag):
            img = p(args.prompt, num_inference_steps=args.image_steps, guidance_scale=7.5,
                    height=args.height, width=args.width, latents=latents,
                    output_type="np").images[0]
            np.save(os.path.join(os.path.dirname(args.out), f"diffusers_image_{tag}.npy"),
                    (img * 255).round().astype("uint8"))
            r[tag] = "saved"

        draw(pipe, noise.to(dev, torch.float16), "fp16_same_noise")
        p32 = StableDiffusionPipeline.from_pretrained(
            args.model, torch_dtype=torch.float32, safety_checker=None,
            requires_safety_checker=False).to(dev)
        p32.set_progress_bar_config(disable=True)
        p32.scheduler = DPMSolverMultistepScheduler.from_config(p32.scheduler.config)
        draw(p32, noise.to(dev), "fp32_same_noise")
        del p32
        torch.cuda.empty_cache()
        return r

    phase("parity", parity)

    # One full-size HiDream-I1 block of each kind, as `diffuse bench --arch hidream-i1`.
    def hidream(kind, compiled):
        def run():
            from diffusers.models.transformers.transformer_hidream_image import (
                HiDreamImageEmbedND, HiDreamImageSingleTransformerBlock,
                HiDreamImageTransformerBlock)

            dim, heads, head_dim, B = 2560, 20, 128, 2
            side = args.hidream_size // 16  # VAE factor 8, patch 2
            n_img, n_txt = side * side, 3 * 128
            torch.manual_seed(0)
            cls = HiDreamImageTransformerBlock if kind == "dual" else HiDreamImageSingleTransformerBlock
            block = cls(dim, heads, head_dim, num_routed_experts=4, num_activated_experts=2)
            block = block.to(dev, torch.bfloat16).eval()
            img = torch.randn(B, n_img, dim, device=dev, dtype=torch.bfloat16)
            txt = torch.randn(B, n_txt, dim, device=dev, dtype=torch.bfloat16)
            temb = torch.randn(B, dim, device=dev, dtype=torch.bfloat16)
            ids = torch.zeros(B, n_img + n_txt, 3)
            ids[:, :n_img, 1] = torch.arange(side).repeat_interleave(side).float()
            ids[:, :n_img, 2] = torch.arange(side).repeat(side).float()
            rope = HiDreamImageEmbedND(theta=10000, axes_dim=[64, 32, 32])(ids).to(dev)
            m = torch.compile(block) if compiled else block
            if kind == "dual":
                fn = lambda: m(hidden_states=img, hidden_states_masks=None,  # noqa: E731
                               encoder_hidden_states=txt, temb=temb, image_rotary_emb=rope)
            else:
                both = torch.cat([img, txt], 1)
                fn = lambda: m(hidden_states=both, hidden_states_masks=None,  # noqa: E731
                               encoder_hidden_states=None, temb=temb, image_rotary_emb=rope)
            t0 = time.perf_counter()
            fn()
            sync()
            first = time.perf_counter() - t0
            r = stats(wall_times(fn, 3, 10, sync))
            r["first_s"] = first
            r["tokens"] = {"image": n_img, "text": n_txt, "batch": B}
            del block, m
            torch.cuda.empty_cache()
            return r
        return run

    phase("hidream_dual_eager", hidream("dual", False))
    phase("hidream_single_eager", hidream("single", False))

    def compile_unet(mode):
        def run():
            import torch._dynamo

            torch._dynamo.reset()
            unet.to(memory_format=torch.channels_last)
            compiled = torch.compile(unet, mode=mode)
            sync()
            t0 = time.perf_counter()
            unet_step(compiled)()
            sync()
            compile_s = time.perf_counter() - t0
            r = stats(wall_times(unet_step(compiled), 3, args.steps, sync))
            r["compile_s"] = compile_s
            r["mode"] = mode or "default"
            state["compiled"] = compiled
            return r
        return run

    phase("unet_compile", compile_unet(None), need_s=150)
    if "compiled" in state:
        original = pipe.unet
        pipe.unet = state.pop("compiled")
        phase("image_compile", lambda: image("compile"), need_s=30)
        pipe.unet = original
    phase("unet_compile_reduce_overhead", compile_unet("reduce-overhead"), need_s=170)
    if "compiled" in state:
        original = pipe.unet
        pipe.unet = state.pop("compiled")
        phase("image_compile_reduce_overhead", lambda: image("compile-ro"), need_s=30)
        pipe.unet = original
    phase("hidream_dual_compile", hidream("dual", True), need_s=90)
    phase("hidream_single_compile", hidream("single", True), need_s=90)
    return out


def load_image(path):
    import numpy as np

    if path.endswith(".npy"):
        return np.load(path).astype(np.float64)
    from PIL import Image

    return np.asarray(Image.open(path).convert("RGB")).astype(np.float64)


def compare_images(a, b):
    """Largest and mean pixel difference and PSNR of two 8-bit images, as one line."""
    if not (os.path.exists(a) and os.path.exists(b)):
        return "not compared: " + ", ".join(os.path.basename(p) for p in (a, b)
                                              if not os.path.exists(p)) + " missing"
    try:
        import numpy as np

        x, y = load_image(a), load_image(b)
        if x.shape != y.shape:
            return f"shapes differ: {x.shape} and {y.shape}"
        diff = np.abs(x - y)
        mse = float((diff ** 2).mean())
        psnr = 10 * np.log10(255 ** 2 / mse) if mse > 0 else float("inf")
        return f"largest {diff.max():.0f}, mean {diff.mean():.2f}, PSNR {psnr:.1f} dB"
    except Exception as e:  # noqa: BLE001
        return f"not compared: {e}"


def summarize(args):
    """Both sides against the roofline diffuse measured: prints a table per workload."""
    d = args.dir

    def load(name):
        p = os.path.join(d, name)
        if not os.path.exists(p):
            return None
        try:
            with open(p) as f:
                return json.load(f)
        except Exception as e:  # noqa: BLE001
            print(f"{name}: unreadable ({e})")
            return None

    peers = load("diffusers.json") or {"phases": {}, "errors": {}}
    ph = peers["phases"]
    base = load("diffuse_default.json")
    if not base:
        print("no diffuse_default.json: diffuse's bench did not run")
    limit = base.get("roofline_limit_s", 0) if base else 0
    gflop = base.get("unet_gflop", 0) if base else 0
    print(f"versions: {peers.get('versions')}")
    if base:
        rl = base.get("roofline", {})
        print(f"roofline (diffuse, this run, fp16): matmul {rl.get('matmul_gflops', 0) / 1e3:.0f} "
              f"TFLOP/s, conv {rl.get('conv_gflops', 0) / 1e3:.0f} TFLOP/s; UNet step "
              f"{gflop:.0f} GFLOP -> limit {limit * 1e3:.2f} ms")

    def median(run):
        if not run:
            return 0
        xs = sorted(run)
        n = len(xs)
        return xs[n // 2] if n % 2 else (xs[n // 2 - 1] + xs[n // 2]) / 2

    rows = []
    for tag, label in [("default", "diffuse fp16 sdpa"),
                       ("cudnn_benchmark", "diffuse + cuDNN benchmark"),
                       ("channels_last", "diffuse + channels-last + cuDNN benchmark"),
                       ("graph", "diffuse + --graph + cuDNN benchmark"),
                       ("graph_channels_last", "diffuse + --graph + channels-last + benchmark")]:
        j = load(f"diffuse_{tag}.json")
        if j and "unet_steps_s" in j:
            u = j.get("unet", {})
            extra = ""
            if u.get("graph"):
                extra = " (graph output " + ("bit-identical)" if u.get("graph_identical") else
                                            f"differs by {u.get('graph_max_abs_diff')})")
            rows.append((label, median(j["unet_steps_s"]), extra,
                         j.get("vae_decode_s", 0)))
    for key, label in [("unet_eager", "diffusers eager"),
                       ("unet_eager_channels_last", "diffusers eager channels-last"),
                       ("unet_compile", "diffusers torch.compile (channels-last)"),
                       ("unet_compile_reduce_overhead", "diffusers compile reduce-overhead")]:
        if key in ph:
            extra = f" (compile {ph[key]['compile_s']:.0f} s)" if "compile_s" in ph[key] else ""
            rows.append((label, ph[key]["median_s"], extra, None))
    print("\nSD2.1-base UNet step, 512x512, batch 2, fp16 (median):")
    print(f"| {'who':48} | step ms | x limit | TFLOP/s |")
    print(f"|{'-' * 50}|---------|---------|---------|")
    for label, s, extra, _ in rows:
        ratio = s / limit if limit > 0 else 0
        tf = gflop / s / 1e3 if s > 0 else 0
        print(f"| {label:48} | {s * 1e3:7.2f} | {ratio:6.2f}x | {tf:7.1f} |{extra}")
    print("\nVAE decode, one 512x512 image, fp16 (diffuse: one warm decode; diffusers: median):")
    for label, _, _, v in rows:
        if v:
            print(f"  {label:48} {v * 1e3:7.1f} ms")
    if "vae_decode_eager" in ph:
        print(f"  {'diffusers eager':48} {ph['vae_decode_eager']['median_s'] * 1e3:7.1f} ms")
    print("\nWhole image, 20 steps DPM++ 2M, guidance 7.5, 512x512 (median of warm runs):")
    for tag, label in [("image_default", "diffuse eager"), ("image_best", "diffuse best")]:
        j = load(f"diffuse_{tag}.json")
        if j and "whole_image" in j:
            w = j["whole_image"]
            print(f"  {label:40} {w['generate_s']:6.3f} s (text {w['text_encode_s']:.3f} + denoise "
                  f"{w['denoise_s']:.3f} + decode {w['vae_decode_s']:.3f}; first run "
                  f"{w.get('first_generate_s', 0):.2f} s; limit {w.get('limit_s', 0):.3f} s)")
    for key, label in [("image_eager", "diffusers eager"), ("image_compile", "diffusers compile"),
                       ("image_compile_reduce_overhead", "diffusers compile reduce-overhead")]:
        if key in ph:
            print(f"  {label:40} {ph[key]['median_s']:6.3f} s (first run {ph[key]['first_s']:.2f} s)")
    print("\nHiDream-I1 block, 1024x1024 (4096 image + 384 text tokens), batch 2, bf16:")
    for name in sorted(os.listdir(d)):
        if not (name.startswith("diffuse_hidream") and name.endswith(".json")):
            continue
        hd = load(name)
        for key in ["dual_block", "single_block"] if hd else []:
            b = hd.get(key, {})
            if b:
                print(f"  diffuse {key:12} attention {hd.get('attention', '?'):6} best "
                      f"{b.get('best_s', 0) * 1e3:7.2f} ms, mean {b.get('mean_s', 0) * 1e3:7.2f} ms "
                      f"({b.get('gflop', 0):.0f} GFLOP, {100 * b.get('roofline_fraction', 0):.0f} % "
                      f"of the matmul roofline)")
    for key in ["hidream_dual_eager", "hidream_single_eager", "hidream_dual_compile",
                "hidream_single_compile"]:
        if key in ph:
            print(f"  diffusers {key[8:]:22} best {ph[key]['min_s'] * 1e3:7.2f} ms, median "
                  f"{ph[key]['median_s'] * 1e3:7.2f} ms (first call {ph[key]['first_s']:.1f} s)")
    print("\nSame seed, same folder: diffuse's image against diffusers' (pixels of 255):")
    for a, b, label in [
            ("diffuse_image.png", "diffusers_image.npy", "fp16, each its own draw"),
            ("diffuse_image.png", "diffusers_image_fp16_same_noise.npy",
             "fp16, diffuse's float32 noise in both"),
            ("diffuse_image_fp32.png", "diffusers_image_fp32_same_noise.npy",
             "fp32, diffuse's float32 noise in both"),
            ("diffuse_image_fp32.png", "diffuse_image.png", "diffuse fp32 against diffuse fp16")]:
        print(f"  {label:40} {compare_images(os.path.join(d, a), os.path.join(d, b))}")
    if peers.get("errors"):
        print("\ndiffusers phases not measured:")
        for k, v in peers["errors"].items():
            print(f"  {k}: {v}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", help="a diffusers SD folder (diffuse create-demo-model)")
    ap.add_argument("--out", help="JSON file to write")
    ap.add_argument("--summarize", action="store_true", help="print the table of --dir")
    ap.add_argument("--dir", help="folder of the run's JSON files (with --summarize)")
    ap.add_argument("--width", type=int, default=512)
    ap.add_argument("--height", type=int, default=512)
    ap.add_argument("--steps", type=int, default=20, help="timed UNet steps")
    ap.add_argument("--image-steps", type=int, default=20)
    ap.add_argument("--image-runs", type=int, default=3)
    ap.add_argument("--hidream-size", type=int, default=1024)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--prompt", default="a photograph of an astronaut riding a horse")
    ap.add_argument("--phases", default="",
                    help="comma-separated phases to run (default: all; load always runs)")
    ap.add_argument("--budget-s", type=float, default=300,
                    help="phases that would not fit in what is left are skipped")
    args = ap.parse_args()
    if args.summarize:
        summarize(args)
        return 0
    if not args.model or not args.out:
        ap.error("--model and --out are needed (or --summarize --dir)")
    run_peers(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
