//! The GPUs, as the driver sees them, and a context on one: device memory, modules,
//! launches, streams and timing events.
//!
//! Every driver call goes through the function table of [`crate::ffi::Driver`], whose
//! functions were all resolved when the library was opened.

use std::ffi::{c_void, CString};
use std::sync::Arc;

use crate::error::{CudaError, Result};
use crate::ffi::{attr, CuDevice, CuDevicePtr, Driver, Handle, Nvrtc};

/// One GPU.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Gpu {
    /// The driver's ordinal.
    pub index: usize,
    /// Its name (`NVIDIA H200`).
    pub name: String,
    /// Memory, bytes.
    pub total_memory: usize,
    /// Compute capability `(major, minor)`.
    pub cc: (i32, i32),
    /// Multiprocessors.
    pub sms: i32,
}

/// What [`probe`] found: the libraries (each found, or why not) and the GPUs.
#[derive(Debug)]
pub struct Probe {
    /// The driver library's path and version (`13000` = 13.0), or why it is unusable.
    pub driver: std::result::Result<(String, i32), String>,
    /// NVRTC's path and version, or why it is unusable.
    pub nvrtc: std::result::Result<(String, (i32, i32)), String>,
    /// The GPUs the driver sees (empty when it is unusable).
    pub gpus: Vec<Gpu>,
}

impl Probe {
    /// The probe as JSON (what `frink devices --json` prints).
    pub fn json(&self) -> serde_json::Value {
        use serde_json::json;
        let lib = |r: std::result::Result<serde_json::Value, &String>| match r {
            Ok(v) => v,
            Err(e) => json!({"error": e}),
        };
        json!({
            "driver": lib(self.driver.as_ref().map(|(p, v)| json!({"path": p, "version": version_name(*v)}))),
            "nvrtc": lib(self.nvrtc.as_ref().map(|(p, v)| json!({"path": p, "version": format!("{}.{}", v.0, v.1)}))),
            "gpus": self.gpus.iter().map(|g| json!({
                "index": g.index,
                "name": g.name,
                "memory_bytes": g.total_memory,
                "compute_capability": format!("{}.{}", g.cc.0, g.cc.1),
                "multiprocessors": g.sms,
            })).collect::<Vec<_>>(),
        })
    }
}

/// `13000` → `13.0`.
pub fn version_name(v: i32) -> String {
    format!("{}.{}", v / 1000, (v % 1000) / 10)
}

/// Looks for the driver, NVRTC and the GPUs; never fails (what is missing is in the
/// result).
pub fn probe() -> Probe {
    let nvrtc = Nvrtc::open()
        .map(|n| {
            let v = n.version();
            (n.path.clone(), v)
        })
        .map_err(|e| e.to_string());
    let (driver, gpus) = match Driver::open().and_then(|d| {
        let d = Arc::new(d);
        let version = driver_version(&d)?;
        let gpus = list(&d)?;
        Ok(((d.path.clone(), version), gpus))
    }) {
        Ok((d, g)) => (Ok(d), g),
        Err(e) => (Err(e.to_string()), Vec::new()),
    };
    Probe {
        driver,
        nvrtc,
        gpus,
    }
}

/// `cuInit` then the driver's version.
fn driver_version(d: &Driver) -> Result<i32> {
    // SAFETY: `cuInit(0)` may be called any number of times.
    d.check("cuInit", unsafe { (d.cuInit)(0) })?;
    let mut v = 0;
    // SAFETY: writes one int.
    d.check("cuDriverGetVersion", unsafe {
        (d.cuDriverGetVersion)(&mut v)
    })?;
    Ok(v)
}

/// The GPUs the (initialised) driver sees.
fn list(d: &Driver) -> Result<Vec<Gpu>> {
    let mut n = 0;
    // SAFETY: writes one int.
    d.check("cuDeviceGetCount", unsafe { (d.cuDeviceGetCount)(&mut n) })?;
    (0..n.max(0) as usize).map(|i| gpu(d, i)).collect()
}

