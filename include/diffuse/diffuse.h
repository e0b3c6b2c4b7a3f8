/* The C API of diffuse: load a model (Stable Diffusion or HiDream, a diffusers folder or a
 * single-file checkpoint), then text-to-image, image-to-image or instruction editing into plain
 * RGB buffers. For C and for every language with a C FFI (Python's ctypes, Rust, Go, C#).
 *
 *   diffuse_pipeline* p = NULL;
 *   if (diffuse_pipeline_open("models/demo", "auto", "auto", &p) != DIFFUSE_OK) {
 *     fprintf(stderr, "%s\n", diffuse_last_error());
 *     return 1;
 *   }
 *   diffuse_request r;
 *   diffuse_request_init(&r);
 *   r.prompt = "a red circle on the left on a blue background";
 *   r.seed = 42;
 *   diffuse_image img = {0};
 *   if (diffuse_txt2img(p, &r, &img) == DIFFUSE_OK) diffuse_image_write_png(&img, "out.png");
 *   diffuse_image_free(&img);
 *   diffuse_pipeline_free(p);
 *
 * Rules: no call throws or aborts; each returns a status, and diffuse_last_error() gives the
 * message of this thread's last failure. Strings are UTF-8 (others are refused). A handle is
 * used by one thread at a time; a freed or unknown handle is an error, not a crash. Images
 * returned by the library are freed with diffuse_image_free. */
#ifndef DIFFUSE_DIFFUSE_H
#define DIFFUSE_DIFFUSE_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum diffuse_status {
  DIFFUSE_OK = 0,
  DIFFUSE_ERROR_INVALID_ARGUMENT = 1, /* a bad value, a null or freed handle, bad UTF-8 */
  DIFFUSE_ERROR_IO = 2,               /* a file that cannot be read or written */
  DIFFUSE_ERROR_FORMAT = 3,           /* a file with bad content (weights, config, image) */
  DIFFUSE_ERROR_DEVICE = 4,           /* a device that is not there or failed */
  DIFFUSE_ERROR_CANCELLED = 5,        /* the progress callback asked to stop */
  DIFFUSE_ERROR_UNSUPPORTED = 6,      /* a job this model does not run (edit on SD ...) */
  DIFFUSE_ERROR_INTERNAL = 7          /* anything else, with its message */
} diffuse_status;

typedef struct diffuse_pipeline diffuse_pipeline;

/* The library's version ("0.x.y"). */
const char* diffuse_version(void);
/* The message of the last failing call on this thread ("" if none). Valid until the next call
 * on this thread. */
const char* diffuse_last_error(void);

/* Loads `model` (a diffusers folder or a single-file checkpoint). device: "auto", "cpu",
 * "cuda[:N]", "npu[:N]"; dtype: "auto", "fp32", "bf16", "fp16". NULL means "auto". */
diffuse_status diffuse_pipeline_open(const char* model, const char* device, const char* dtype,
                                     diffuse_pipeline** out);
/* Frees the pipeline; NULL is ignored, a freed handle is ignored too. */
void diffuse_pipeline_free(diffuse_pipeline* pipeline);
/* 1 if the model edits images by instruction (HiDream-E1), 0 if not, -1 for a bad handle. */
int diffuse_pipeline_can_edit(const diffuse_pipeline* pipeline);

/* Called after each denoising step; return non-zero to go on, 0 to cancel (the job then
 * returns DIFFUSE_ERROR_CANCELLED). */
typedef int (*diffuse_progress_fn)(int step, int total_steps, void* user_data);

typedef struct diffuse_request {
  const char* prompt;          /* required */
  const char* negative_prompt; /* NULL: none */
  int width, height;           /* 0: the model's size (img2img/edit: the input's) */
  int steps;                   /* 0: the model's default */
  double guidance_scale;       /* < 0: the model's default */
  double strength;             /* img2img: (0, 1]; < 0: 0.8 */
  double image_guidance_scale; /* edit: < 0: the model's default */
  int64_t seed;                /* -1: random (the result says which) */
  const char* scheduler;       /* NULL: the model's own */
  diffuse_progress_fn progress;
  void* user_data;
} diffuse_request;

/* Sets every field to its default (defaults as commented above). */
void diffuse_request_init(diffuse_request* request);

typedef struct diffuse_image {
  int width, height;
  uint8_t* rgb; /* width * height * 3 bytes, row-major */
  uint64_t seed;
  double seconds; /* the whole job */
} diffuse_image;

diffuse_status diffuse_txt2img(diffuse_pipeline* pipeline, const diffuse_request* request,
                               diffuse_image* out);
/* `input`: the image to start from (Stable Diffusion) or to edit (HiDream-E1). */
diffuse_status diffuse_img2img(diffuse_pipeline* pipeline, const diffuse_request* request,
                               const diffuse_image* input, diffuse_image* out);
diffuse_status diffuse_edit(diffuse_pipeline* pipeline, const diffuse_request* request,
                            const diffuse_image* input, diffuse_image* out);

/* Frees an image's pixels and zeroes it; NULL and zeroed images are ignored. */
void diffuse_image_free(diffuse_image* image);
/* PNG files in and out (the image read is freed with diffuse_image_free). */
diffuse_status diffuse_image_read_png(const char* path, diffuse_image* out);
diffuse_status diffuse_image_write_png(const diffuse_image* image, const char* path);

#ifdef __cplusplus
}
#endif

#endif /* DIFFUSE_DIFFUSE_H */
