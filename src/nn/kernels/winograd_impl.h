// The three transforms of Winograd's F(2x2, 3x3) convolution (nn/winograd_conv.h) on float32,
// as plain loops over contiguous rows that the compiler vectorises for the including unit's
// instruction set. Included by cpu_kernels_impl.h; internal linkage like the rest of it.
//
// With d a 4x4 input tile, g a 3x3 filter and
//   B^T = [1 0 -1 0; 0 1 1 0; 0 -1 1 0; 0 1 0 -1],  G = [1 0 0; 1/2 1/2 1/2; 1/2 -1/2 1/2; 0 0 1],
//   A^T = [1 1 1 0; 0 1 -1 -1],
// the 2x2 output tile is A^T [(G g G^T) .* (B^T d B)] A. Summed over the input channels, the
// element-wise product becomes 16 matrix products (one per position of the 4x4 tile), which
// the caller runs through BLAS: 16 multiplications per output tile per channel pair instead of
// the direct convolution's 36.
//
// The 16 planes of U, V and M lie `plane` floats apart; the caller pads that stride so that it
// is no multiple of 4 KiB (16 streams a 4 KiB multiple apart share a few L1 sets and the
// stores thrash: 2.7x slower weight transform on an AVX2 EPYC).
#pragma once
#include <cstdint>
#include <cstring>

#include "nn/kernels/vec_math.h"

