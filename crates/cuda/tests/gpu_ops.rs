//! The CUDA kernels against the CPU path, on a GPU: every quantized product (1-8
//! activation rows), the activation quantizers and RMSNorm on random inputs, compared bit
//! for bit with frink's scalar twins (the kernels compute the same integers and the same
//! floating-point tail in the same order).
//!
//! Without a GPU each test prints SKIPPED; with `FRINK_TEST_CUDA=1` a missing GPU fails.

use frink_cuda::device::{Arg, Context};
use frink_cuda::ffi::Nvrtc;
use frink_cuda::kernels::{MATVEC, OPTIONS};
use frink_cuda::nvrtc::compile;
use frink_quant::dot::{dot_scalar, quantize_activation, vec_dot_type};
use frink_quant::GgmlType;

/// A context on GPU 0 and the compiled MATVEC module, or `None` (SKIPPED printed).
fn gpu() -> Option<(Context, frink_cuda::device::Module)> {
    let ctx = match Context::new(0) {
        Ok(c) => c,
        Err(e) => {
            if std::env::var("FRINK_TEST_CUDA").is_ok_and(|v| v == "1") {
                panic!("FRINK_TEST_CUDA=1 but no usable GPU: {e}");
            }
            // Each test runs on a thread named after it.
            let test = std::thread::current()
                .name()
                .unwrap_or("a GPU check")
                .to_string();
            frink_testdata::skipped(&test, &format!("no usable GPU: {e}"));
            return None;
        }
    };
    let nvrtc = Nvrtc::open().unwrap_or_else(|e| panic!("a GPU but no NVRTC: {e}"));
    let cubin = compile(&nvrtc, MATVEC.name, MATVEC.text, ctx.gpu.cc, OPTIONS, None)
        .unwrap_or_else(|e| panic!("{e}"));
    let module = ctx.load(&cubin.image).unwrap_or_else(|e| panic!("{e}"));
    Some((ctx, module))
}

/// A small deterministic generator.
struct Rng(u64);

impl Rng {
    fn u8(&mut self) -> u8 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 >> 24) as u8
    }
    fn f32(&mut self) -> f32 {
        let v = u32::from_le_bytes([self.u8(), self.u8(), self.u8(), self.u8()]);
        (v as f32 / u32::MAX as f32) * 2.0 - 1.0
    }
}

/// The byte offsets of a block's f16 scale fields (set to small finite values; every
/// other byte is random).
fn f16_fields(ty: GgmlType) -> &'static [usize] {
    match ty {
        GgmlType::Q4_0 | GgmlType::Q5_0 | GgmlType::Q8_0 => &[0],
        GgmlType::Q4_1 | GgmlType::Q5_1 | GgmlType::Q4_K | GgmlType::Q5_K => &[0, 2],
        GgmlType::Q6_K => &[208],
        _ => &[],
    }
}

/// `rows` random rows of `nb` blocks of `ty`.
fn weights(rng: &mut Rng, ty: GgmlType, rows: usize, nb: usize) -> Vec<u8> {
    let ts = ty.type_size();
    let mut w: Vec<u8> = (0..rows * nb * ts).map(|_| rng.u8()).collect();
    for b in w.chunks_exact_mut(ts) {
        for &at in f16_fields(ty) {
            let v = half::f16::from_f32(rng.f32() * 0.05);
            b[at..at + 2].copy_from_slice(&v.to_le_bytes());
        }
    }
    w
}

fn f32_bytes(x: &[f32]) -> Vec<u8> {
    x.iter().flat_map(|v| v.to_le_bytes()).collect()
}

/// The kernel name of `ty`'s product.
fn mv_kernel(ty: GgmlType) -> String {
    format!("mv_{}", format!("{ty}").to_ascii_lowercase())
}

