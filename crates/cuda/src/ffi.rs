//! The driver API and NVRTC, opened at run time from the paths [`crate::find`] gives, with
//! every function this crate calls resolved when the library is opened: a library that
//! lacks one is refused then, by name, never a panic in the middle of a call.
//!
//! The declarations are the C signatures of NVIDIA's `cuda.h` and `nvrtc.h` (facts of the
//! ABI: the `_v2` entry points are the ones the current headers map the plain names to).

use std::ffi::{c_char, c_int, c_uint, c_void, CStr};

use crate::error::{CudaError, Result};
use crate::find::{self, Candidate, Lib};

/// `CUresult` (0: success).
pub type CuResult = c_int;
/// `CUdevice`: an ordinal.
pub type CuDevice = c_int;
/// `CUdeviceptr`: a device address.
pub type CuDevicePtr = u64;
/// The opaque handles (`CUcontext`, `CUmodule`, …).
pub type Handle = *mut c_void;
/// `nvrtcResult` (0: success).
pub type NvrtcResult = c_int;

/// `CU_DEVICE_ATTRIBUTE_*` values read.
pub mod attr {
    /// Multiprocessors.
    pub const MULTIPROCESSOR_COUNT: i32 = 16;
    /// Compute capability, major.
    pub const COMPUTE_CAPABILITY_MAJOR: i32 = 75;
    /// Compute capability, minor.
    pub const COMPUTE_CAPABILITY_MINOR: i32 = 76;
    /// Largest opt-in shared memory per block, bytes.
    pub const MAX_SHARED_MEMORY_PER_BLOCK_OPTIN: i32 = 97;
}

