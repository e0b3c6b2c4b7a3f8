// A SentencePiece model (spiece.model) through libsentencepiece, which runs isolated in the
// shim library shims/sentencepiece_shim.cpp (why: see there). The shim is looked up in
// $DIFFUSE_SENTENCEPIECE_SHIM, next to the executable, then where the build put it.
#pragma once
#include <memory>
#include <string>
#include <vector>

namespace diffuse::text {

class SentencePieceModel {
 public:
  // FormatError naming the file if it is not a SentencePiece model; IoError if it or the shim
  // library cannot be loaded.
  static std::shared_ptr<SentencePieceModel> load(const std::string& path);
  ~SentencePieceModel();
  SentencePieceModel(const SentencePieceModel&) = delete;
  SentencePieceModel& operator=(const SentencePieceModel&) = delete;

  // Ids of the pieces of `text` (the model's normaliser and unigram/BPE segmentation).
  std::vector<int> encode(const std::string& text) const;
  int piece_size() const;
  int unk_id() const;
  int piece_to_id(const std::string& piece) const;  // unk_id() if unknown
  std::string id_to_piece(int id) const;

 private:
  SentencePieceModel() = default;
  void* handle_ = nullptr;
};

// Trains a SentencePiece model and writes it to `model_path` (atomically). `args` are
// spm_train's flags without --input and --model_prefix; `corpus` holds the sentences, one a
// line. The corpus must contain some visible text: libsentencepiece aborts the process on a
// corpus that normalises to nothing, so callers check first. InvalidArgument with
// SentencePiece's message if training fails (a bad flag, a vocab_size below the alphabet);
// IoError if the shim cannot be loaded or the file not written.
void train_sentencepiece(const std::string& args, const std::string& corpus,
                         const std::string& model_path);

}  // namespace diffuse::text
