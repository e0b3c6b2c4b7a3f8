// `diffuse export onnx` in a build without ONNX's library (CMakeLists.txt: libonnx-dev and
// libprotobuf-dev not found): the command exists and says what the build lacks.
#include "diffuse/errors.h"
#include "export/onnx_export.h"

namespace diffuse::onnx_export {
namespace {

[[noreturn]] void unavailable() {
  throw Error(
      "this diffuse was built without ONNX export: install ONNX's library and protobuf "
      "(Debian: libonnx-dev libprotobuf-dev) and configure again");
}

}  // namespace

std::string TensorSpec::describe() const {
  return name;
}

std::vector<std::string> exportable_components(const std::string& /*model_dir*/) {
  unavailable();
}

ExportResult export_onnx(const ExportRequest& /*request*/) {
  unavailable();
}

}  // namespace diffuse::onnx_export
