/* The C interface of shims/sentencepiece_shim.cpp, the one piece of diffuse that links
   libsentencepiece. Plain C types only: the shim lives in its own dynamic-linker namespace
   (see sentencepiece_model.cpp), with its own C and C++ runtimes, so no allocation, exception
   or C++ object crosses the boundary; strings and ids go through caller-owned buffers. */
#pragma once

#ifdef __cplusplus
extern "C" {
#endif

/* A loaded model, or NULL with a message in err (NUL-terminated, truncated to errlen). */
void* diffuse_spm_load(const char* path, char* err, int errlen);
void diffuse_spm_free(void* model);
int diffuse_spm_piece_size(void* model);
int diffuse_spm_unk_id(void* model);
int diffuse_spm_piece_to_id(void* model, const char* piece, int len);
/* Writes up to cap bytes of the piece (no NUL); returns its full length, -1 for a bad id. */
int diffuse_spm_id_to_piece(void* model, int id, char* buf, int cap);
/* Writes up to cap ids; returns how many the text has (call again with more room if that is
   more than cap), or -1 on error. */
int diffuse_spm_encode(void* model, const char* text, int len, int* out, int cap);
/* Trains a model with SentencePieceTrainer and writes it to model_path. `args` are spm_train's
   flags without --input and --model_prefix: the sentences are the '\n'-separated lines of
   corpus (len bytes), handed over in memory so that no file path ends up in the model (which
   records its trainer flags) and equal corpora give equal files. Returns 0; -1 if training
   failed, -2 if the file could not be written, with a message in err. */
int diffuse_spm_train(const char* args, const char* corpus, int len, const char* model_path,
                      char* err, int errlen);

#ifdef __cplusplus
}
#endif