/// Declares a table of C functions resolved from one library when it is opened.
macro_rules! table {
    ($(#[$doc:meta])* $name:ident { $( $f:ident : fn($($arg:ty),*) -> $ret:ty ),* $(,)? }) => {
        $(#[$doc])*
        #[allow(non_snake_case)]
        pub struct $name {
            /// Where it was opened from.
            pub path: String,
            // Kept open for as long as the function pointers are used.
            _lib: libloading::Library,
            $( pub $f: unsafe extern "C" fn($($arg),*) -> $ret, )*
        }

        impl $name {
            /// Every symbol of the table, in order.
            pub const SYMBOLS: &'static [&'static str] = &[$(stringify!($f)),*];

            /// Resolves every function of the table in `lib` (opened from `path`).
            ///
            /// Errors: [`CudaError::Symbols`] naming each missing function.
            fn resolve(lib: libloading::Library, path: String, which: Lib) -> Result<$name> {
                let missing: Vec<&'static str> = Self::SYMBOLS
                    .iter()
                    .copied()
                    // SAFETY: only looks a name up; the address is not used here.
                    .filter(|s| unsafe { lib.get::<*const c_void>(s.as_bytes()) }.is_err())
                    .collect();
                if !missing.is_empty() {
                    return Err(CudaError::Symbols { lib: which.name(), path, missing });
                }
                // SAFETY: each symbol exists (checked above) and has the C signature of
                // NVIDIA's header declared for it in this table; the library stays open
                // in `_lib` for as long as the pointers live in the same struct.
                unsafe {
                    Ok($name {
                        $( $f: *lib.get::<unsafe extern "C" fn($($arg),*) -> $ret>(
                            stringify!($f).as_bytes())
                            .map_err(|_| CudaError::Symbols {
                                lib: which.name(),
                                path: path.clone(),
                                missing: vec![stringify!($f)],
                            })?, )*
                        path,
                        _lib: lib,
                    })
                }
            }
        }
    };
}

table! {
    /// The driver API functions the backend calls.
    Driver {
        cuInit: fn(c_uint) -> CuResult,
        cuDriverGetVersion: fn(*mut c_int) -> CuResult,
        cuDeviceGetCount: fn(*mut c_int) -> CuResult,
        cuDeviceGet: fn(*mut CuDevice, c_int) -> CuResult,
        cuDeviceGetName: fn(*mut c_char, c_int, CuDevice) -> CuResult,
        cuDeviceTotalMem_v2: fn(*mut usize, CuDevice) -> CuResult,
        cuDeviceGetAttribute: fn(*mut c_int, c_int, CuDevice) -> CuResult,
        cuDevicePrimaryCtxRetain: fn(*mut Handle, CuDevice) -> CuResult,
        cuDevicePrimaryCtxRelease_v2: fn(CuDevice) -> CuResult,
        cuCtxSetCurrent: fn(Handle) -> CuResult,
        cuCtxSynchronize: fn() -> CuResult,
        cuMemGetInfo_v2: fn(*mut usize, *mut usize) -> CuResult,
        cuMemAlloc_v2: fn(*mut CuDevicePtr, usize) -> CuResult,
        cuMemFree_v2: fn(CuDevicePtr) -> CuResult,
        cuMemcpyHtoD_v2: fn(CuDevicePtr, *const c_void, usize) -> CuResult,
        cuMemcpyDtoH_v2: fn(*mut c_void, CuDevicePtr, usize) -> CuResult,
        cuMemcpyHtoDAsync_v2: fn(CuDevicePtr, *const c_void, usize, Handle) -> CuResult,
        cuMemcpyDtoHAsync_v2: fn(*mut c_void, CuDevicePtr, usize, Handle) -> CuResult,
        cuMemsetD8_v2: fn(CuDevicePtr, u8, usize) -> CuResult,
        cuModuleLoadData: fn(*mut Handle, *const c_void) -> CuResult,
        cuModuleUnload: fn(Handle) -> CuResult,
        cuModuleGetFunction: fn(*mut Handle, Handle, *const c_char) -> CuResult,
        cuFuncSetAttribute: fn(Handle, c_int, c_int) -> CuResult,
        cuLaunchKernel: fn(
            Handle, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint, Handle,
            *mut *mut c_void, *mut *mut c_void
        ) -> CuResult,
        cuStreamCreate: fn(*mut Handle, c_uint) -> CuResult,
        cuStreamDestroy_v2: fn(Handle) -> CuResult,
        cuStreamSynchronize: fn(Handle) -> CuResult,
        cuStreamBeginCapture_v2: fn(Handle, c_int) -> CuResult,
        cuStreamEndCapture: fn(Handle, *mut Handle) -> CuResult,
        cuGraphInstantiateWithFlags: fn(*mut Handle, Handle, u64) -> CuResult,
        cuGraphLaunch: fn(Handle, Handle) -> CuResult,
        cuGraphExecDestroy: fn(Handle) -> CuResult,
        cuGraphDestroy: fn(Handle) -> CuResult,
        cuEventCreate: fn(*mut Handle, c_uint) -> CuResult,
        cuEventRecord: fn(Handle, Handle) -> CuResult,
        cuEventSynchronize: fn(Handle) -> CuResult,
        cuEventElapsedTime: fn(*mut f32, Handle, Handle) -> CuResult,
        cuEventDestroy_v2: fn(Handle) -> CuResult,
        cuGetErrorString: fn(CuResult, *mut *const c_char) -> CuResult,
    }
}

table! {
    /// The NVRTC functions the backend calls.
    Nvrtc {
        nvrtcVersion: fn(*mut c_int, *mut c_int) -> NvrtcResult,
        nvrtcCreateProgram: fn(
            *mut Handle, *const c_char, *const c_char, c_int, *const *const c_char,
            *const *const c_char
        ) -> NvrtcResult,
        nvrtcCompileProgram: fn(Handle, c_int, *const *const c_char) -> NvrtcResult,
        nvrtcGetProgramLogSize: fn(Handle, *mut usize) -> NvrtcResult,
        nvrtcGetProgramLog: fn(Handle, *mut c_char) -> NvrtcResult,
        nvrtcGetCUBINSize: fn(Handle, *mut usize) -> NvrtcResult,
        nvrtcGetCUBIN: fn(Handle, *mut c_char) -> NvrtcResult,
        nvrtcDestroyProgram: fn(*mut Handle) -> NvrtcResult,
        nvrtcGetErrorString: fn(NvrtcResult) -> *const c_char,
    }
}

/// Opens the first candidate of `lib` that loads, and resolves `resolve`'s table in it.
///
/// Errors: [`CudaError::Missing`] (nothing loaded: where it looked and what installs it),
/// or the first loaded library's [`CudaError::Symbols`].
fn open<T>(lib: Lib, resolve: impl Fn(libloading::Library, String, Lib) -> Result<T>) -> Result<T> {
    let mut cands = find::candidates(lib, false);
    let mut tried_python = false;
    loop {
        for c in &cands {
            let (name, shown): (std::ffi::OsString, String) = match c {
                Candidate::Path(p) if !p.exists() => continue,
                Candidate::Path(p) => (p.clone().into_os_string(), p.display().to_string()),
                Candidate::Soname(s) => ((*s).into(), (*s).to_string()),
            };
            if lib == Lib::Nvrtc {
                if let Candidate::Path(p) = c {
                    preload_builtins(p);
                }
            }
            // SAFETY: loading a shared library runs its initialisers; the NVIDIA
            // libraries found here have no initialisers with preconditions on the caller.
            if let Ok(l) = unsafe { libloading::Library::new(&name) } {
                return resolve(l, shown, lib);
            }
        }
        if tried_python || lib == Lib::Driver {
            return Err(CudaError::Missing {
                lib: lib.name(),
                looked: find::searched(lib, tried_python),
                how: lib.how_to_get(),
            });
        }
        // Last: the site-packages `python3` itself reports.
        tried_python = true;
        cands = find::candidates(lib, true);
    }
}

/// Loads every `libnvrtc-builtins.so*` beside `nvrtc` and keeps it loaded for the
/// process: NVRTC opens its builtins library by name when it compiles, and a folder
/// outside the loader's path (a pip wheel's) would not be searched; once loaded, the name
/// resolves to it.
fn preload_builtins(nvrtc: &std::path::Path) {
    let Some(dir) = nvrtc.parent() else {
        return;
    };
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        if e.file_name()
            .to_string_lossy()
            .starts_with("libnvrtc-builtins.so")
        {
            // SAFETY: as for the libraries of `open`; kept loaded on purpose (forgotten,
            // never unloaded) for every later compilation.
            if let Ok(l) = unsafe { libloading::Library::new(e.path()) } {
                std::mem::forget(l);
            }
        }
    }
}

