"""The C prelude every generated kernel file starts with: headers, the vector math
declarations gcc maps to libmvec, half-type conversions, exp without libmvec's slow path,
and NaN-propagating min / max (numpy's semantics)."""

VECTOR_MATH = ("exp", "log", "sin", "cos", "tanh")

PRELUDE = """#include <stdint.h>
#include <string.h>
#include <math.h>
""" + "".join(
    f'__attribute__((simd("notinbranch"))) {t} {f}{s}({t});\n'
    for f in VECTOR_MATH for t, s in (("float", "f"), ("double", ""))
) + "".join(
    f'__attribute__((simd("notinbranch"))) {t} pow{s}({t}, {t});\n'
    for t, s in (("float", "f"), ("double", ""))
) + """
static inline float ld_bf16(uint16_t u) {
  uint32_t w = (uint32_t)u << 16; float f; memcpy(&f, &w, 4); return f;
}
static inline uint16_t st_bf16(float f) {
  uint32_t w; memcpy(&w, &f, 4);
  uint32_t r = (w + 0x7fffu + ((w >> 16) & 1u)) >> 16;
  uint32_t q = ((w >> 16) & 0x8000u) | 0x7fc0u;
  return (uint16_t)((w & 0x7fffffffu) > 0x7f800000u ? q : r);
}
static inline float rd_bf16(float f) { return ld_bf16(st_bf16(f)); }
static inline float rd_f16(float f) { return (float)(_Float16)f; }
/* f32 exp, inline: no libmvec call, no slow path. e^x = 2^k e^r, k = round(x / ln 2),
   r = x - k ln2 in two fused steps (Cody-Waite), e^r by its degree-7 Taylor series as
   1 + (r + r^2 q(r)) in fused multiply-adds (|r| <= 0.347: truncation < 2^-27), 2^k as two
   power-of-two factors so a subnormal result is rounded once, at the last multiply.
   Measured: within 1 ulp of the correctly rounded e^x, 3 of numpy's; 256k values in
   0.081 ms against numpy's 0.123 (0.119 without the fused steps). Outside (L, H) =
   (-104, 89), the result is selected, not computed (a causal mask's -1e9 or -inf would
   cost a microcode assist per vector): 0 below, inf above, NaN for NaN. */
static inline float exp_r_f(float c, float *kf_out) { /* e^r, where c = k ln2 + r */
  float kf = fmaf(c, 0x1.715476p+0f, 0x1.8p23f) - 0x1.8p23f;
  float r = fmaf(kf, -0x1.7f7d1cp-20f, fmaf(kf, -0x1.62e4p-1f, c));
  float q = fmaf(0x1.a01a02p-13f, r, 0x1.6c16c2p-10f);
  q = fmaf(q, r, 0x1.111112p-7f);
  q = fmaf(q, r, 0x1.555556p-5f);
  q = fmaf(q, r, 0x1.555556p-3f);
  q = fmaf(q, r, 0.5f);
  *kf_out = kf;
  return 1.0f + fmaf(r * r, q, r);
}
static inline float exp_f(float x) {
  int in = (x > -0x1.ap+6f) & (x < 0x1.64p+6f);
  float kf, p = exp_r_f(in ? x : 0.0f, &kf);
  int32_t k = (int32_t)kf, k1 = k >> 1, k2 = k - k1;
  int32_t b1 = (k1 + 127) << 23, b2 = (k2 + 127) << 23;
  float s1, s2; memcpy(&s1, &b1, 4); memcpy(&s2, &b2, 4);
  float e = (p * s1) * s2;
  return in ? e : x <= -0x1.ap+6f ? 0.0f : x + INFINITY;
}
/* 1 + e^-x in f32: sigmoid's and silu's denominator, bit-equal to 1.0f + exp_f(-x) and
   cheaper (silu(x) * y over 1.4M f32: 0.34 against 0.42 ms, libmvec's tanhf form 0.41).
   -x is clamped to [-80, 88.75]: below, e^-x < 2^-115 vanishes beside 1 either way; above
   (and at 88.75, past f32's largest e^z at 88.72) the product overflows to inf, as numpy's
   exp does; NaN stays NaN. 2^k is one factor, 2 * 2^(k - 1), so k up to 128 is exact. */
static inline float one_plus_exp_neg_f(float x) {
  float z = -x;
  float kf, p = exp_r_f(z < -80.0f ? -80.0f : (z > 88.75f ? 88.75f : z), &kf);
  int32_t b = ((int32_t)kf + 126) << 23;
  float s; memcpy(&s, &b, 4);
  return 1.0f + (p * 2.0f) * s;
}
#define one_plus_exp_neg_d(x) (1.0 + exp_d(-(x)))
/* f64 exp off libmvec's slow path. Its vector exp falls back to scalar code, lane by lane,
   for |x| >= B (708.396: measured), and a causal mask's -1e9 or -inf costs ~15x. A loop
   whose exp arguments all lie within B calls it plainly (checked first, EXP_FAR_d);
   otherwise it calls exp_d, whose one vector call always sees |a| < B: past -B or B, x is
   shifted by an exact D (x -+ D rounds nothing) and scaled back by S ~ e^+-D, a double
   within 2^-68 of it, so the result is rounded once more: into the subnormals, or to inf
   past the overflow. At or below L (at or above H, NaN) the result is selected, not
   computed: a multiply that underflows costs a microcode assist per vector. */
#define EXP_SAFE(NAME, T, EXP, L, H, B, DLO, SLO, DHI, SHI) \
  static inline T NAME(T x) { \
    T c = ((x > (T)L) & (x < (T)H)) ? x : (T)0.0; \
    T lo = c <= -(T)B, hi = c >= (T)B; /* 0 or 1: arithmetic, so gcc makes one call, not three */ \
    T s = x != x ? x : x <= (T)L ? (T)0.0 : x >= (T)H ? (T)INFINITY \
        : lo > 0 ? (T)SLO : hi > 0 ? (T)SHI : (T)1.0; \
    return EXP(c + lo * (T)DLO - hi * (T)DHI) * s; \
  }
EXP_SAFE(exp_d, double, exp, -0x1.75p+9, 0x1.63p+9, 0x1.6232bp+9,
         0x1.f4d2bfafp+5, 0x1.9b07ae1b1b5e5p-91, 0x1.f0664378800p+4, 0x1.b167300d45d6ep+44)
#define EXP_FAR_d(a) (!(fabs(a) < 0x1.6232bp+9))
#define NMAX(a, b) (((a) != (a)) ? (a) : ((a) > (b) ? (a) : (b)))
#define NMIN(a, b) (((a) != (a)) ? (a) : ((a) < (b) ? (a) : (b)))
"""
