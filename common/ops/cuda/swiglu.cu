// SwiGLU gate (Shazeer 2020): out = silu(gate) * up, silu(g) = g * sigmoid(g).
// Backward: dgate = dout * up * s * (1 + g (1 - s)), dup = dout * silu(g)
// (assigned; either may be NULL; they may alias gate/up/dout elementwise).
// f32 math, bf16 storage; 16-byte accesses when aligned.
#include "common/ops/cuda/cuda_common.cuh"

__device__ __forceinline__ float sigm(float g) { return 1.0f / (1.0f + __expf(-g)); }

__global__ void swiglu_fwd_vec(uint4 *out, const uint4 *gate, const uint4 *up, size_t n8) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n8;
         i += (size_t)gridDim.x * blockDim.x) {
        uint4 g = gate[i], u = up[i], r;
        const bf16 *gp = (const bf16 *)&g, *upp = (const bf16 *)&u;
        bf16 *rp = (bf16 *)&r;
#pragma unroll
        for (int k = 0; k < 8; k++) {
            float gv = __bfloat162float(gp[k]);
            rp[k] = __float2bfloat16_rn(gv * sigm(gv) * __bfloat162float(upp[k]));
        }
        out[i] = r;
    }
}
__global__ void swiglu_fwd(bf16 *out, const bf16 *gate, const bf16 *up, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        float gv = __bfloat162float(gate[i]);
        out[i] = __float2bfloat16_rn(gv * sigm(gv) * __bfloat162float(up[i]));
    }
}

void cuda_swiglu_forward(const ops_ctx_t *c, void *out, const void *gate, const void *up,
                         size_t n) {
    if (!n) return;
    if (n % 8 == 0 && aligned16(out) && aligned16(gate) && aligned16(up))
        swiglu_fwd_vec<<<cuda_blocks(n / 8, 256), 256, 0, cuda_stream(c)>>>(
            (uint4 *)out, (const uint4 *)gate, (const uint4 *)up, n / 8);
    else
        swiglu_fwd<<<cuda_blocks(n, 256), 256, 0, cuda_stream(c)>>>(
            (bf16 *)out, (const bf16 *)gate, (const bf16 *)up, n);
    cuda_check_launch();
}

__global__ void swiglu_bwd(bf16 *dgate, bf16 *dup, const bf16 *dout, const bf16 *gate,
                           const bf16 *up, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        float g = __bfloat162float(gate[i]), u = __bfloat162float(up[i]);
        float d = __bfloat162float(dout[i]);
        float s = sigm(g);
        if (dgate) dgate[i] = __float2bfloat16_rn(d * u * s * (1.0f + g * (1.0f - s)));
        if (dup) dup[i] = __float2bfloat16_rn(d * g * s);
    }
}

__global__ void swiglu_bwd_vec(uint4 *dgate, uint4 *dup, const uint4 *dout, const uint4 *gate,
                               const uint4 *up, size_t n8) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n8;
         i += (size_t)gridDim.x * blockDim.x) {
        uint4 gv = gate[i], uv = up[i], dv = dout[i], rg, ru;
        const bf16 *gp = (const bf16 *)&gv, *upp = (const bf16 *)&uv, *dp = (const bf16 *)&dv;
        bf16 *rgp = (bf16 *)&rg, *rup = (bf16 *)&ru;
#pragma unroll
        for (int k = 0; k < 8; k++) {
            float g = __bfloat162float(gp[k]), u = __bfloat162float(upp[k]);
            float d = __bfloat162float(dp[k]), s = sigm(g);
            rgp[k] = __float2bfloat16_rn(d * u * s * (1.0f + g * (1.0f - s)));
            rup[k] = __float2bfloat16_rn(d * g * s);
        }
        if (dgate) dgate[i] = rg;
        if (dup) dup[i] = ru;
    }
}

void cuda_swiglu_backward(const ops_ctx_t *c, void *dgate, void *dup, const void *dout,
                          const void *gate, const void *up, size_t n) {
    if (!n || (!dgate && !dup)) return;
    if (n % 8 == 0 && aligned16(dout) && aligned16(gate) && aligned16(up) &&
        (!dgate || aligned16(dgate)) && (!dup || aligned16(dup))) {
        swiglu_bwd_vec<<<cuda_blocks(n / 8, 256), 256, 0, cuda_stream(c)>>>(
            (uint4 *)dgate, (uint4 *)dup, (const uint4 *)dout, (const uint4 *)gate,
            (const uint4 *)up, n / 8);
        cuda_check_launch();
        return;
    }
    swiglu_bwd<<<cuda_blocks(n, 256), 256, 0, cuda_stream(c)>>>(
        (bf16 *)dgate, (bf16 *)dup, (const bf16 *)dout, (const bf16 *)gate, (const bf16 *)up, n);
    cuda_check_launch();
}
