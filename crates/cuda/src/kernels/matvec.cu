// Quantized matrix-vector products (the decode path: 1-8 activation rows) and the
// activation quantizers, bit-identical to frink's scalar twins (frink-quant
// dot/scalar.rs, dot/quantize.rs): the same integer block sums, the same f32 block value
// formula, each block's value added into lane b % 8 in block order, and the eight lanes
// combined by the same tree.
//
// Layout: weight row r of a matrix is `nb` stored ggml blocks at w + r * nb * WB (the
// file's bytes, uploaded as they are); activation row a is `nb` quantized blocks at
// act + a * nb * AB; y[a * rows + r] receives the dot product.
// Launch: grid (ceil(rows / 4), n_act), block 32: four rows per warp, eight threads per
// row, thread k of a row summing blocks k, k + 8, k + 16, ... (the CPU's lane k).

// ---- block values (one weight block against one activation block) --------------------

// The 32 4-bit values of a legacy block's 16 nibble bytes, element j.
__device__ __forceinline__ i32 nib(const u8* qs, int j) {
    return j < 16 ? (qs[j] & 0x0F) : (qs[j - 16] >> 4);
}

// Bit j of the little-endian u32 at p, as 16 or 0.
__device__ __forceinline__ i32 hbit16(const u8* p, int j) {
    return (i32)(((u32_at(p) >> j) & 1u) << 4);
}

__device__ __forceinline__ float q4_0_block(const u8* w, const u8* a) {
    i32 isum = 0;
    for (int j = 0; j < 32; j++) isum += (nib(w + 2, j) - 8) * i8_at(a + 2 + j);
    return (f16_at(w) * f16_at(a)) * (float)isum;
}

__device__ __forceinline__ i32 ysum(const u8* a) {
    i32 s = 0;
    for (int j = 0; j < 32; j++) s += i8_at(a + 2 + j);
    return s;
}

__device__ __forceinline__ float q4_1_block(const u8* w, const u8* a) {
    i32 isum = 0;
    for (int j = 0; j < 32; j++) isum += nib(w + 4, j) * i8_at(a + 2 + j);
    float dx = f16_at(a);
    return (f16_at(w) * dx) * (float)isum + (f16_at(w + 2) * dx) * (float)ysum(a);
}

__device__ __forceinline__ float q5_0_block(const u8* w, const u8* a) {
    i32 isum = 0;
    for (int j = 0; j < 32; j++)
        isum += (nib(w + 6, j) + hbit16(w + 2, j) - 16) * i8_at(a + 2 + j);
    return (f16_at(w) * f16_at(a)) * (float)isum;
}

__device__ __forceinline__ float q5_1_block(const u8* w, const u8* a) {
    i32 isum = 0;
    for (int j = 0; j < 32; j++) isum += (nib(w + 8, j) + hbit16(w + 4, j)) * i8_at(a + 2 + j);
    float dx = f16_at(a);
    return (f16_at(w) * dx) * (float)isum + (f16_at(w + 2) * dx) * (float)ysum(a);
}

__device__ __forceinline__ float q8_0_block(const u8* w, const u8* a) {
    i32 isum = 0;
    for (int j = 0; j < 32; j++) isum += i8_at(w + 2 + j) * i8_at(a + 2 + j);
    return (f16_at(w) * f16_at(a)) * (float)isum;
}

// Scale and min j of a Q4_K / Q5_K block's 12 scale bytes (ggml get_scale_min_k4).
__device__ __forceinline__ void scale_min_k4(int j, const u8* s, i32* sc, i32* m) {
    if (j < 4) {
        *sc = s[j] & 63;
        *m = s[j + 4] & 63;
    } else {
        *sc = (s[j + 4] & 0x0F) | ((s[j - 4] >> 6) << 4);
        *m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
    }
}

// sum_j m_j * (bsums[2j] + bsums[2j+1]) over a Q8_K block's bsums (at byte 260).
__device__ __forceinline__ i32 k4_min_sum(const i32* m, const u8* a) {
    i32 s = 0;
    for (int j = 0; j < 8; j++) s += m[j] * (i16_at(a + 260 + 4 * j) + i16_at(a + 262 + 4 * j));
    return s;
}

__device__ __forceinline__ float q4_k_block(const u8* w, const u8* a) {
    i32 sc[8], m[8];
    for (int j = 0; j < 8; j++) scale_min_k4(j, w + 4, &sc[j], &m[j]);
    const u8* qs = w + 16;
    i32 sumi = 0;
    for (int s = 0; s < 8; s++) {
        i32 sub = 0;
        for (int l = 0; l < 32; l++)
            sub += ((qs[32 * (s / 2) + l] >> (4 * (s % 2))) & 0x0F) * i8_at(a + 4 + 32 * s + l);
        sumi += sc[s] * sub;
    }
    i32 summ = k4_min_sum(m, a);
    float dx = f32_at(a);
    return (dx * f16_at(w)) * (float)sumi - (dx * f16_at(w + 2)) * (float)summ;
}

