"""The Python module (bindings/python/diffuse) on the demo model: images as NumPy arrays, seeds, progress
and cancellation (a callback's False, its exception, Ctrl-C), image-to-image, PNG files, and the
bad input a Python caller can make, each a diffuse.Error naming what was wrong, never a crash.

Run by CTest (`ctest -R python`), which sets PYTHONPATH to bindings/python and DIFFUSE_LIBRARY to the
built libdiffuse; DIFFUSE_SOURCE_DIR names the repository (for models/)."""

import os
import signal
import threading

import numpy as np
import pytest

import diffuse

SOURCE = os.environ.get("DIFFUSE_SOURCE_DIR", os.path.join(os.path.dirname(__file__), "..", ".."))
DEMO = os.path.join(SOURCE, "models", "demo")
DEMO_EDIT = os.path.join(SOURCE, "models", "demo-edit")
PROMPT = "a red circle on the left on a blue background"


@pytest.fixture(scope="module")
def pipe():
    with diffuse.Pipeline(DEMO, device="cpu", dtype="fp32") as p:
        yield p


def test_version_is_the_librarys():
    parts = diffuse.__version__.split(".")
    assert len(parts) == 3 and all(x.isdigit() for x in parts)


def test_txt2img_gives_an_rgb_array_and_the_same_seed_gives_the_same_image(pipe):
    a = pipe.txt2img(PROMPT, steps=2, seed=42)
    assert a.dtype == np.uint8 and a.shape == (128, 128, 3) and a.flags["C_CONTIGUOUS"]
    assert pipe.last_seed == 42 and pipe.last_seconds > 0
    assert a.std() > 0  # a picture, not a constant
    b = pipe.txt2img(PROMPT, steps=2, seed=42)
    assert np.array_equal(a, b)
    c = pipe.txt2img(PROMPT, steps=2, seed=43)
    assert not np.array_equal(a, c)


def test_a_random_seed_is_reported(pipe):
    a = pipe.txt2img(PROMPT, steps=1, seed=-1)
    seed = pipe.last_seed
    assert 0 <= seed < 2**53
    assert np.array_equal(a, pipe.txt2img(PROMPT, steps=1, seed=seed))


def test_progress_sees_every_step_and_false_cancels(pipe):
    seen = []
    pipe.txt2img(PROMPT, steps=3, seed=1, progress=lambda s, t: seen.append((s, t)))
    assert seen == [(1, 3), (2, 3), (3, 3)]
    calls = []

    def stop_at_two(step, total):
        calls.append(step)
        return step < 2

    with pytest.raises(diffuse.CancelledError):
        pipe.txt2img(PROMPT, steps=5, seed=1, progress=stop_at_two)
    assert calls == [1, 2]


def test_an_exception_in_the_callback_cancels_and_propagates(pipe):
    calls = []

    def broken(step, total):
        calls.append(step)
        raise ZeroDivisionError("from the callback")

    with pytest.raises(ZeroDivisionError, match="from the callback"):
        pipe.txt2img(PROMPT, steps=4, seed=1, progress=broken)
    assert calls == [1]
    # The pipeline is still usable.
    assert pipe.txt2img(PROMPT, steps=1, seed=1).shape == (128, 128, 3)


def test_ctrl_c_cancels_the_job_at_the_next_step(pipe):
    steps = []

    def interrupt_once(step, total):
        steps.append(step)
        if step == 1:
            os.kill(os.getpid(), signal.SIGINT)  # what Ctrl-C does

    # Python's own SIGINT handler, as in an interactive session (a process started in the
    # background inherits SIGINT ignored, and then Python installs none).
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(KeyboardInterrupt):
            pipe.txt2img(PROMPT, steps=6, seed=1, progress=interrupt_once)
    finally:
        signal.signal(signal.SIGINT, previous)
    assert steps == [1]


def test_img2img_from_an_array_a_pillow_image_and_rgba(pipe):
    src = pipe.txt2img(PROMPT, steps=2, seed=7)
    out = pipe.img2img(src, "a red circle on the left on a green background", strength=0.6,
                       steps=4, seed=7)
    assert out.shape == src.shape and not np.array_equal(out, src)
    rgba = np.concatenate([src, np.full(src.shape[:2] + (1,), 255, np.uint8)], axis=2)
    assert np.array_equal(pipe.img2img(rgba, "x", strength=0.6, steps=4, seed=7),
                          pipe.img2img(src, "x", strength=0.6, steps=4, seed=7))
    # A non-contiguous view is accepted (copied).
    assert pipe.img2img(src[:, ::-1], "x", strength=0.5, steps=2, seed=7).shape == src.shape
    pil = pytest.importorskip("PIL.Image")
    im = diffuse.to_pil(src)
    assert im.size == (128, 128) and im.mode == "RGB"
    assert np.array_equal(pipe.img2img(im, "x", strength=0.6, steps=4, seed=7),
                          pipe.img2img(src, "x", strength=0.6, steps=4, seed=7))
    assert isinstance(im, pil.Image)