namespace diffuse::nn::kernels {
namespace {

// The loops below run over contiguous rows as vectors of the unit's width plus a scalar tail:
// `body(lanes, i)` handles elements i .. i + lanes.width - 1 through lanes.load/store. (Left to
// the compiler, they stayed scalar: it cannot prove the many row pointers apart.)
struct VectorLanes {
  static constexpr int64_t width = vec::kVecWidth;
  static vec::VecF load(const float* p) {
    vec::VecF v;
    std::memcpy(&v, p, sizeof v);
    return v;
  }
  static void store(float* p, vec::VecF v) { std::memcpy(p, &v, sizeof v); }
};
struct ScalarLane {
  static constexpr int64_t width = 1;
  static float load(const float* p) { return *p; }
  static void store(float* p, float v) { *p = v; }
};
template <typename Body>
inline void over_lanes(int64_t n, Body&& body) {
  int64_t i = 0;
  for (; i + VectorLanes::width <= n; i += VectorLanes::width) body(VectorLanes{}, i);
  for (; i < n; ++i) body(ScalarLane{}, i);
}

// Calls body(o, g) for each output channel o in o0..o1 of w[O][C][3][3] with g[k][c] =
// w[o][c][k]: the nine taps as contiguous rows over c, a transpose of [C][9] that stays in
// L1/L2 (ATen's permuted copy of the whole weight took 3-7x a plain widening). `scratch`:
// 9 * C floats.
template <typename Body>
inline void for_each_filter_row(const float* w, int64_t o0, int64_t o1, int64_t C, float* scratch,
                                Body&& body) {
  float* g[9];
  for (int k = 0; k < 9; ++k) g[k] = scratch + k * C;
  for (int64_t o = o0; o < o1; ++o) {
    const float* wo = w + o * C * 9;
    for (int64_t c = 0; c < C; ++c)
      for (int k = 0; k < 9; ++k) g[k][c] = wo[c * 9 + k];
    body(o, g);
  }
}

// Calls body(o, ty, m, bias[o] or 0) for each output channel o in o0..o1 and tile row ty in
// ty0..ty1, m pointing at the row's first tile in plane 0 of M (column t0 + (ty - ty0) * TW).
template <typename Body>
inline void for_each_tile_row(const float* M, int64_t o0, int64_t o1, int64_t ld, int64_t t0,
                              const float* bias, int64_t TW, int64_t ty0, int64_t ty1,
                              Body&& body) {
  for (int64_t o = o0; o < o1; ++o)
    for (int64_t ty = ty0; ty < ty1; ++ty)
      body(o, ty, M + o * ld + t0 + (ty - ty0) * TW, bias ? bias[o] : 0.0f);
}

// Writes tile row ty of an output channel, held as planes[(r * m + q) * TW + tx] = pixel
// (m * ty + r, m * tx + q), into its H x W image y, clipped at the image's edges.
inline void store_tile_row(const float* planes, int64_t m, int64_t TW, int64_t ty, int64_t H,
                           int64_t W, float* y) {
  for (int64_t r = 0; r < m && m * ty + r < H; ++r) {
    float* row = y + (m * ty + r) * W;
    for (int64_t q = 0; q < m; ++q) {
      const float* p = planes + (r * m + q) * TW;
      for (int64_t tx = 0; m * tx + q < W; ++tx) row[m * tx + q] = p[tx];
    }
  }
}

// U[16][O][C] (rows o0..o1 of each plane) from w[O][C][3][3]. `scratch`: 9 * C floats.
void winograd_weights(const float* w, int64_t o0, int64_t o1, int64_t C, float* U, int64_t plane,
                      float* scratch) {
  for_each_filter_row(w, o0, o1, C, scratch, [&](int64_t o, float* const* g) {
    float* u = U + o * C;
    // G g: its rows r0, (r0 + r1 + r2) / 2, (r0 - r1 + r2) / 2, r2; then the same on columns.
    over_lanes(C, [&](auto L, int64_t c) {
      using T = decltype(L.load(g[0]));
      T x[9];
      for (int k = 0; k < 9; ++k) x[k] = L.load(g[k] + c);
      T t[4][3];
      for (int j = 0; j < 3; ++j) {
        t[0][j] = x[j];
        t[1][j] = 0.5f * (x[j] + x[3 + j] + x[6 + j]);
        t[2][j] = 0.5f * (x[j] - x[3 + j] + x[6 + j]);
        t[3][j] = x[6 + j];
      }
      for (int r = 0; r < 4; ++r) {
        L.store(u + (r * 4 + 0) * plane + c, t[r][0]);
        L.store(u + (r * 4 + 1) * plane + c, 0.5f * (t[r][0] + t[r][1] + t[r][2]));
        L.store(u + (r * 4 + 2) * plane + c, 0.5f * (t[r][0] - t[r][1] + t[r][2]));
        L.store(u + (r * 4 + 3) * plane + c, t[r][2]);
      }
    });
  });
}

// V[16][C][ld] for channels c0..c1 of one image x[C][H][W] (zero padding of 1): tile row ty
// (output rows 2ty, 2ty + 1) of tile rows ty0..ty1 goes to columns
// t0 + (ty - ty0) * TW + tx, TW = ceil(W / 2). `scratch`: 8 * (TW + 2) + W floats.
void winograd_input(const float* x, int64_t c0, int64_t c1, int64_t H, int64_t W, int64_t ty0,
                    int64_t ty1, float* V, int64_t plane, int64_t ld, int64_t t0, float* scratch) {
  const int64_t TW = (W + 1) / 2;
  // Per row i of B^T d: its even columns in e[i][1 + tx] (column 2tx) and odd ones in
  // od[i][1 + tx] (column 2tx + 1), with the padding column -1 at od[i][0] and 2TW at
  // e[i][TW + 1], so that the column pass reads four shifted contiguous rows.
  float *e[4], *od[4];
  for (int i = 0; i < 4; ++i) {
    e[i] = scratch + i * 2 * (TW + 2);
    od[i] = e[i] + TW + 2;
    od[i][0] = 0.0f;
    e[i][TW + 1] = 0.0f;
  }
  float* zero_row = scratch + 8 * (TW + 2);
  for (int64_t ix = 0; ix < W; ++ix) zero_row[ix] = 0.0f;
  for (int64_t c = c0; c < c1; ++c) {
    const float* xc = x + c * H * W;
    for (int64_t ty = ty0; ty < ty1; ++ty) {
      const float* d[4];
      for (int i = 0; i < 4; ++i) {
        const int64_t iy = 2 * ty - 1 + i;
        d[i] = iy >= 0 && iy < H ? xc + iy * W : zero_row;
      }
      const float *d0 = d[0], *d1 = d[1], *d2 = d[2], *d3 = d[3];
      for (int64_t tx = 0; tx < W / 2; ++tx) {
        const int64_t a = 2 * tx, b = a + 1;
        e[0][1 + tx] = d0[a] - d2[a];
        e[1][1 + tx] = d1[a] + d2[a];
        e[2][1 + tx] = d2[a] - d1[a];
        e[3][1 + tx] = d1[a] - d3[a];
        od[0][1 + tx] = d0[b] - d2[b];
        od[1][1 + tx] = d1[b] + d2[b];
        od[2][1 + tx] = d2[b] - d1[b];
        od[3][1 + tx] = d1[b] - d3[b];
      }
      if (W % 2) {  // the last column is even; the odd one past it is padding
        const int64_t a = W - 1;
        e[0][TW] = d0[a] - d2[a];
        e[1][TW] = d1[a] + d2[a];
        e[2][TW] = d2[a] - d1[a];
        e[3][TW] = d1[a] - d3[a];
        for (int i = 0; i < 4; ++i) od[i][TW] = 0.0f;
      }
      float* out = V + c * ld + t0 + (ty - ty0) * TW;
      for (int i = 0; i < 4; ++i) {
        float* v0 = out + (i * 4 + 0) * plane;
        float* v1 = out + (i * 4 + 1) * plane;
        float* v2 = out + (i * 4 + 2) * plane;
        float* v3 = out + (i * 4 + 3) * plane;
        const float* ev = e[i] + 1;
        const float* ov = od[i] + 1;
        // Columns 2tx - 1, 2tx, 2tx + 1, 2tx + 2 are ov[tx - 1], ev[tx], ov[tx], ev[tx + 1].
        over_lanes(TW, [&](auto L, int64_t tx) {
          const auto e0 = L.load(ev + tx), e1 = L.load(ev + tx + 1);
          const auto o0 = L.load(ov + tx - 1), o1 = L.load(ov + tx);
          L.store(v0 + tx, o0 - o1);
          L.store(v1 + tx, e0 + o1);
          L.store(v2 + tx, o1 - e0);
          L.store(v3 + tx, e0 - e1);
        });
      }
    }
  }
}

// y[O][H][W] (one image), output channels o0..o1, from M[16][O][ld] laid out as
// winograd_input's V, plus bias[o] (bias may be null). `scratch`: 4 * TW floats.
void winograd_output(const float* M, int64_t o0, int64_t o1, int64_t plane, int64_t ld, int64_t t0,
                     const float* bias, int64_t H, int64_t W, int64_t ty0, int64_t ty1, float* y,
                     float* scratch) {
  const int64_t TW = (W + 1) / 2;
  float* s[4] = {scratch, scratch + TW, scratch + 2 * TW, scratch + 3 * TW};
  for_each_tile_row(M, o0, o1, ld, t0, bias, TW, ty0, ty1,
                    [&](int64_t o, int64_t ty, const float* m, float b) {
                      // A^T M A: per row i, a0 = m_i0 + m_i1 + m_i2 and a1 = m_i1 - m_i2 - m_i3;
                      // then the output rows are a_0 + a_1 + a_2 and a_1 - a_2 - a_3.
                      over_lanes(TW, [&](auto L, int64_t tx) {
                        using T = decltype(L.load(m));
                        T a0[4], a1[4];
                        for (int i = 0; i < 4; ++i) {
                          const T m0 = L.load(m + (i * 4 + 0) * plane + tx),
                                  m1 = L.load(m + (i * 4 + 1) * plane + tx);
                          const T m2 = L.load(m + (i * 4 + 2) * plane + tx),
                                  m3 = L.load(m + (i * 4 + 3) * plane + tx);
                          a0[i] = m0 + m1 + m2;
                          a1[i] = m1 - m2 - m3;
                        }
                        L.store(s[0] + tx, a0[0] + a0[1] + a0[2] + b);
                        L.store(s[1] + tx, a1[0] + a1[1] + a1[2] + b);
                        L.store(s[2] + tx, a0[1] - a0[2] - a0[3] + b);
                        L.store(s[3] + tx, a1[1] - a1[2] - a1[3] + b);
                      });
                      store_tile_row(scratch, 2, TW, ty, H, W, y + o * H * W);
                    });
}

// ---- F(4x4, 3x3): 6x6 input tiles, 36 products, 4x4 output tiles (interpolation points 0,
// +-1, +-2 and infinity). 36 multiplications per 16 outputs instead of 144; the transforms'
// larger coefficients cost some accuracy (see winograd_conv.cpp), and the tiles are 4x larger,
// so it pays where an image has many of them.
//   B^T = [4 0 -5 0 1 0; 0 -4 -4 1 1 0; 0 4 -4 -1 1 0; 0 -2 -1 2 1 0; 0 2 -1 -2 1 0;
//          0 4 0 -5 0 1]
//   G = [1/4 0 0; -1/6 -1/6 -1/6; -1/6 1/6 -1/6; 1/24 1/12 1/6; 1/24 -1/12 1/6; 0 0 1]
//   A^T = [1 1 1 1 1 0; 0 1 -1 2 -2 0; 0 1 1 4 4 0; 0 1 -1 8 -8 1]

// G applied to (a, b, c): six values.
template <typename T>
inline void winograd4_g(T a, T b, T c, T* t) {
  t[0] = 0.25f * a;
  t[1] = -(a + b + c) * (1.0f / 6.0f);
  t[2] = -(a - b + c) * (1.0f / 6.0f);
  t[3] = a * (1.0f / 24.0f) + b * (1.0f / 12.0f) + c * (1.0f / 6.0f);
  t[4] = a * (1.0f / 24.0f) - b * (1.0f / 12.0f) + c * (1.0f / 6.0f);
  t[5] = c;
}

// U[36][O][C] (rows o0..o1 of each plane) from w[O][C][3][3]. `scratch`: 9 * C floats.
void winograd4_weights(const float* w, int64_t o0, int64_t o1, int64_t C, float* U, int64_t plane,
                       float* scratch) {
  for_each_filter_row(w, o0, o1, C, scratch, [&](int64_t o, float* const* g) {
    float* u = U + o * C;
    over_lanes(C, [&](auto L, int64_t c) {
      using T = decltype(L.load(g[0]));
      T col[3][6];  // G applied to each column of g
      for (int j = 0; j < 3; ++j)
        winograd4_g(L.load(g[j] + c), L.load(g[3 + j] + c), L.load(g[6 + j] + c), col[j]);
      for (int r = 0; r < 6; ++r) {
        T t[6];
        winograd4_g(col[0][r], col[1][r], col[2][r], t);
        for (int j = 0; j < 6; ++j) L.store(u + (r * 6 + j) * plane + c, t[j]);
      }
    });
  });
}

// B^T applied to (d0..d5): six values.
template <typename T>
inline void winograd4_bt(T d0, T d1, T d2, T d3, T d4, T d5, T* r) {
  r[0] = 4.0f * d0 - 5.0f * d2 + d4;
  r[1] = d3 + d4 - 4.0f * (d1 + d2);
  r[2] = d4 - d3 + 4.0f * (d1 - d2);
  r[3] = d4 - d2 + 2.0f * (d3 - d1);
  r[4] = d4 - d2 + 2.0f * (d1 - d3);
  r[5] = 4.0f * d1 - 5.0f * d3 + d5;
}

// V[36][C][ld] for channels c0..c1 of one image x[C][H][W] (zero padding of 1): tile row ty
// (output rows 4ty..4ty+3) of tile rows ty0..ty1 goes to columns t0 + (ty - ty0) * TW + tx,
// TW = ceil(W / 4). `scratch`: 12 * (4 * TW + 8) + 4 * (TW + 1) floats.
void winograd4_input(const float* x, int64_t c0, int64_t c1, int64_t H, int64_t W, int64_t ty0,
                     int64_t ty1, float* V, int64_t plane, int64_t ld, int64_t t0, float* scratch) {
  const int64_t TW = (W + 3) / 4, width = 4 * TW + 8;
  // pad[k][1 + x] holds input row k of the tile row (zeros outside the image); rows[i] is row i
  // of B^T d over the padded width, so that tile tx reads rows[i][4tx .. 4tx + 5].
  float *pad[6], *rows[6], *phase[4];
  for (int k = 0; k < 6; ++k) {
    pad[k] = scratch + k * width;
    rows[k] = scratch + (6 + k) * width;
  }
  for (int q = 0; q < 4; ++q) phase[q] = scratch + 12 * width + q * (TW + 1);
  for (int k = 0; k < 6; ++k)
    for (int64_t i = 0; i < width; ++i) pad[k][i] = 0.0f;
  for (int64_t c = c0; c < c1; ++c) {
    const float* xc = x + c * H * W;
    for (int64_t ty = ty0; ty < ty1; ++ty) {
      for (int k = 0; k < 6; ++k) {
        const int64_t iy = 4 * ty - 1 + k;
        if (iy >= 0 && iy < H)
          std::memcpy(pad[k] + 1, xc + iy * W, sizeof(float) * W);
        else
          for (int64_t i = 1; i <= W; ++i) pad[k][i] = 0.0f;
      }
      over_lanes(width, [&](auto L, int64_t i) {
        using T = decltype(L.load(pad[0]));
        T r[6];
        winograd4_bt(L.load(pad[0] + i), L.load(pad[1] + i), L.load(pad[2] + i), L.load(pad[3] + i),
                     L.load(pad[4] + i), L.load(pad[5] + i), r);
        for (int k = 0; k < 6; ++k) L.store(rows[k] + i, r[k]);
      });
      float* out = V + c * ld + t0 + (ty - ty0) * TW;
      for (int i = 0; i < 6; ++i) {
        // Tile tx reads columns 4tx .. 4tx + 5 of rows[i]: phase[q][tx] = rows[i][4tx + q],
        // so that they are phase 0-3 at tx and phase 0-1 at tx + 1, contiguous over tx.
        for (int64_t t = 0; t <= TW; ++t)
          for (int q = 0; q < 4; ++q) phase[q][t] = rows[i][4 * t + q];
        over_lanes(TW, [&](auto L, int64_t tx) {
          using T = decltype(L.load(pad[0]));
          T v[6];
          winograd4_bt(L.load(phase[0] + tx), L.load(phase[1] + tx), L.load(phase[2] + tx),
                       L.load(phase[3] + tx), L.load(phase[0] + tx + 1), L.load(phase[1] + tx + 1),
                       v);
          for (int j = 0; j < 6; ++j) L.store(out + (i * 6 + j) * plane + tx, v[j]);
        });
      }
    }
  }
}

// A^T applied to (m0..m5): four values.
template <typename T>
inline void winograd4_at(T m0, T m1, T m2, T m3, T m4, T m5, T* y) {
  const T s12 = m1 + m2, d12 = m1 - m2, s34 = m3 + m4, d34 = m3 - m4;
  y[0] = m0 + s12 + s34;
  y[1] = d12 + 2.0f * d34;
  y[2] = s12 + 4.0f * s34;
  y[3] = d12 + 8.0f * d34 + m5;
}

// y[O][H][W] (one image), output channels o0..o1, from M[36][O][ld] laid out as
// winograd4_input's V, plus bias[o] (bias may be null). `scratch`: 16 * TW floats.
void winograd4_output(const float* M, int64_t o0, int64_t o1, int64_t plane, int64_t ld, int64_t t0,
                      const float* bias, int64_t H, int64_t W, int64_t ty0, int64_t ty1, float* y,
                      float* scratch) {
  const int64_t TW = (W + 3) / 4;
  for_each_tile_row(M, o0, o1, ld, t0, bias, TW, ty0, ty1,
                    [&](int64_t o, int64_t ty, const float* m, float b) {
                      over_lanes(TW, [&](auto L, int64_t tx) {
                        using T = decltype(L.load(m));
                        T a[6][4];
                        for (int i = 0; i < 6; ++i) {
                          const float* mi = m + i * 6 * plane + tx;
                          winograd4_at(L.load(mi), L.load(mi + plane), L.load(mi + 2 * plane),
                                       L.load(mi + 3 * plane), L.load(mi + 4 * plane),
                                       L.load(mi + 5 * plane), a[i]);
                        }
                        for (int q = 0; q < 4; ++q) {
                          T out[4];
                          winograd4_at(a[0][q], a[1][q], a[2][q], a[3][q], a[4][q], a[5][q], out);
                          for (int r = 0; r < 4; ++r)
                            L.store(scratch + (r * 4 + q) * TW + tx, out[r] + b);
                        }
                      });
                      store_tile_row(scratch, 4, TW, ty, H, W, y + o * H * W);
                    });
}
}  // namespace
}  // namespace diffuse::nn::kernels
