/* A program outside the project: generate one image with the C API of an installed diffuse and
 * write it as a PNG, then read it back. Usage: consumer MODEL OUT.png. Exit status 0 on success. */
#include <stdio.h>

#include <diffuse/diffuse.h>

int main(int argc, char** argv) {
  if (argc != 3) {
    fprintf(stderr, "usage: consumer MODEL OUT.png\n");
    return 2;
  }
  diffuse_pipeline* p = NULL;
  if (diffuse_pipeline_open(argv[1], "cpu", "fp32", &p) != DIFFUSE_OK) {
    fprintf(stderr, "open: %s\n", diffuse_last_error());
    return 1;
  }
  diffuse_request r;
  diffuse_request_init(&r);
  r.prompt = "a red circle on the left and a blue square on the right on a yellow background";
  r.steps = 3;
  r.seed = 42;
  diffuse_image img = {0}, back = {0};
  int ok = diffuse_txt2img(p, &r, &img) == DIFFUSE_OK &&
           diffuse_image_write_png(&img, argv[2]) == DIFFUSE_OK &&
           diffuse_image_read_png(argv[2], &back) == DIFFUSE_OK && back.width == img.width &&
           back.height == img.height && img.width > 0;
  if (!ok)
    fprintf(stderr, "generate: %s\n", diffuse_last_error());
  else
    printf("diffuse %s: %dx%d image, seed %llu\n", diffuse_version(), img.width, img.height,
           (unsigned long long)img.seed);
  diffuse_image_free(&img);
  diffuse_image_free(&back);
  diffuse_pipeline_free(p);
  return ok ? 0 : 1;
}