#[test]
fn products_and_activation_quantizers_match_the_cpu_bit_for_bit() {
    let Some((ctx, m)) = gpu() else {
        return;
    };
    let mut rng = Rng(0x5eed_0001);
    use GgmlType as T;
    for ty in [
        T::Q4_0,
        T::Q4_1,
        T::Q5_0,
        T::Q5_1,
        T::Q8_0,
        T::Q4_K,
        T::Q5_K,
        T::Q6_K,
    ] {
        let act_ty = vec_dot_type(ty).unwrap();
        let per = ty.block_size();
        for (rows, nb, n_act) in [(1, 1, 1), (7, 9, 3), (37, 16, 8), (129, 3, 2)] {
            let cols = nb * per;
            let w = weights(&mut rng, ty, rows, nb);
            let x: Vec<f32> = (0..n_act * cols).map(|_| rng.f32() * 4.0).collect();
            // The CPU: quantized activations and the scalar twin's dot products.
            let ab = nb * act_ty.type_size();
            let mut a = vec![0u8; n_act * ab];
            for (xr, ar) in x.chunks_exact(cols).zip(a.chunks_exact_mut(ab)) {
                quantize_activation(act_ty, xr, ar).unwrap();
            }
            let rb = nb * ty.type_size();
            let want: Vec<f32> = (0..n_act)
                .flat_map(|q| {
                    let (w, a) = (&w, &a);
                    (0..rows).map(move |r| {
                        dot_scalar(ty, &w[r * rb..(r + 1) * rb], &a[q * ab..(q + 1) * ab]).unwrap()
                    })
                })
                .collect();
            // The GPU: the same activations quantized there, then the product.
            let xd = ctx.upload(&f32_bytes(&x)).unwrap();
            let ad = ctx.alloc(a.len()).unwrap();
            let (qk, block_vals) = if act_ty == T::Q8_K {
                ("quantize_q8_k", 256)
            } else {
                ("quantize_q8_0", 32)
            };
            let n_blocks = (n_act * cols / block_vals) as u32;
            // SAFETY: x holds n_act * cols floats, ad n_blocks quantized blocks.
            unsafe {
                m.function(qk)
                    .unwrap()
                    .launch(
                        (n_blocks.div_ceil(32), 1, 1),
                        (32, 1, 1),
                        0,
                        &[
                            Arg::Ptr(xd.ptr()),
                            Arg::Ptr(ad.ptr()),
                            Arg::I32((n_act * cols) as i32),
                        ],
                    )
                    .unwrap();
            }
            let mut got_a = vec![0u8; a.len()];
            ad.download(&mut got_a).unwrap();
            assert_eq!(got_a, a, "{act_ty} quantization of {n_act}x{cols} values");
            let wd = ctx.upload(&w).unwrap();
            let yd = ctx.alloc(want.len() * 4).unwrap();
            // SAFETY: wd holds rows x nb blocks, ad n_act rows of nb activation blocks, yd
            // n_act x rows floats.
            unsafe {
                m.function(&mv_kernel(ty))
                    .unwrap()
                    .launch(
                        ((rows as u32).div_ceil(4), n_act as u32, 1),
                        (32, 1, 1),
                        0,
                        &[
                            Arg::Ptr(wd.ptr()),
                            Arg::Ptr(ad.ptr()),
                            Arg::Ptr(yd.ptr()),
                            Arg::I32(rows as i32),
                            Arg::I32(nb as i32),
                        ],
                    )
                    .unwrap();
            }
            let got = yd.download_f32(want.len()).unwrap();
            for (i, (g, e)) in got.iter().zip(&want).enumerate() {
                assert_eq!(
                    g.to_bits(),
                    e.to_bits(),
                    "{ty} {rows}x{nb} blocks, {n_act} rows: element {i}: GPU {g:e}, CPU {e:e}"
                );
            }
        }
    }
}

#[test]
fn rms_norm_matches_the_cpu_bit_for_bit() {
    let Some((ctx, m)) = gpu() else {
        return;
    };
    let mut rng = Rng(0x5eed_0002);
    for (rows, dim) in [(1usize, 8i32), (3, 576), (5, 4096), (2, 1001)] {
        let dim_u = dim as usize;
        let x: Vec<f32> = (0..rows * dim_u).map(|_| rng.f32() * 3.0).collect();
        let w: Vec<f32> = (0..dim_u).map(|_| rng.f32()).collect();
        let mut want = x.clone();
        frink_models::kernels::rms_norm(&mut want, &w, 1e-6);
        let xd = ctx.upload(&f32_bytes(&x)).unwrap();
        let wd = ctx.upload(&f32_bytes(&w)).unwrap();
        // SAFETY: xd holds rows x dim floats, wd dim floats.
        unsafe {
            m.function("rms_norm")
                .unwrap()
                .launch(
                    (rows as u32, 1, 1),
                    (256, 1, 1),
                    0,
                    &[
                        Arg::Ptr(xd.ptr()),
                        Arg::Ptr(wd.ptr()),
                        Arg::I32(dim),
                        Arg::F32(1e-6),
                    ],
                )
                .unwrap();
        }
        let got = xd.download_f32(x.len()).unwrap();
        assert!(
            got.iter()
                .zip(&want)
                .all(|(a, b)| a.to_bits() == b.to_bits()),
            "rms_norm {rows}x{dim}"
        );
    }
}
