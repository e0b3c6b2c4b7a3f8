#include "text/sentencepiece_model.h"

#include <dlfcn.h>
#include <unistd.h>

#include <climits>
#include <cstdlib>
#include <filesystem>
#include <mutex>

#include "diffuse/errors.h"
#include "io/atomic_file.h"
#include "io/input_file.h"
#include "text/sentencepiece_api.h"

namespace fs = std::filesystem;

namespace diffuse::text {
namespace {

struct Api {
  decltype(&diffuse_spm_load) load = nullptr;
  decltype(&diffuse_spm_free) free = nullptr;
  decltype(&diffuse_spm_piece_size) piece_size = nullptr;
  decltype(&diffuse_spm_unk_id) unk_id = nullptr;
  decltype(&diffuse_spm_piece_to_id) piece_to_id = nullptr;
  decltype(&diffuse_spm_id_to_piece) id_to_piece = nullptr;
  decltype(&diffuse_spm_encode) encode = nullptr;
  decltype(&diffuse_spm_train) train = nullptr;
};

constexpr const char* kShimName = "libdiffuse_sentencepiece.so";

std::vector<std::string> shim_candidates() {
  std::vector<std::string> out;
  if (const char* env = std::getenv("DIFFUSE_SENTENCEPIECE_SHIM"); env && *env)
    out.emplace_back(env);
  // Beside the file this code was linked into: libdiffuse.so for a program (or Python) using
  // the shared library, else the executable.
  Dl_info info{};
  if (dladdr(reinterpret_cast<const void*>(&shim_candidates), &info) != 0 && info.dli_fname)
    out.push_back((fs::path(info.dli_fname).parent_path() / kShimName).string());
  char exe[PATH_MAX];
  const ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
  if (n > 0) {
    const fs::path dir = fs::path(std::string(exe, static_cast<size_t>(n))).parent_path();
    out.push_back((dir / kShimName).string());
    out.push_back((dir.parent_path() / "lib" / kShimName).string());
  }
#ifdef DIFFUSE_INSTALLED_SHIM_PATH
  out.emplace_back(DIFFUSE_INSTALLED_SHIM_PATH);
#endif
#ifdef DIFFUSE_SENTENCEPIECE_SHIM_PATH
  out.emplace_back(DIFFUSE_SENTENCEPIECE_SHIM_PATH);
#endif
  return out;
}

// Loads the shim once into a fresh linker namespace (dlmopen LM_ID_NEWLM): there its
// libsentencepiece and that library's private protobuf never meet LibTorch's libprotobuf.
const Api& api() {
  static Api a;
  static std::string error;
  static std::once_flag once;
  std::call_once(once, [] {
    std::string tried;
    for (const auto& path : shim_candidates()) {
      if (!fs::exists(path)) {
        tried += (tried.empty() ? "" : ", ") + path;
        continue;
      }
      void* lib = dlmopen(LM_ID_NEWLM, path.c_str(), RTLD_NOW | RTLD_LOCAL);
      if (!lib) {
        const char* why = dlerror();
        tried += (tried.empty() ? "" : ", ") + path + " (" + (why ? why : "dlmopen failed") + ")";
        continue;
      }
      auto sym = [&](const char* name) { return dlsym(lib, name); };
      a.load = reinterpret_cast<decltype(a.load)>(sym("diffuse_spm_load"));
      a.free = reinterpret_cast<decltype(a.free)>(sym("diffuse_spm_free"));
      a.piece_size = reinterpret_cast<decltype(a.piece_size)>(sym("diffuse_spm_piece_size"));
      a.unk_id = reinterpret_cast<decltype(a.unk_id)>(sym("diffuse_spm_unk_id"));
      a.piece_to_id = reinterpret_cast<decltype(a.piece_to_id)>(sym("diffuse_spm_piece_to_id"));
      a.id_to_piece = reinterpret_cast<decltype(a.id_to_piece)>(sym("diffuse_spm_id_to_piece"));
      a.encode = reinterpret_cast<decltype(a.encode)>(sym("diffuse_spm_encode"));
      a.train = reinterpret_cast<decltype(a.train)>(sym("diffuse_spm_train"));
      if (a.load && a.free && a.piece_size && a.unk_id && a.piece_to_id && a.id_to_piece &&
          a.encode && a.train)
        return;
      a = Api();
      tried += (tried.empty() ? "" : ", ") + path + " (missing symbols)";
    }
    error = "cannot load the SentencePiece shim " + std::string(kShimName) + " (tried: " + tried +
            "); set DIFFUSE_SENTENCEPIECE_SHIM to its path";
  });
  if (!a.load) throw IoError(error);
  return a;
}

}  // namespace

std::shared_ptr<SentencePieceModel> SentencePieceModel::load(const std::string& path) {
  io::require_regular_file(path, "SentencePiece model");
  const Api& a = api();
  char err[512] = {0};
  void* handle = a.load(path.c_str(), err, sizeof(err));
  if (!handle) throw FormatError(path + ": not a SentencePiece model (" + err + ")");
  std::shared_ptr<SentencePieceModel> m(new SentencePieceModel());
  m->handle_ = handle;
  return m;
}

SentencePieceModel::~SentencePieceModel() {
  if (handle_) api().free(handle_);
}

std::vector<int> SentencePieceModel::encode(const std::string& text) const {
  if (text.size() > static_cast<size_t>(INT_MAX))
    throw InvalidArgument("SentencePiece: text of " + std::to_string(text.size()) +
                          " bytes is too long");
  std::vector<int> ids(text.size() + 8);
  for (;;) {
    const int n = api().encode(handle_, text.data(), static_cast<int>(text.size()), ids.data(),
                               static_cast<int>(ids.size()));
    if (n < 0) throw InvalidArgument("SentencePiece could not encode the text");
    if (static_cast<size_t>(n) <= ids.size()) {
      ids.resize(static_cast<size_t>(n));
      return ids;
    }
    ids.resize(static_cast<size_t>(n));
  }
}

int SentencePieceModel::piece_size() const {
  return api().piece_size(handle_);
}
int SentencePieceModel::unk_id() const {
  return api().unk_id(handle_);
}

int SentencePieceModel::piece_to_id(const std::string& piece) const {
  return api().piece_to_id(handle_, piece.data(), static_cast<int>(piece.size()));
}

std::string SentencePieceModel::id_to_piece(int id) const {
  std::string out(64, '\0');
  int n = api().id_to_piece(handle_, id, out.data(), static_cast<int>(out.size()));
  if (n < 0) return "";
  if (static_cast<size_t>(n) > out.size()) {
    out.resize(static_cast<size_t>(n));
    n = api().id_to_piece(handle_, id, out.data(), n);
  }
  out.resize(static_cast<size_t>(n));
  return out;
}

void train_sentencepiece(const std::string& args, const std::string& corpus,
                         const std::string& model_path) {
  if (corpus.size() > static_cast<size_t>(INT_MAX))
    throw InvalidArgument("SentencePiece training: a corpus of " + std::to_string(corpus.size()) +
                          " bytes is too large (at most " + std::to_string(INT_MAX) + ")");
  const Api& a = api();
  io::AtomicFile file(model_path);
  char err[1024] = {0};
  const int rc = a.train(args.c_str(), corpus.data(), static_cast<int>(corpus.size()),
                         file.temp_path().c_str(), err, sizeof(err));
  if (rc == -2) throw IoError("SentencePiece training: " + std::string(err));
  if (rc != 0)
    throw InvalidArgument("SentencePiece training failed for '" + model_path + "': " + err);
  file.commit();
}

}  // namespace diffuse::text
