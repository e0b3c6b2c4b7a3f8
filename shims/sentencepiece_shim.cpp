// The only code that links libsentencepiece: a C wrapper loaded at run time into a dynamic
// linker namespace of its own (src/text/sentencepiece_model.cpp). Why: Debian's
// libsentencepiece carries a private protobuf-lite 3.14 whose symbols are exported, while
// LibTorch pulls in the system libprotobuf 3.21; linked into one namespace, one library's
// protobuf calls land in the other's and the process aborts at start-up (version check) or
// crashes (static initialisers). Kept outside src/ so the core library does not glob it.
#include <sentencepiece_processor.h>
#include <sentencepiece_trainer.h>

#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "text/sentencepiece_api.h"

#define DIFFUSE_SPM_EXPORT extern "C" __attribute__((visibility("default")))

namespace {

sentencepiece::SentencePieceProcessor* sp(void* model) {
  return static_cast<sentencepiece::SentencePieceProcessor*>(model);
}

void copy_message(const std::string& message, char* err, int errlen) {
  if (!err || errlen <= 0) return;
  std::strncpy(err, message.c_str(), static_cast<size_t>(errlen - 1));
  err[errlen - 1] = '\0';
}

// The lines of a corpus in memory, as SentencePieceTrainer reads sentences.
class LineIterator : public sentencepiece::SentenceIterator {
 public:
  LineIterator(const char* data, size_t size) : data_(data), size_(size) { Next(); }
  bool done() const override { return done_; }
  void Next() override {
    if (pos_ >= size_) {
      done_ = true;
      return;
    }
    const void* nl = std::memchr(data_ + pos_, '\n', size_ - pos_);
    const size_t end = nl ? static_cast<size_t>(static_cast<const char*>(nl) - data_) : size_;
    line_.assign(data_ + pos_, end - pos_);
    pos_ = end + 1;
  }
  const std::string& value() const override { return line_; }
  sentencepiece::util::Status status() const override { return {}; }

 private:
  const char* data_;
  size_t size_;
  size_t pos_ = 0;
  bool done_ = false;
  std::string line_;
};

}  // namespace

DIFFUSE_SPM_EXPORT void* diffuse_spm_load(const char* path, char* err, int errlen) {
  try {
    auto* model = new sentencepiece::SentencePieceProcessor();
    const auto status = model->Load(path);
    if (status.ok()) return model;
    copy_message(status.ToString(), err, errlen);
    delete model;
  } catch (const std::exception& e) {
    copy_message(e.what(), err, errlen);
  }
  return nullptr;
}

DIFFUSE_SPM_EXPORT void diffuse_spm_free(void* model) {
  delete sp(model);
}

DIFFUSE_SPM_EXPORT int diffuse_spm_piece_size(void* model) {
  return sp(model)->GetPieceSize();
}

DIFFUSE_SPM_EXPORT int diffuse_spm_unk_id(void* model) {
  return sp(model)->unk_id();
}

DIFFUSE_SPM_EXPORT int diffuse_spm_piece_to_id(void* model, const char* piece, int len) {
  return sp(model)->PieceToId(std::string(piece, static_cast<size_t>(len)));
}

DIFFUSE_SPM_EXPORT int diffuse_spm_id_to_piece(void* model, int id, char* buf, int cap) {
  if (id < 0 || id >= sp(model)->GetPieceSize()) return -1;
  const std::string& piece = sp(model)->IdToPiece(id);
  std::memcpy(buf, piece.data(), std::min(piece.size(), static_cast<size_t>(cap < 0 ? 0 : cap)));
  return static_cast<int>(piece.size());
}

DIFFUSE_SPM_EXPORT int diffuse_spm_encode(void* model, const char* text, int len, int* out,
                                          int cap) {
  try {
    std::vector<int> ids;
    if (!sp(model)->Encode(std::string(text, static_cast<size_t>(len)), &ids).ok()) return -1;
    for (size_t i = 0; i < ids.size() && static_cast<int>(i) < cap; ++i) out[i] = ids[i];
    return static_cast<int>(ids.size());
  } catch (const std::exception&) {
    return -1;
  }
}

DIFFUSE_SPM_EXPORT int diffuse_spm_train(const char* args, const char* corpus, int len,
                                         const char* model_path, char* err, int errlen) {
  try {
    // The trainers draw random numbers only to sample or shuffle sentences (diffuse's callers
    // turn both off); should one turn them on, a fixed seed instead of std::random_device
    // keeps the result repeatable from one process to the next.
    sentencepiece::SetRandomGeneratorSeed(20240601);
    LineIterator lines(corpus, static_cast<size_t>(len < 0 ? 0 : len));
    std::string model;
    const auto status = sentencepiece::SentencePieceTrainer::Train(args, &lines, &model);
    if (!status.ok()) {
      copy_message(status.ToString(), err, errlen);
      return -1;
    }
    std::ofstream out(model_path, std::ios::binary | std::ios::trunc);
    out.write(model.data(), static_cast<std::streamsize>(model.size()));
    out.close();
    if (!out) {
      copy_message(std::string("cannot write '") + model_path + "'", err, errlen);
      return -2;
    }
    return 0;
  } catch (const std::exception& e) {
    copy_message(e.what(), err, errlen);
    return -1;
  }
}
