// A server job as bytes, for the other ranks of a parallel server (diffuse serve --devices /
// --parallel): rank 0 parses the request, the others run exactly what it parsed. Everything a
// job sets travels, so that every rank computes the same thing.
#pragma once
#include <string>

#include "server/job.h"

namespace diffuse::server {

// CBOR of every field of the request (its init image as raw pixels). InvalidArgument for what
// cannot travel: the tensors of GenerationConfig (latents, noise), which no request sets.
std::string encode_job(const JobRequest& request);
// The request encode_job wrote. FormatError naming the field when the bytes are not such a
// job (another build's, or damaged).
JobRequest decode_job(const std::string& bytes);

}  // namespace diffuse::server