/// GPU `index`'s properties.
fn gpu(d: &Driver, index: usize) -> Result<Gpu> {
    let mut dev: CuDevice = 0;
    // SAFETY: writes one device handle for an ordinal below the count.
    d.check("cuDeviceGet", unsafe {
        (d.cuDeviceGet)(&mut dev, index as i32)
    })?;
    let mut name = [0u8; 256];
    // SAFETY: writes at most 256 bytes, NUL-terminated.
    d.check("cuDeviceGetName", unsafe {
        (d.cuDeviceGetName)(name.as_mut_ptr().cast(), name.len() as i32, dev)
    })?;
    let end = name.iter().position(|&b| b == 0).unwrap_or(name.len());
    let mut mem = 0usize;
    // SAFETY: writes one size_t.
    d.check("cuDeviceTotalMem", unsafe {
        (d.cuDeviceTotalMem_v2)(&mut mem, dev)
    })?;
    let get = |a: i32| -> Result<i32> {
        let mut v = 0;
        // SAFETY: writes one int for a valid attribute and device.
        d.check("cuDeviceGetAttribute", unsafe {
            (d.cuDeviceGetAttribute)(&mut v, a, dev)
        })?;
        Ok(v)
    };
    Ok(Gpu {
        index,
        name: String::from_utf8_lossy(&name[..end]).into_owned(),
        total_memory: mem,
        cc: (
            get(attr::COMPUTE_CAPABILITY_MAJOR)?,
            get(attr::COMPUTE_CAPABILITY_MINOR)?,
        ),
        sms: get(attr::MULTIPROCESSOR_COUNT)?,
    })
}

/// The oldest compute capability the kernels are written for (Ampere: `dp4a`, `bf16`,
/// asynchronous copies).
pub const MIN_CC: (i32, i32) = (8, 0);

/// A context on one GPU (the device's primary context), current on the thread that made
/// it and on any thread that calls [`Context::bind`].
pub struct Context {
    driver: Arc<Driver>,
    dev: CuDevice,
    ctx: Handle,
    /// The GPU.
    pub gpu: Gpu,
}

// SAFETY: a CUDA context may be used from any thread once made current there
// (`Context::bind`); the handle itself is an opaque pointer the driver synchronises.
unsafe impl Send for Context {}
// SAFETY: as above; every method takes `&self` and calls thread-safe driver functions.
unsafe impl Sync for Context {}

impl Context {
    /// Opens the driver and makes a context on GPU `index` current on this thread.
    ///
    /// Errors: the driver missing or failing, no GPU, no GPU `index`, a GPU older than
    /// [`MIN_CC`].
    pub fn new(index: usize) -> Result<Context> {
        let driver = Arc::new(Driver::open()?);
        driver_version(&driver)?;
        let gpus = list(&driver)?;
        if gpus.is_empty() {
            return Err(CudaError::NoDevice {
                driver: driver.path.clone(),
            });
        }
        let gpu = gpus.get(index).cloned().ok_or(CudaError::NoSuchDevice {
            index,
            count: gpus.len(),
        })?;
        if gpu.cc < MIN_CC {
            return Err(CudaError::Unsupported {
                index,
                name: gpu.name,
                major: gpu.cc.0,
                minor: gpu.cc.1,
            });
        }
        let mut dev: CuDevice = 0;
        // SAFETY: ordinal below the count.
        driver.check("cuDeviceGet", unsafe {
            (driver.cuDeviceGet)(&mut dev, index as i32)
        })?;
        let mut ctx: Handle = std::ptr::null_mut();
        // SAFETY: retains the device's primary context (released in `drop`).
        driver.check("cuDevicePrimaryCtxRetain", unsafe {
            (driver.cuDevicePrimaryCtxRetain)(&mut ctx, dev)
        })?;
        let c = Context {
            driver,
            dev,
            ctx,
            gpu,
        };
        c.bind()?;
        Ok(c)
    }

    /// Makes the context current on the calling thread.
    ///
    /// Errors: the driver's.
    pub fn bind(&self) -> Result<()> {
        // SAFETY: `ctx` is the retained primary context.
        self.driver.check("cuCtxSetCurrent", unsafe {
            (self.driver.cuCtxSetCurrent)(self.ctx)
        })
    }

    /// The driver's function table.
    pub fn driver(&self) -> &Driver {
        &self.driver
    }

    /// `(free, total)` device memory, bytes.
    ///
    /// Errors: the driver's.
    pub fn memory(&self) -> Result<(usize, usize)> {
        let (mut free, mut total) = (0usize, 0usize);
        // SAFETY: writes two size_t; the context is current (bound at creation; callers
        // on other threads bind first).
        self.driver.check("cuMemGetInfo", unsafe {
            (self.driver.cuMemGetInfo_v2)(&mut free, &mut total)
        })?;
        Ok((free, total))
    }

