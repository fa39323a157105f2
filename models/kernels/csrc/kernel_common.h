/*
 * What cpu_kernels.c and forgetting_attn.c share: the libmvec declarations and the core of
 * the inlined float32 exp. It belongs in the source list of every KernelLibrary whose main
 * file includes it (models/kernels/*_cpu.py): the build cache is keyed by a hash of those
 * files, so a change here must rebuild both libraries.
 */
#ifndef KERNEL_COMMON_H
#define KERNEL_COMMON_H

#include <math.h>
#include <string.h>

#ifdef SCAN_VECTOR_EXP
/* Declare glibc's vector variants (libmvec) so the compiler may call them from
 * vectorised loops; math.h only does this under -ffast-math, which we avoid because it
 * would also change NaN semantics and the process-wide denormal mode. */
float expf(float) __attribute__((simd("notinbranch")));
double exp(double) __attribute__((simd("notinbranch")));
float log1pf(float) __attribute__((simd("notinbranch")));
double log1p(double) __attribute__((simd("notinbranch")));
#endif

/* e^x in float32 for x in [-87, 88] (the callers clamp), inlined so that the loops calling
 * it vectorise (a call into libmvec per vector of 16 cost more than the rest of a scan
 * step): Cody-Waite range reduction x = n ln2 + r, |r| <= ln2 / 2, then e^r by its Taylor
 * polynomial to r^7 / 7! (truncation error < 1e-8, below float32's 6e-8 resolution), then
 * scaling by 2^n through the exponent bits (a normal number over that range of x). */
static inline __attribute__((always_inline)) float exp_core_f32(float x) {
    /* round to the nearest integer by the 1.5 * 2^23 shift (floorf blocks vectorisation) */
    const float shifter = 12582912.0f;
    const float n = (x * 1.44269504088896341f + shifter) - shifter;
    const float r = (x - n * 0.693145751953125f) - n * 1.42860682030941723e-6f;
    float p = 1.0f / 5040.0f;
    p = p * r + 1.0f / 720.0f;
    p = p * r + 1.0f / 120.0f;
    p = p * r + 1.0f / 24.0f;
    p = p * r + 1.0f / 6.0f;
    p = p * r + 0.5f;
    p = p * r + 1.0f;
    p = p * r + 1.0f;
    const unsigned bits = (unsigned)((int)n + 127) << 23;
    float scale;
    memcpy(&scale, &bits, sizeof scale);
    return p * scale;
}

#endif