__device__ __forceinline__ float q5_k_block(const u8* w, const u8* a) {
    i32 sc[8], m[8];
    for (int j = 0; j < 8; j++) scale_min_k4(j, w + 4, &sc[j], &m[j]);
    const u8* qh = w + 16;
    const u8* qs = w + 48;
    i32 sumi = 0;
    for (int s = 0; s < 8; s++) {
        i32 sub = 0;
        for (int l = 0; l < 32; l++) {
            i32 q = ((qs[32 * (s / 2) + l] >> (4 * (s % 2))) & 0x0F) + 16 * ((qh[l] >> s) & 1);
            sub += q * i8_at(a + 4 + 32 * s + l);
        }
        sumi += sc[s] * sub;
    }
    i32 summ = k4_min_sum(m, a);
    float dx = f32_at(a);
    return (dx * f16_at(w)) * (float)sumi - (dx * f16_at(w + 2)) * (float)summ;
}

__device__ __forceinline__ float q6_k_block(const u8* w, const u8* a) {
    const u8* ql = w;
    const u8* qh = w + 128;
    i32 sumi = 0, bs = 0;
    for (int g = 0; g < 16; g++) {
        i32 sc = i8_at(w + 192 + g);
        i32 sub = 0;
        for (int e = 16 * g; e < 16 * g + 16; e++) {
            int n = e / 128, k = (e % 128) / 32, l = e % 32;
            i32 low = (ql[64 * n + 32 * (k % 2) + l] >> (4 * (k / 2))) & 0x0F;
            i32 high = (qh[32 * n + l] >> (2 * k)) & 3;
            sub += (low | (high << 4)) * i8_at(a + 4 + e);
        }
        sumi += sc * sub;
        bs += sc * i16_at(a + 260 + 2 * g);
    }
    sumi -= 32 * bs;
    return (f32_at(a) * f16_at(w + 208)) * (float)sumi;
}

// ---- the products ----------------------------------------------------------------------

#define MV_KERNEL(NAME, WB, AB, BLOCK)                                                     \
extern "C" __global__ void NAME(const u8* __restrict__ w, const u8* __restrict__ act,      \
                                float* __restrict__ y, int rows, int nb) {                 \
    int lane = threadIdx.x & 7;                                                            \
    int r = blockIdx.x * 4 + (threadIdx.x >> 3);                                           \
    int a = blockIdx.y;                                                                    \
    float s = 0.0f;                                                                        \
    if (r < rows) {                                                                        \
        const u8* wr = w + (u64)r * nb * WB;                                               \
        const u8* ar = act + (u64)a * nb * AB;                                             \
        for (int b = lane; b < nb; b += 8) s += BLOCK(wr + (u64)b * WB, ar + (u64)b * AB); \
    }                                                                                      \
    s = lane_tree8(s);                                                                     \
    if (lane == 0 && r < rows) y[(u64)a * rows + r] = s;                                   \
}

MV_KERNEL(mv_q4_0, 18, 34, q4_0_block)
MV_KERNEL(mv_q4_1, 20, 34, q4_1_block)
MV_KERNEL(mv_q5_0, 22, 34, q5_0_block)
MV_KERNEL(mv_q5_1, 24, 34, q5_1_block)
MV_KERNEL(mv_q8_0, 34, 34, q8_0_block)
MV_KERNEL(mv_q4_k, 144, 292, q4_k_block)
MV_KERNEL(mv_q5_k, 176, 292, q5_k_block)
MV_KERNEL(mv_q6_k, 210, 292, q6_k_block)

// ---- activation quantizers -------------------------------------------------------------

// round(v) half away from zero, as frink's round_away (truncate, then step when the exact
// remainder is at least one half).
__device__ __forceinline__ i32 round_away(float v) {
    i32 t = (i32)v;
    float r = v - (float)t;
    return t + (r >= 0.5f ? 1 : 0) - (r <= -0.5f ? 1 : 0);
}

// ggml's nearest_int: round to nearest, ties to even, by the float trick.
__device__ __forceinline__ i32 nearest_int(float v) {
    float t = v + 12582912.0f;
    return (i32)(((u32)__float_as_int(t)) & 0x007fffffu) - 0x00400000;
}