def test_png_files_round_trip(pipe, tmp_path):
    a = pipe.txt2img(PROMPT, steps=1, seed=3)
    path = tmp_path / "out.png"
    diffuse.write_png(a, path)
    assert np.array_equal(diffuse.read_png(path), a)
    with pytest.raises(diffuse.IoError):
        diffuse.read_png(tmp_path / "missing.png")
    (tmp_path / "bad.png").write_bytes(b"\x89PNG\r\n\x1a\nnot really")
    with pytest.raises(diffuse.Error):
        diffuse.read_png(tmp_path / "bad.png")
    with pytest.raises(diffuse.IoError):
        diffuse.write_png(a, tmp_path / "no" / "such" / "dir.png")


@pytest.mark.parametrize(
    "image, message",
    [
        (np.zeros((8, 8, 3), np.float32), "uint8"),
        (np.zeros((8, 8), np.uint8), "shape"),
        (np.zeros((8, 8, 2), np.uint8), "shape"),
        (np.zeros((0, 8, 3), np.uint8), "empty"),
        ("not an image", "uint8"),
    ],
)
def test_a_bad_image_is_refused_with_the_reason(pipe, image, message):
    with pytest.raises(diffuse.InvalidArgumentError, match=message):
        pipe.img2img(image, PROMPT, steps=1)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(prompt=None), "prompt"),
        (dict(prompt=12), "prompt"),
        (dict(prompt="bad \ud800 surrogate"), "UTF-8"),
        (dict(prompt="nul\0inside"), "NUL"),
        (dict(steps=-1), "steps"),
        (dict(steps=1.5), "steps"),
        (dict(width=True), "width"),
        (dict(seed=-2), "seed"),
        (dict(seed=2**64), "seed"),
        (dict(guidance_scale=float("nan")), "guidance_scale"),
        (dict(guidance_scale="high"), "guidance_scale"),
        (dict(scheduler="warp"), "scheduler"),
        (dict(progress=5), "progress"),
    ],
)
def test_bad_arguments_are_refused_with_the_field(pipe, kwargs, message):
    args = dict(prompt=PROMPT, steps=1, seed=1)
    args.update(kwargs)
    prompt = args.pop("prompt")
    with pytest.raises(diffuse.InvalidArgumentError, match=message):
        pipe.txt2img(prompt, **args)


def test_an_edit_is_not_a_stable_diffusion_models_job(pipe):
    assert not pipe.can_edit
    img = pipe.txt2img(PROMPT, steps=1, seed=1)
    with pytest.raises(diffuse.UnsupportedError):
        pipe.edit(img, "make the background green", steps=1)


def test_a_missing_model_or_device_is_an_error():
    with pytest.raises(diffuse.IoError) as e:
        diffuse.Pipeline("/nonexistent/model")
    assert isinstance(e.value, OSError) and "/nonexistent/model" in str(e.value)
    with pytest.raises(diffuse.Error):
        diffuse.Pipeline(DEMO, device="warp-drive")
    with pytest.raises(diffuse.InvalidArgumentError, match="model"):
        diffuse.Pipeline(None)
    with pytest.raises(diffuse.InvalidArgumentError, match="dtype"):
        diffuse.Pipeline(DEMO, dtype=16)


def test_a_closed_pipeline_refuses_jobs():
    p = diffuse.Pipeline(DEMO, device="cpu", dtype="fp32")
    p.close()
    p.close()  # twice is fine
    with pytest.raises(diffuse.InvalidArgumentError, match="closed"):
        p.txt2img(PROMPT, steps=1)
    with pytest.raises(diffuse.InvalidArgumentError, match="closed"):
        _ = p.can_edit
    assert "closed" in repr(p)


def test_two_threads_share_one_pipeline(pipe):
    expected = {s: pipe.txt2img(PROMPT, steps=2, seed=s) for s in (11, 12)}
    got, errors = {}, []

    def job(seed):
        try:
            got[seed] = pipe.txt2img(PROMPT, steps=2, seed=seed)
        except Exception as e:  # reported below
            errors.append(e)

    threads = [threading.Thread(target=job, args=(s,)) for s in (11, 12)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    for s in (11, 12):
        assert np.array_equal(got[s], expected[s])


@pytest.mark.skipif(not os.path.exists(os.path.join(DEMO_EDIT, "model_index.json")),
                    reason="no editing model shipped (models/demo-edit)")
def test_an_edit_with_the_hidream_demo():
    with diffuse.Pipeline(DEMO_EDIT, device="cpu", dtype="fp32") as p:
        assert p.can_edit
        src = p.txt2img("a red circle in the center on a blue background", seed=1, steps=4)
        out = p.edit(src, "make the background green", seed=1, steps=4)
        assert out.shape == src.shape and out.dtype == np.uint8
        assert not np.array_equal(out, src)
