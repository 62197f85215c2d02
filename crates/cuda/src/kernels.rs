//! The CUDA C sources of the backend, embedded in the binary, and the kernels each holds.
//! Every source is the shared prelude (`kernels/prelude.cu`: types, f16 conversion, byte
//! reads, the CPU's lane tree) followed by its own text, and is compiled with [`OPTIONS`].

/// NVRTC options every source needs: no multiply-add contraction (a contracted `a * b + c`
/// rounds once where the CPU rounds twice: the kernels are bit-identical to the CPU's
/// only without it).
pub const OPTIONS: &[&str] = &["--fmad=false"];

/// One embedded source.
#[derive(Clone, Copy, Debug)]
pub struct Source {
    /// Its name (the cache file's and the messages').
    pub name: &'static str,
    /// The CUDA C text, prelude included.
    pub text: &'static str,
    /// The `extern "C"` kernels it defines.
    pub kernels: &'static [&'static str],
}

/// The quantized products of the decode path, the activation quantizers, RMSNorm and the
/// bandwidth probe (`kernels/matvec.cu`).
pub const MATVEC: Source = Source {
    name: "matvec",
    text: concat!(
        include_str!("kernels/prelude.cu"),
        include_str!("kernels/matvec.cu")
    ),
    kernels: &[
        "mv_q4_0",
        "mv_q4_1",
        "mv_q5_0",
        "mv_q5_1",
        "mv_q8_0",
        "mv_q4_k",
        "mv_q5_k",
        "mv_q6_k",
        "quantize_q8_0",
        "quantize_q8_k",
        "rms_norm",
        "read_bandwidth",
    ],
};

/// Every source.
pub const ALL: &[Source] = &[MATVEC];

/// The architectures the kernels are compiled and checked for (Ampere A100, Ampere
/// consumer, Ada, Hopper).
pub const ARCHS: &[(i32, i32)] = &[(8, 0), (8, 6), (8, 9), (9, 0)];