    /// `bytes` of device memory (uninitialised).
    ///
    /// Errors: out of memory (the driver's error).
    pub fn alloc(&self, bytes: usize) -> Result<DeviceBuffer> {
        let mut ptr: CuDevicePtr = 0;
        // SAFETY: writes one device pointer; `bytes.max(1)`: a zero-size allocation is an
        // error in the driver.
        self.driver.check("cuMemAlloc", unsafe {
            (self.driver.cuMemAlloc_v2)(&mut ptr, bytes.max(1))
        })?;
        Ok(DeviceBuffer {
            driver: Arc::clone(&self.driver),
            ptr,
            bytes,
        })
    }

    /// A device copy of `data`.
    ///
    /// Errors: as [`Context::alloc`] and [`DeviceBuffer::upload`].
    pub fn upload(&self, data: &[u8]) -> Result<DeviceBuffer> {
        let mut b = self.alloc(data.len())?;
        b.upload(data)?;
        Ok(b)
    }

    /// Loads a compiled image ([`crate::nvrtc::compile`]).
    ///
    /// Errors: an image the driver refuses (another architecture, a newer format).
    pub fn load(&self, image: &[u8]) -> Result<Module> {
        let mut m: Handle = std::ptr::null_mut();
        // SAFETY: `image` is a CUBIN produced by NVRTC (the driver validates it).
        self.driver.check("cuModuleLoadData", unsafe {
            (self.driver.cuModuleLoadData)(&mut m, image.as_ptr().cast())
        })?;
        Ok(Module {
            driver: Arc::clone(&self.driver),
            module: m,
        })
    }

    /// Waits for everything launched on the context.
    ///
    /// Errors: a kernel's fault, reported here.
    pub fn sync(&self) -> Result<()> {
        // SAFETY: the context is current.
        self.driver.check("cuCtxSynchronize", unsafe {
            (self.driver.cuCtxSynchronize)()
        })
    }
}

impl Drop for Context {
    fn drop(&mut self) {
        // SAFETY: releases the reference retained in `new`, once.
        unsafe { (self.driver.cuDevicePrimaryCtxRelease_v2)(self.dev) };
    }
}

/// Device memory, freed on drop.
pub struct DeviceBuffer {
    driver: Arc<Driver>,
    ptr: CuDevicePtr,
    bytes: usize,
}

// SAFETY: a device pointer is an address in the context's memory, usable from any thread
// on which the context is current.
unsafe impl Send for DeviceBuffer {}
// SAFETY: as above; `&self` methods only read the address.
unsafe impl Sync for DeviceBuffer {}

impl DeviceBuffer {
    /// The device address.
    pub fn ptr(&self) -> CuDevicePtr {
        self.ptr
    }

    /// Its size, bytes.
    pub fn len(&self) -> usize {
        self.bytes
    }

    /// Whether it holds no byte.
    pub fn is_empty(&self) -> bool {
        self.bytes == 0
    }

    /// Copies `data` (at most the buffer's size) to its start.
    ///
    /// Errors: a longer `data` ([`CudaError::Driver`] with an invalid-value code), the
    /// driver's.
    pub fn upload(&mut self, data: &[u8]) -> Result<()> {
        if data.len() > self.bytes {
            return Err(CudaError::Driver {
                call: "cuMemcpyHtoD",
                code: 1,
                message: format!("{} bytes into a buffer of {}", data.len(), self.bytes),
            });
        }
        // SAFETY: `data.len()` bytes readable at `data`, writable at `ptr` (checked).
        self.driver.check("cuMemcpyHtoD", unsafe {
            (self.driver.cuMemcpyHtoD_v2)(self.ptr, data.as_ptr().cast(), data.len())
        })
    }

    /// Copies the buffer's first `out.len()` bytes into `out`.
    ///
    /// Errors: a longer `out`, the driver's.
    pub fn download(&self, out: &mut [u8]) -> Result<()> {
        if out.len() > self.bytes {
            return Err(CudaError::Driver {
                call: "cuMemcpyDtoH",
                code: 1,
                message: format!("{} bytes out of a buffer of {}", out.len(), self.bytes),
            });
        }
        // SAFETY: `out.len()` bytes writable at `out`, readable at `ptr` (checked).
        self.driver.check("cuMemcpyDtoH", unsafe {
            (self.driver.cuMemcpyDtoH_v2)(out.as_mut_ptr().cast(), self.ptr, out.len())
        })
    }

