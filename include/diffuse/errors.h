// Typed errors. Every message says what went wrong, where (file / key / flag) and what was
// expected, so the CLI can print it on one line and a caller can branch on the type.
#pragma once
#include <stdexcept>
#include <string>

namespace diffuse {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A file or folder could not be opened, read or written.
class IoError : public Error {
 public:
  using Error::Error;
};

// A file exists but its content is malformed (safetensors header, JSON, PNG, ...).
class FormatError : public Error {
 public:
  using Error::Error;
};

// A config.json / scheduler_config.json key is missing, has the wrong type or a bad value.
class ConfigError : public Error {
 public:
  using Error::Error;
};

// A caller-supplied parameter is out of range (width not divisible by 8, steps < 1, ...).
class InvalidArgument : public Error {
 public:
  using Error::Error;
};

// The requested device does not exist or cannot run the requested work.
class DeviceError : public Error {
 public:
  using Error::Error;
};

// A stage of a generation produced NaN/Inf (an fp16 overflow on a device, a damaged model, an
// extreme guidance scale): the run stops instead of writing a black image.
class NumericalError : public Error {
 public:
  using Error::Error;
};

// A step callback asked to stop.
class Cancelled : public Error {
 public:
  using Error::Error;
};

// A job the loaded model does not run (an instruction edit on Stable Diffusion).
class Unsupported : public Error {
 public:
  using Error::Error;
};

}  // namespace diffuse
