// frink CUDA kernels: shared definitions. No header is included (NVRTC runs without a
// toolkit's include folder): types, f16 conversion and byte reads are defined here.
//
// Bit-identity with the CPU: every kernel computes what frink's scalar twin computes, in
// the same floating-point order (the integer sums of a block are exact in any order), and
// the sources are compiled with --fmad=false so no multiply-add is contracted.

typedef unsigned char u8;
typedef signed char i8;
typedef unsigned short u16;
typedef short i16;
typedef unsigned int u32;
typedef int i32;
typedef unsigned long long u64;

#define FULL_MASK 0xffffffffu

// The f16 at p (two bytes, little-endian), widened exactly (cvt.f32.f16 is exact).
__device__ __forceinline__ float f16_at(const u8* p) {
    u16 h = (u16)p[0] | ((u16)p[1] << 8);
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
}

// f32 -> f16 bits, round to nearest even (half::f16::from_f32 on the CPU).
__device__ __forceinline__ u16 f32_to_f16(float f) {
    u16 h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
    return h;
}

// The bf16 at p, widened (exact).
__device__ __forceinline__ float bf16_at(const u8* p) {
    u32 b = ((u32)p[0] | ((u32)p[1] << 8)) << 16;
    return __int_as_float((int)b);
}

__device__ __forceinline__ float f32_at(const u8* p) {
    u32 b = (u32)p[0] | ((u32)p[1] << 8) | ((u32)p[2] << 16) | ((u32)p[3] << 24);
    return __int_as_float((int)b);
}

__device__ __forceinline__ i32 i16_at(const u8* p) {
    return (i32)(i16)((u16)p[0] | ((u16)p[1] << 8));
}

__device__ __forceinline__ u32 u32_at(const u8* p) {
    return (u32)p[0] | ((u32)p[1] << 8) | ((u32)p[2] << 16) | ((u32)p[3] << 24);
}

__device__ __forceinline__ i32 i8_at(const u8* p) {
    return (i32)(i8)p[0];
}

// The sum of a float over the eight threads of an aligned group, in the CPU's lane tree
// ((l0 + l1) + (l2 + l3)) + ((l4 + l5) + (l6 + l7)): the result on every thread of the
// group (a + b and b + a are the same bits).
__device__ __forceinline__ float lane_tree8(float s) {
    s = s + __shfl_xor_sync(FULL_MASK, s, 1);
    s = s + __shfl_xor_sync(FULL_MASK, s, 2);
    s = s + __shfl_xor_sync(FULL_MASK, s, 4);
    return s;
}

__device__ __forceinline__ double lane_tree8_f64(double s) {
    s = s + __shfl_xor_sync(FULL_MASK, s, 1);
    s = s + __shfl_xor_sync(FULL_MASK, s, 2);
    s = s + __shfl_xor_sync(FULL_MASK, s, 4);
    return s;
}
