/* The C API from a C program (C99, no C++): load the demo model, generate, re-generate with the
 * same seed, cancel from the progress callback, image-to-image, PNG files, and the bad inputs a
 * C caller can make (NULL pointers, bad UTF-8, freed handles, wrong jobs), each an error status
 * with a message, never a crash. Exit status 0 when every check passed. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "diffuse/diffuse.h"

static int failures = 0;

#define CHECK(cond)                                                                            \
  do {                                                                                         \
    if (!(cond)) {                                                                             \
      fprintf(stderr, "%s:%d: check failed: %s (last error: %s)\n", __FILE__, __LINE__, #cond, \
              diffuse_last_error());                                                           \
      ++failures;                                                                              \
    }                                                                                          \
  } while (0)

static int steps_seen = 0;
static int count_steps(int step, int total, void* user) {
  (void)user;
  steps_seen = step;
  return step <= total;
}
static int cancel_at_first(int step, int total, void* user) {
  (void)step;
  (void)total;
  (void)user;
  return 0;
}

int main(void) {
  const char* model = DIFFUSE_SOURCE_DIR "/models/demo";
  diffuse_pipeline* p = NULL;
  CHECK(strlen(diffuse_version()) > 0);

  CHECK(diffuse_pipeline_open(model, "cpu", "fp32", NULL) == DIFFUSE_ERROR_INVALID_ARGUMENT);
  CHECK(diffuse_pipeline_open(NULL, NULL, NULL, &p) == DIFFUSE_ERROR_INVALID_ARGUMENT);
  CHECK(strstr(diffuse_last_error(), "model") != NULL);
  CHECK(diffuse_pipeline_open("/nonexistent/model", NULL, NULL, &p) == DIFFUSE_ERROR_IO);
  CHECK(p == NULL);
  CHECK(diffuse_pipeline_open(model, "warp-drive", NULL, &p) != DIFFUSE_OK);
  CHECK(p == NULL);

  if (diffuse_pipeline_open(model, "cpu", "fp32", &p) != DIFFUSE_OK) {
    fprintf(stderr, "cannot open %s: %s\n", model, diffuse_last_error());
    return 1;
  }
  CHECK(diffuse_pipeline_can_edit(p) == 0);

  diffuse_request r;
  diffuse_request_init(&r);
  CHECK(r.seed == -1 && r.guidance_scale < 0 && r.prompt == NULL);
  r.prompt = "a red circle on the left on a blue background";
  r.steps = 2;
  r.seed = 42;
  r.progress = count_steps;
  diffuse_image a = {0}, b = {0};
  CHECK(diffuse_txt2img(p, &r, &a) == DIFFUSE_OK);
  CHECK(a.width > 0 && a.height > 0 && a.rgb != NULL);
  CHECK(a.seed == 42);
  CHECK(steps_seen == 2);
  CHECK(diffuse_txt2img(p, &r, &b) == DIFFUSE_OK);
  CHECK(a.width == b.width && a.height == b.height &&
        memcmp(a.rgb, b.rgb, (size_t)a.width * a.height * 3) == 0);
  diffuse_image_free(&b);
  CHECK(b.rgb == NULL && b.width == 0);
  diffuse_image_free(&b); /* a zeroed image is ignored */

  r.progress = cancel_at_first;
  CHECK(diffuse_txt2img(p, &r, &b) == DIFFUSE_ERROR_CANCELLED);
  CHECK(b.rgb == NULL);
  r.progress = NULL;

  r.prompt = NULL;
  CHECK(diffuse_txt2img(p, &r, &b) == DIFFUSE_ERROR_INVALID_ARGUMENT);
  r.prompt = "a red \xff\xfe circle";
  CHECK(diffuse_txt2img(p, &r, &b) == DIFFUSE_ERROR_INVALID_ARGUMENT);
  CHECK(strstr(diffuse_last_error(), "prompt") != NULL);
  r.prompt = "a blue square";
  r.width = 100; /* not a multiple of 8 */
  CHECK(diffuse_txt2img(p, &r, &b) == DIFFUSE_ERROR_INVALID_ARGUMENT);
  r.width = 0;
  r.seed = -7;
  CHECK(diffuse_txt2img(p, &r, &b) == DIFFUSE_ERROR_INVALID_ARGUMENT);
  r.seed = 1;
  CHECK(diffuse_txt2img(p, NULL, &b) == DIFFUSE_ERROR_INVALID_ARGUMENT);
  CHECK(diffuse_txt2img(p, &r, NULL) == DIFFUSE_ERROR_INVALID_ARGUMENT);
  CHECK(diffuse_txt2img(NULL, &r, &b) == DIFFUSE_ERROR_INVALID_ARGUMENT);

  /* Image-to-image from the first image; an instruction edit is not this model's job. */
  r.strength = 0.5;
  CHECK(diffuse_img2img(p, &r, &a, &b) == DIFFUSE_OK);
  CHECK(b.width == a.width && b.height == a.height);
  diffuse_image_free(&b);
  CHECK(diffuse_edit(p, &r, &a, &b) == DIFFUSE_ERROR_UNSUPPORTED);
  diffuse_image bad = a;
  bad.rgb = NULL;
  CHECK(diffuse_img2img(p, &r, &bad, &b) == DIFFUSE_ERROR_INVALID_ARGUMENT);
  bad = a;
  bad.width = 0;
  CHECK(diffuse_img2img(p, &r, &bad, &b) == DIFFUSE_ERROR_INVALID_ARGUMENT);
  CHECK(diffuse_img2img(p, &r, NULL, &b) == DIFFUSE_ERROR_INVALID_ARGUMENT);

  /* PNG files out and back in. */
  char path[256];
  const char* tmp = getenv("TMPDIR");
  snprintf(path, sizeof path, "%s/diffuse_c_api_%d.png", tmp && *tmp ? tmp : "/tmp", (int)getpid());
  CHECK(diffuse_image_write_png(&a, path) == DIFFUSE_OK);
  diffuse_image back = {0};
  CHECK(diffuse_image_read_png(path, &back) == DIFFUSE_OK);
  CHECK(back.width == a.width && back.height == a.height &&
        memcmp(back.rgb, a.rgb, (size_t)a.width * a.height * 3) == 0);
  diffuse_image_free(&back);
  remove(path);
  CHECK(diffuse_image_read_png("/nonexistent.png", &back) == DIFFUSE_ERROR_IO);
  CHECK(diffuse_image_write_png(NULL, path) == DIFFUSE_ERROR_INVALID_ARGUMENT);

  /* A freed handle is refused, and freeing twice is harmless. */
  diffuse_pipeline_free(p);
  CHECK(diffuse_txt2img(p, &r, &b) == DIFFUSE_ERROR_INVALID_ARGUMENT);
  CHECK(strstr(diffuse_last_error(), "not a live pipeline handle") != NULL);
  CHECK(diffuse_pipeline_can_edit(p) == -1);
  diffuse_pipeline_free(p);
  diffuse_pipeline_free(NULL);
  diffuse_image_free(&a);
  diffuse_image_free(NULL);

  if (failures)
    fprintf(stderr, "%d checks failed\n", failures);
  else
    printf("c api: every check passed\n");
  return failures ? 1 : 0;
}
