//! The backend's errors: each names what is missing or what failed, and where it looked.

/// A result of the backend.
pub type Result<T> = std::result::Result<T, CudaError>;

/// What went wrong with the GPU or its libraries.
#[derive(Debug, thiserror::Error)]
pub enum CudaError {
    /// A library was not found anywhere it was looked for.
    #[error("{lib} was not found (looked in: {looked}); {how}")]
    Missing {
        /// Which library.
        lib: &'static str,
        /// The places tried.
        looked: String,
        /// What installs it.
        how: &'static str,
    },
    /// A library was found but lacks functions the backend calls (too old a version).
    #[error("{lib} at {path} lacks {} (too old? frink needs CUDA 12 or newer)", missing.join(", "))]
    Symbols {
        /// Which library.
        lib: &'static str,
        /// Where it was opened from.
        path: String,
        /// The functions it lacks.
        missing: Vec<&'static str>,
    },
    /// A driver call failed.
    #[error("{call} failed: {message} (CUDA error {code})")]
    Driver {
        /// The driver function.
        call: &'static str,
        /// `CUresult`.
        code: i32,
        /// The driver's message.
        message: String,
    },
    /// The driver runs but sees no GPU.
    #[error("the NVIDIA driver ({driver}) sees no GPU")]
    NoDevice {
        /// Where the driver was opened from.
        driver: String,
    },
    /// A GPU index past the ones the driver sees.
    #[error("there is no GPU {index}: the driver sees {count}")]
    NoSuchDevice {
        /// The index asked for.
        index: usize,
        /// GPUs seen.
        count: usize,
    },
    /// A GPU older than the kernels support.
    #[error("GPU {index} ({name}) has compute capability {major}.{minor}; frink's CUDA kernels need 8.0 (Ampere) or newer")]
    Unsupported {
        /// Its index.
        index: usize,
        /// Its name.
        name: String,
        /// Compute capability.
        major: i32,
        /// Compute capability.
        minor: i32,
    },
    /// NVRTC failed.
    #[error("NVRTC could not compile {name} for {arch}: {message}{}", if log.is_empty() { String::new() } else { format!("\n{log}") })]
    Compile {
        /// The kernel source's name.
        name: String,
        /// `sm_XY`.
        arch: String,
        /// NVRTC's message.
        message: String,
        /// The compiler's log.
        log: String,
    },
    /// The kernel cache could not be read or written.
    #[error("the kernel cache {path}: {source}")]
    Cache {
        /// The file.
        path: String,
        /// The I/O error.
        source: std::io::Error,
    },
}
