// ONNX's protobuf classes (Debian's libonnx-dev, the ONNX library LibTorch itself links), as
// Debian built them: with the ONNX-ML extensions, in namespace onnx.
#pragma once
#ifndef ONNX_ML
#define ONNX_ML 1
#endif
#ifndef ONNX_NAMESPACE
#define ONNX_NAMESPACE onnx
#endif
#include <onnx/checker.h>
#include <onnx/onnx_pb.h>
