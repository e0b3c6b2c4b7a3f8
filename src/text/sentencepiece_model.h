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

}  // namespace diffuse::text
