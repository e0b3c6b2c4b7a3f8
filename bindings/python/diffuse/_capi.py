"""ctypes declarations of the C API (include/diffuse/diffuse.h) and the loading of libdiffuse.

The module talks to the engine through its C API rather than a compiled extension: the C API is
the one boundary that is already hardened (statuses instead of exceptions, checked handles and
strings, tested under AddressSanitizer), it does not tie the module to one Python version or to
the pybind11 and LibTorch builds of the process (a user who also imports torch gets no clash),
and nothing has to be compiled for Python.
"""

import ctypes
import os

OK = 0
INVALID_ARGUMENT = 1
IO = 2
FORMAT = 3
DEVICE = 4
CANCELLED = 5
UNSUPPORTED = 6
INTERNAL = 7

PROGRESS_FN = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_void_p)


class Request(ctypes.Structure):
    _fields_ = [
        ("prompt", ctypes.c_char_p),
        ("negative_prompt", ctypes.c_char_p),
        ("width", ctypes.c_int),
        ("height", ctypes.c_int),
        ("steps", ctypes.c_int),
        ("guidance_scale", ctypes.c_double),
        ("strength", ctypes.c_double),
        ("image_guidance_scale", ctypes.c_double),
        ("seed", ctypes.c_int64),
        ("scheduler", ctypes.c_char_p),
        ("progress", PROGRESS_FN),
        ("user_data", ctypes.c_void_p),
    ]


class Image(ctypes.Structure):
    _fields_ = [
        ("width", ctypes.c_int),
        ("height", ctypes.c_int),
        ("rgb", ctypes.POINTER(ctypes.c_uint8)),
        ("seed", ctypes.c_uint64),
        ("seconds", ctypes.c_double),
    ]


def _candidates():
    """Where libdiffuse may be: DIFFUSE_LIBRARY, then the path CMake wrote beside this file (the
    build tree's library, or the installed one relative to this package), then the loader's
    search path."""
    env = os.environ.get("DIFFUSE_LIBRARY")
    if env:
        return [env]
    out = []
    try:
        from . import _paths  # written by CMake

        here = os.path.dirname(os.path.abspath(__file__))
        out.append(os.path.normpath(os.path.join(here, _paths.LIBRARY)))
    except ImportError:
        pass
    out.append("libdiffuse.so.0")
    return out


def load():
    errors = []
    for path in _candidates():
        try:
            lib = ctypes.CDLL(path)
            break
        except OSError as e:
            errors.append(f"{path}: {e}")
    else:
        raise ImportError(
            "cannot load libdiffuse (tried " + "; ".join(errors) + "); set DIFFUSE_LIBRARY to its path"
        )
    status = ctypes.c_int
    pipeline_p = ctypes.c_void_p
    sig = {
        "diffuse_version": (ctypes.c_char_p, []),
        "diffuse_last_error": (ctypes.c_char_p, []),
        "diffuse_pipeline_open": (
            status,
            [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.POINTER(pipeline_p)],
        ),
        "diffuse_pipeline_free": (None, [pipeline_p]),
        "diffuse_pipeline_can_edit": (ctypes.c_int, [pipeline_p]),
        "diffuse_request_init": (None, [ctypes.POINTER(Request)]),
        "diffuse_txt2img": (status, [pipeline_p, ctypes.POINTER(Request), ctypes.POINTER(Image)]),
        "diffuse_img2img": (
            status,
            [pipeline_p, ctypes.POINTER(Request), ctypes.POINTER(Image), ctypes.POINTER(Image)],
        ),
        "diffuse_edit": (
            status,
            [pipeline_p, ctypes.POINTER(Request), ctypes.POINTER(Image), ctypes.POINTER(Image)],
        ),
        "diffuse_image_free": (None, [ctypes.POINTER(Image)]),
        "diffuse_image_read_png": (status, [ctypes.c_char_p, ctypes.POINTER(Image)]),
        "diffuse_image_write_png": (status, [ctypes.POINTER(Image), ctypes.c_char_p]),
    }
    for name, (restype, argtypes) in sig.items():
        fn = getattr(lib, name)
        fn.restype = restype
        fn.argtypes = argtypes
    return lib
