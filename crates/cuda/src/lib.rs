//! frink's CUDA backend (being built: see docs/gpu.md for what runs on the
//! GPU today).
//!
//! Nothing CUDA is linked at build time: the driver (`libcuda`) and NVRTC are found at run
//! time ([`find`]), opened with every function the backend calls checked first ([`ffi`]),
//! and kernels are CUDA C sources embedded in the binary ([`kernels`]), compiled by NVRTC
//! for the GPU's exact architecture and cached on disk ([`nvrtc`]). A machine without a
//! GPU, a driver or NVRTC gets an error naming what is missing and where it looked, never
//! a panic. [`device`] lists the GPUs and holds a context on one.

pub mod device;
pub mod error;
pub mod ffi;
pub mod find;
pub mod kernels;
pub mod nvrtc;

pub use device::{probe, Context, DeviceBuffer, Gpu, Probe};
pub use error::{CudaError, Result};
