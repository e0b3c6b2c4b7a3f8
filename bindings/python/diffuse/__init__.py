"""diffuse from Python: load a diffusion model once, then text-to-image, image-to-image and
instruction edits into NumPy arrays.

    import diffuse
    p = diffuse.Pipeline("models/demo")
    img = p.txt2img("a red circle on the left on a blue background", seed=42)
    img.shape, img.dtype          # (128, 128, 3) uint8
    diffuse.to_pil(img).save("out.png")   # where Pillow is installed (or diffuse.write_png)

Images are NumPy uint8 arrays of shape (height, width, 3); an input may also be a Pillow image
or any array-like of that shape (an alpha channel is dropped). Every failure is an exception of
a subclass of `diffuse.Error` that says what was wrong; Ctrl-C during a job cancels it at the
next step and raises KeyboardInterrupt, and an exception raised by a progress callback cancels
the job and propagates.
"""

import ctypes
import os
import threading

import numpy as np

from . import _capi

__all__ = [
    "Pipeline",
    "Error",
    "InvalidArgumentError",
    "IoError",
    "FormatError",
    "DeviceError",
    "CancelledError",
    "UnsupportedError",
    "InternalError",
    "read_png",
    "write_png",
    "to_pil",
    "__version__",
]

_lib = _capi.load()
__version__ = _lib.diffuse_version().decode()


class Error(Exception):
    """A failed call; `status` is the C API's status code."""

    status = _capi.INTERNAL


class InvalidArgumentError(Error, ValueError):
    status = _capi.INVALID_ARGUMENT


class IoError(Error, OSError):
    status = _capi.IO


class FormatError(Error, ValueError):
    status = _capi.FORMAT


class DeviceError(Error, RuntimeError):
    status = _capi.DEVICE


class CancelledError(Error):
    status = _capi.CANCELLED


class UnsupportedError(Error, NotImplementedError):
    status = _capi.UNSUPPORTED


class InternalError(Error, RuntimeError):
    status = _capi.INTERNAL


_ERRORS = {
    cls.status: cls
    for cls in (
        InvalidArgumentError,
        IoError,
        FormatError,
        DeviceError,
        CancelledError,
        UnsupportedError,
        InternalError,
    )
}


def _check(status):
    if status != _capi.OK:
        message = (_lib.diffuse_last_error() or b"").decode("utf-8", "replace")
        raise _ERRORS.get(status, Error)(message or f"diffuse call failed (status {status})")


def _text(value, field, required=False):
    if value is None:
        if required:
            raise InvalidArgumentError(f"{field}: required")
        return None
    if isinstance(value, bytes):
        data = value
    elif isinstance(value, str):
        try:
            data = value.encode("utf-8")
        except UnicodeEncodeError as e:
            raise InvalidArgumentError(f"{field}: not encodable as UTF-8 ({e.reason})") from None
    else:
        raise InvalidArgumentError(f"{field}: expected a str, got {type(value).__name__}")
    if b"\0" in data:
        raise InvalidArgumentError(f"{field}: contains a NUL character")
    return data


def _path(value, field):
    """A str, bytes or os.PathLike path as UTF-8 bytes."""
    try:
        value = os.fspath(value)
    except TypeError:
        raise InvalidArgumentError(
            f"{field}: expected a path, got {type(value).__name__}"
        ) from None
    return _text(value, field, True)


def _as_rgb(image, field="image"):
    """An (H, W, 3) C-contiguous uint8 array from a NumPy array, a Pillow image or an array-like."""
    if hasattr(image, "convert") and hasattr(image, "mode"):  # a Pillow image
        image = image.convert("RGB")
    try:
        a = np.asarray(image)
    except Exception as e:
        raise InvalidArgumentError(f"{field}: not an image ({e})") from None
    if a.dtype != np.uint8:
        raise InvalidArgumentError(
            f"{field}: expected uint8 pixels, got {a.dtype} (convert with .astype(np.uint8)"
            " after scaling to 0..255)"
        )
    if a.ndim != 3 or a.shape[2] not in (3, 4):
        raise InvalidArgumentError(
            f"{field}: expected an array of shape (height, width, 3), got {a.shape}"
        )
    if a.shape[0] == 0 or a.shape[1] == 0:
        raise InvalidArgumentError(f"{field}: the image is empty ({a.shape})")
    return np.ascontiguousarray(a[:, :, :3])