impl Driver {
    /// Opens the driver ([`crate::find`]'s search).
    ///
    /// Errors: as [`open`].
    pub fn open() -> Result<Driver> {
        open(Lib::Driver, Driver::resolve)
    }

    /// The driver's message for `code`.
    pub fn message(&self, code: CuResult) -> String {
        let mut p: *const c_char = std::ptr::null();
        // SAFETY: `cuGetErrorString` writes a pointer to a static string (or leaves it
        // null for an unknown code) into `p`.
        let r = unsafe { (self.cuGetErrorString)(code, &mut p) };
        if r != 0 || p.is_null() {
            return format!("CUDA error {code}");
        }
        // SAFETY: non-null: a NUL-terminated static string of the driver.
        unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
    }

    /// `Ok` for `CUDA_SUCCESS`, else [`CudaError::Driver`] naming the call.
    pub fn check(&self, call: &'static str, r: CuResult) -> Result<()> {
        if r == 0 {
            Ok(())
        } else {
            Err(CudaError::Driver {
                call,
                code: r,
                message: self.message(r),
            })
        }
    }
}

impl Nvrtc {
    /// Opens NVRTC ([`crate::find`]'s search).
    ///
    /// Errors: as [`open`].
    pub fn open() -> Result<Nvrtc> {
        open(Lib::Nvrtc, Nvrtc::resolve)
    }

    /// Opens NVRTC from exactly `path` (tests: the wheel installed under `target/`).
    ///
    /// Errors: [`CudaError::Missing`] when it does not load, [`CudaError::Symbols`].
    pub fn open_path(path: &std::path::Path) -> Result<Nvrtc> {
        preload_builtins(path);
        // SAFETY: as in `open`.
        let l = unsafe { libloading::Library::new(path) }.map_err(|e| CudaError::Missing {
            lib: Lib::Nvrtc.name(),
            looked: format!("{} ({e})", path.display()),
            how: Lib::Nvrtc.how_to_get(),
        })?;
        Nvrtc::resolve(l, path.display().to_string(), Lib::Nvrtc)
    }

    /// `(major, minor)`.
    pub fn version(&self) -> (i32, i32) {
        let (mut a, mut b) = (0, 0);
        // SAFETY: writes two ints.
        unsafe { (self.nvrtcVersion)(&mut a, &mut b) };
        (a, b)
    }

    /// NVRTC's message for `code`.
    pub fn message(&self, code: NvrtcResult) -> String {
        // SAFETY: returns a static NUL-terminated string (or null).
        let p = unsafe { (self.nvrtcGetErrorString)(code) };
        if p.is_null() {
            return format!("NVRTC error {code}");
        }
        // SAFETY: non-null static string.
        unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
    }
}