// Q8_0 blocks of x (n values, n a multiple of 32) into out (34 bytes a block): one thread
// per block. Grid: ceil(n / 32 / 128), block 128.
extern "C" __global__ void quantize_q8_0(const float* __restrict__ x, u8* __restrict__ out, int n) {
    int b = blockIdx.x * blockDim.x + threadIdx.x;
    if (b >= n / 32) return;
    const float* v = x + 32 * b;
    float amax = 0.0f;
    for (int j = 0; j < 32; j++) {
        float a = fabsf(v[j]);
        amax = amax > a ? amax : a;
    }
    float d = amax / 127.0f;
    float id = d != 0.0f ? 1.0f / d : 0.0f;
    u8* o = out + 34 * b;
    u16 h = f32_to_f16(d);
    o[0] = (u8)(h & 0xff);
    o[1] = (u8)(h >> 8);
    for (int j = 0; j < 32; j++) o[2 + j] = (u8)(i8)round_away(v[j] * id);
}

// Q8_K blocks of x (n values, n a multiple of 256) into out (292 bytes a block: f32 d,
// 256 i8 quants, 16 i16 sums of 16 quants): one thread per block. Grid: ceil(n / 256 /
// 32), block 32.
extern "C" __global__ void quantize_q8_k(const float* __restrict__ x, u8* __restrict__ out, int n) {
    int b = blockIdx.x * blockDim.x + threadIdx.x;
    if (b >= n / 256) return;
    const float* v = x + 256 * b;
    u8* o = out + 292 * b;
    float amax = 0.0f;
    for (int j = 0; j < 256; j++) {
        float a = fabsf(v[j]);
        amax = amax > a ? amax : a;
    }
    for (int j = 0; j < 292; j++) o[j] = 0;
    if (amax == 0.0f) return;
    // ggml keeps the first value of the largest magnitude.
    float max = 0.0f;
    for (int j = 0; j < 256; j++) {
        if (fabsf(v[j]) == amax) {
            max = v[j];
            break;
        }
    }
    float iscale = -127.0f / max;
    for (int j = 0; j < 256; j++) {
        i32 q = nearest_int(iscale * v[j]);
        o[4 + j] = (u8)(i8)(q < 127 ? q : 127);
    }
    for (int g = 0; g < 16; g++) {
        i32 s = 0;
        for (int j = 0; j < 16; j++) s += (i32)(i8)o[4 + 16 * g + j];
        i16 s16 = (i16)s;
        o[260 + 2 * g] = (u8)((u16)s16 & 0xff);
        o[261 + 2 * g] = (u8)((u16)s16 >> 8);
    }
    float d = 1.0f / iscale;
    u32 db = (u32)__float_as_int(d);
    o[0] = (u8)(db & 0xff);
    o[1] = (u8)((db >> 8) & 0xff);
    o[2] = (u8)((db >> 16) & 0xff);
    o[3] = (u8)(db >> 24);
}

// ---- norms ---------------------------------------------------------------------------

// RMSNorm of each dim-sized row of x in place, times weight, as frink's rms_norm: the
// squares summed in f64, element i into lane i % 8, the lanes by the tree; mean rounded
// to f32; scale = 1 / sqrt(mean + eps); v = (v * scale) * w.
// Grid: rows, block 256 (threads 0..8 the lanes; all of them the scaling).
extern "C" __global__ void rms_norm(float* __restrict__ x, const float* __restrict__ weight,
                                    int dim, float eps) {
    __shared__ float scale_s;
    float* row = x + (u64)blockIdx.x * dim;
    if (threadIdx.x < 32) {
        double l = 0.0;
        if (threadIdx.x < 8) {
            for (int i = threadIdx.x; i < dim; i += 8) l += (double)row[i] * (double)row[i];
        }
        double sum = lane_tree8_f64(l);
        if (threadIdx.x == 0) {
            float mean = (float)(sum / (double)dim);
            scale_s = 1.0f / sqrtf(mean + eps);
        }
    }
    __syncthreads();
    float scale = scale_s;
    for (int i = threadIdx.x; i < dim; i += blockDim.x) row[i] = (row[i] * scale) * weight[i];
}

// ---- measurement ---------------------------------------------------------------------

// Reads n 16-byte words of src (a grid-stride loop) and writes one word per thread that
// depends on all it read (so nothing is optimised away): the read-bandwidth probe.
extern "C" __global__ void read_bandwidth(const uint4* __restrict__ src, u64 n, uint4* __restrict__ sink) {
    uint4 acc = make_uint4(0, 0, 0, 0);
    u64 stride = (u64)gridDim.x * blockDim.x;
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        uint4 v = src[i];
        acc.x ^= v.x;
        acc.y ^= v.y;
        acc.z ^= v.z;
        acc.w ^= v.w;
    }
    sink[(u64)blockIdx.x * blockDim.x + threadIdx.x] = acc;
}