def _c_image(rgb):
    img = _capi.Image()
    img.height, img.width = int(rgb.shape[0]), int(rgb.shape[1])
    img.rgb = rgb.ctypes.data_as(ctypes.POINTER(ctypes.c_uint8))
    return img


def _take(img):
    """Copies an image the library allocated into NumPy and frees it."""
    try:
        if not img.rgb or img.width <= 0 or img.height <= 0:
            raise InternalError("the library returned an empty image")
        n = img.width * img.height * 3
        buf = ctypes.cast(img.rgb, ctypes.POINTER(ctypes.c_uint8 * n)).contents
        return np.frombuffer(buf, dtype=np.uint8).reshape(img.height, img.width, 3).copy()
    finally:
        _lib.diffuse_image_free(ctypes.byref(img))


def read_png(path):
    """A PNG file as an (H, W, 3) uint8 array."""
    img = _capi.Image()
    _check(_lib.diffuse_image_read_png(_path(path, "path"), ctypes.byref(img)))
    return _take(img)


def write_png(image, path):
    """Writes an (H, W, 3) uint8 image as PNG (the file appears whole or not at all)."""
    rgb = _as_rgb(image)
    img = _c_image(rgb)
    _check(_lib.diffuse_image_write_png(ctypes.byref(img), _path(path, "path")))


def to_pil(image):
    """The image as a Pillow image (needs Pillow: python3-pil)."""
    try:
        from PIL import Image as PILImage
    except ImportError:
        raise ImportError("to_pil needs Pillow (Debian: apt install python3-pil)") from None
    return PILImage.fromarray(_as_rgb(image), "RGB")