    /// The buffer as `f32`s.
    ///
    /// Errors: as [`DeviceBuffer::download`].
    pub fn download_f32(&self, n: usize) -> Result<Vec<f32>> {
        let mut b = vec![0u8; n * 4];
        self.download(&mut b)?;
        Ok(b.chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect())
    }
}

impl Drop for DeviceBuffer {
    fn drop(&mut self) {
        // SAFETY: frees the allocation made in `Context::alloc`, once.
        unsafe { (self.driver.cuMemFree_v2)(self.ptr) };
    }
}

/// A loaded module, unloaded on drop.
pub struct Module {
    driver: Arc<Driver>,
    module: Handle,
}

// SAFETY: module and function handles are usable from any thread with the context current.
unsafe impl Send for Module {}
// SAFETY: as above.
unsafe impl Sync for Module {}

impl Module {
    /// The kernel `name` (an `extern "C"` function of the source).
    ///
    /// Errors: no such kernel.
    pub fn function(&self, name: &str) -> Result<Function<'_>> {
        let c = CString::new(name).map_err(|_| CudaError::Driver {
            call: "cuModuleGetFunction",
            code: 1,
            message: "a NUL byte in a kernel name".into(),
        })?;
        let mut f: Handle = std::ptr::null_mut();
        // SAFETY: `c` is NUL-terminated; the module is loaded.
        self.driver.check("cuModuleGetFunction", unsafe {
            (self.driver.cuModuleGetFunction)(&mut f, self.module, c.as_ptr())
        })?;
        Ok(Function {
            driver: &self.driver,
            f,
        })
    }
}

impl Drop for Module {
    fn drop(&mut self) {
        // SAFETY: unloads the module loaded in `Context::load`, once.
        unsafe { (self.driver.cuModuleUnload)(self.module) };
    }
}

/// A kernel of a [`Module`].
pub struct Function<'m> {
    driver: &'m Driver,
    f: Handle,
}

/// A kernel argument: its bytes as the kernel's parameter holds them.
pub enum Arg {
    /// A device pointer.
    Ptr(CuDevicePtr),
    /// A 32-bit integer.
    I32(i32),
    /// A 64-bit integer.
    U64(u64),
    /// A 32-bit float.
    F32(f32),
}

impl Function<'_> {
    /// Launches the kernel on the null stream: `grid` blocks of `block` threads, `shared`
    /// bytes of dynamic shared memory, with `args` in the order of its parameters.
    ///
    /// # Safety
    /// `args` must match the kernel's parameters in number, order and type, and every
    /// pointer must address device memory the kernel may read or write for the extents it
    /// uses (each kernel's documentation states them).
    ///
    /// Errors: a launch the driver refuses (too many threads, too much shared memory).
    pub unsafe fn launch(
        &self,
        grid: (u32, u32, u32),
        block: (u32, u32, u32),
        shared: u32,
        args: &[Arg],
    ) -> Result<()> {
        let mut vals: Vec<[u8; 8]> = args
            .iter()
            .map(|a| {
                let mut v = [0u8; 8];
                match a {
                    Arg::Ptr(p) => v.copy_from_slice(&p.to_le_bytes()),
                    Arg::I32(i) => v[..4].copy_from_slice(&i.to_le_bytes()),
                    Arg::U64(i) => v.copy_from_slice(&i.to_le_bytes()),
                    Arg::F32(x) => v[..4].copy_from_slice(&x.to_le_bytes()),
                }
                v
            })
            .collect();
        let mut ptrs: Vec<*mut c_void> = vals.iter_mut().map(|v| v.as_mut_ptr().cast()).collect();
        if shared > 48 * 1024 {
            // (CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES = 8.)
            // SAFETY: sets one attribute of a live function.
            self.driver.check("cuFuncSetAttribute", unsafe {
                (self.driver.cuFuncSetAttribute)(self.f, 8, shared as i32)
            })?;
        }
        // SAFETY: the caller's contract on `args`; `ptrs` points at one live 8-byte value
        // per parameter (the driver reads each parameter's size from the kernel).
        self.driver.check("cuLaunchKernel", unsafe {
            (self.driver.cuLaunchKernel)(
                self.f,
                grid.0,
                grid.1,
                grid.2,
                block.0,
                block.1,
                block.2,
                shared,
                std::ptr::null_mut(),
                ptrs.as_mut_ptr(),
                std::ptr::null_mut(),
            )
        })
    }
}