class Pipeline:
    """A loaded model: a Stable Diffusion or HiDream diffusers folder, or a single-file
    checkpoint. device: "auto", "cpu", "cuda[:N]", "npu[:N]"; dtype: "auto", "fp32", "bf16",
    "fp16". One job runs at a time per pipeline (calls from several threads wait their turn)."""

    def __init__(self, model, device="auto", dtype="auto"):
        self._handle = None
        self._lock = threading.Lock()
        self.last_seed = None
        self.last_seconds = None
        handle = ctypes.c_void_p()
        _check(
            _lib.diffuse_pipeline_open(
                _path(model, "model"),
                _text(device, "device"),
                _text(dtype, "dtype"),
                ctypes.byref(handle),
            )
        )
        self._handle = handle
        self.model = os.fsdecode(os.fspath(model))

    def close(self):
        """Frees the model's memory now (also done when the object is collected)."""
        with self._lock:
            if self._handle is not None:
                _lib.diffuse_pipeline_free(self._handle)
                self._handle = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        handle = getattr(self, "_handle", None)
        if handle is not None and _lib is not None:
            _lib.diffuse_pipeline_free(handle)
            self._handle = None

    def __repr__(self):
        state = "closed" if self._handle is None else ("edit" if self.can_edit else "generate")
        return f"diffuse.Pipeline({self.model!r}, {state})"

    def _live(self):
        if self._handle is None:
            raise InvalidArgumentError("the pipeline is closed")
        return self._handle

    @property
    def can_edit(self):
        """True for a model that edits by instruction (HiDream-E1)."""
        return _lib.diffuse_pipeline_can_edit(self._live()) == 1

    def txt2img(self, prompt, *, negative_prompt=None, width=0, height=0, steps=0,
                guidance_scale=None, seed=-1, scheduler=None, progress=None):
        """An image drawn from `prompt`. Zero/None values take the model's defaults; seed -1
        draws one (then `last_seed` says which). progress(step, total) is called after each
        step; returning False cancels (CancelledError)."""
        return self._run("txt2img", None, prompt, negative_prompt, width, height, steps,
                         guidance_scale, None, None, seed, scheduler, progress)

    def img2img(self, image, prompt, *, strength=0.8, negative_prompt=None, steps=0,
                guidance_scale=None, seed=-1, scheduler=None, progress=None):
        """`image` redrawn towards `prompt` (strength in (0, 1]: how much changes)."""
        return self._run("img2img", image, prompt, negative_prompt, 0, 0, steps,
                         guidance_scale, strength, None, seed, scheduler, progress)

    def edit(self, image, prompt, *, image_guidance_scale=None, negative_prompt=None, steps=0,
             guidance_scale=None, seed=-1, progress=None):
        """`image` edited by the instruction `prompt` (HiDream-E1 models: E1's format
        "Editing Instruction: ... Target Image Description: ..." or a bare instruction)."""
        return self._run("edit", image, prompt, negative_prompt, 0, 0, steps, guidance_scale,
                         None, image_guidance_scale, seed, None, progress)

    def _run(self, job, image, prompt, negative_prompt, width, height, steps, guidance_scale,
             strength, image_guidance_scale, seed, scheduler, progress):
        for name, value in (("width", width), ("height", height), ("steps", steps)):
            if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < 0:
                raise InvalidArgumentError(f"{name}: expected an integer >= 0, got {value!r}")
        if not isinstance(seed, (int, np.integer)) or isinstance(seed, bool) or seed < -1:
            raise InvalidArgumentError(f"seed: expected an integer >= 0, or -1, got {seed!r}")
        if seed >= 2**63:
            raise InvalidArgumentError(f"seed: {seed} does not fit in 63 bits")
        if progress is not None and not callable(progress):
            raise InvalidArgumentError("progress: expected a callable(step, total)")

        def number(value, name):
            if value is None:
                return -1.0
            try:
                v = float(value)
            except (TypeError, ValueError):
                raise InvalidArgumentError(f"{name}: expected a number, got {value!r}") from None
            if v != v or v < 0:
                raise InvalidArgumentError(f"{name}: expected a number >= 0, got {value!r}")
            return v

        r = _capi.Request()
        _lib.diffuse_request_init(ctypes.byref(r))
        keep = [_text(prompt, "prompt", True), _text(negative_prompt, "negative_prompt"),
                _text(scheduler, "scheduler")]
        r.prompt, r.negative_prompt, r.scheduler = keep
        r.width, r.height, r.steps = int(width), int(height), int(steps)
        r.guidance_scale = number(guidance_scale, "guidance_scale")
        r.strength = number(strength, "strength")
        r.image_guidance_scale = number(image_guidance_scale, "image_guidance_scale")
        r.seed = int(seed)

        # Always called, so that Ctrl-C (a KeyboardInterrupt raised when Python code next runs)
        # and a callback's own exception cancel the job at its next step instead of being lost
        # inside ctypes; the exception is raised again once the C call has returned.
        raised = []

        def on_step(step, total, _user):
            try:
                if progress is not None and progress(step, total) is False:
                    return 0
                return 1
            except BaseException as e:  # noqa: B902 - KeyboardInterrupt included on purpose
                raised.append(e)
                return 0

        r.progress = _capi.PROGRESS_FN(on_step)
        out = _capi.Image()
        rgb = None if job == "txt2img" else _as_rgb(image)
        with self._lock:
            handle = self._live()
            if rgb is None:
                status = _lib.diffuse_txt2img(handle, ctypes.byref(r), ctypes.byref(out))
            else:
                src = _c_image(rgb)
                fn = _lib.diffuse_img2img if job == "img2img" else _lib.diffuse_edit
                status = fn(handle, ctypes.byref(r), ctypes.byref(src), ctypes.byref(out))
        if raised:
            _lib.diffuse_image_free(ctypes.byref(out))
            raise raised[0]
        _check(status)
        self.last_seed, self.last_seconds = int(out.seed), float(out.seconds)
        return _take(out)
