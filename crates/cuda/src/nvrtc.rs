//! Kernels compiled at run time: CUDA C sources embedded in the binary (including no
//! headers, so no toolkit is needed), compiled by NVRTC to a CUBIN for the device's exact
//! architecture (a CUBIN, not PTX: PTX from an NVRTC newer than the driver does not load),
//! and cached on disk keyed by the source, the options, the NVRTC version and the
//! architecture, so a second start compiles nothing.

use std::ffi::{c_char, CString};
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use crate::error::{CudaError, Result};
use crate::ffi::{Handle, Nvrtc};

/// A compiled kernel image.
#[derive(Clone, Debug)]
pub struct Cubin {
    /// The image (what `cuModuleLoadData` takes).
    pub image: Vec<u8>,
    /// The compiler's log (ptxas' register and spill report, with
    /// [`REPORT_OPTIONS`]); empty when read from the cache.
    pub log: String,
    /// Whether it came from the cache.
    pub cached: bool,
}

/// Options every kernel is compiled with.
pub const OPTIONS: &[&str] = &["--std=c++17", "-default-device"];

/// Options that make ptxas report each kernel's registers and spills in the log.
pub const REPORT_OPTIONS: &[&str] = &["--ptxas-options=-v"];

/// `sm_XY` of compute capability `(X, Y)`.
pub fn arch_name(cc: (i32, i32)) -> String {
    format!("sm_{}{}", cc.0, cc.1)
}

/// The cache file of `name` compiled from `source` with `options` by NVRTC `version` for
/// `arch`, under `dir`.
fn cache_file(
    dir: &Path,
    name: &str,
    source: &str,
    options: &[String],
    version: (i32, i32),
    arch: &str,
) -> PathBuf {
    let mut h = Sha256::new();
    h.update(source.as_bytes());
    for o in options {
        h.update([0]);
        h.update(o.as_bytes());
    }
    h.update(format!("\0nvrtc {}.{}\0{arch}", version.0, version.1).as_bytes());
    let digest = h.finalize();
    let hex: String = digest[..8].iter().map(|b| format!("{b:02x}")).collect();
    dir.join(format!("{name}-{arch}-{hex}.cubin"))
}

/// Compiles `source` (named `name` in messages) for compute capability `cc` with
/// [`OPTIONS`] and `extra` options; with `cache`, reads the CUBIN from that folder when a
/// previous compile left it there, and writes it there otherwise (atomically).
///
/// Errors: [`CudaError::Compile`] with NVRTC's log; [`CudaError::Cache`] when the cache
/// cannot be written.
pub fn compile(
    nvrtc: &Nvrtc,
    name: &str,
    source: &str,
    cc: (i32, i32),
    extra: &[&str],
    cache: Option<&Path>,
) -> Result<Cubin> {
    let arch = arch_name(cc);
    let mut options: Vec<String> = OPTIONS.iter().map(|s| s.to_string()).collect();
    options.push(format!("--gpu-architecture={arch}"));
    options.extend(extra.iter().map(|s| s.to_string()));
    let file = cache.map(|d| cache_file(d, name, source, &options, nvrtc.version(), &arch));
    if let Some(f) = &file {
        if let Ok(image) = std::fs::read(f) {
            if !image.is_empty() {
                return Ok(Cubin {
                    image,
                    log: String::new(),
                    cached: true,
                });
            }
        }
    }
    let cubin = compile_now(nvrtc, name, source, &arch, &options)?;
    if let Some(f) = &file {
        let err = |e| CudaError::Cache {
            path: f.display().to_string(),
            source: e,
        };
        if let Some(d) = f.parent() {
            std::fs::create_dir_all(d).map_err(err)?;
        }
        let tmp = f.with_extension(format!("tmp{}", std::process::id()));
        std::fs::write(&tmp, &cubin.image).map_err(err)?;
        std::fs::rename(&tmp, f).map_err(err)?;
    }
    Ok(cubin)
}

/// One NVRTC compilation.
fn compile_now(
    nvrtc: &Nvrtc,
    name: &str,
    source: &str,
    arch: &str,
    options: &[String],
) -> Result<Cubin> {
    let fail = |message: String, log: String| CudaError::Compile {
        name: name.to_string(),
        arch: arch.to_string(),
        message,
        log,
    };
    let src =
        CString::new(source).map_err(|_| fail("a NUL byte in the source".into(), String::new()))?;
    let cname =
        CString::new(name).map_err(|_| fail("a NUL byte in the name".into(), String::new()))?;
    let opts: Vec<CString> = options
        .iter()
        .map(|o| CString::new(o.as_str()).expect("options hold no NUL"))
        .collect();
    let opt_ptrs: Vec<*const c_char> = opts.iter().map(|o| o.as_ptr()).collect();
    let mut prog: Handle = std::ptr::null_mut();
    // SAFETY: `src` and `cname` are NUL-terminated and outlive the call; no headers.
    let r = unsafe {
        (nvrtc.nvrtcCreateProgram)(
            &mut prog,
            src.as_ptr(),
            cname.as_ptr(),
            0,
            std::ptr::null(),
            std::ptr::null(),
        )
    };
    if r != 0 {
        return Err(fail(nvrtc.message(r), String::new()));
    }
    let result = (|| {
        // SAFETY: `prog` was created above; `opt_ptrs` points at `opts.len()` live
        // NUL-terminated strings.
        let r =
            unsafe { (nvrtc.nvrtcCompileProgram)(prog, opt_ptrs.len() as i32, opt_ptrs.as_ptr()) };
        let log = program_log(nvrtc, prog);
        if r != 0 {
            return Err(fail(nvrtc.message(r), log));
        }
        let mut size = 0usize;
        // SAFETY: `prog` compiled; writes one size_t.
        let r = unsafe { (nvrtc.nvrtcGetCUBINSize)(prog, &mut size) };
        if r != 0 || size == 0 {
            return Err(fail(format!("no CUBIN ({})", nvrtc.message(r)), log));
        }
        let mut image = vec![0u8; size];
        // SAFETY: `image` holds the `size` bytes NVRTC reported.
        let r = unsafe { (nvrtc.nvrtcGetCUBIN)(prog, image.as_mut_ptr().cast()) };
        if r != 0 {
            return Err(fail(nvrtc.message(r), log));
        }
        Ok(Cubin {
            image,
            log,
            cached: false,
        })
    })();
    // SAFETY: destroys the program created above, once.
    unsafe { (nvrtc.nvrtcDestroyProgram)(&mut prog) };
    result
}

/// The program's compile log.
fn program_log(nvrtc: &Nvrtc, prog: Handle) -> String {
    let mut size = 0usize;
    // SAFETY: `prog` is a live program; writes one size_t.
    if unsafe { (nvrtc.nvrtcGetProgramLogSize)(prog, &mut size) } != 0 || size <= 1 {
        return String::new();
    }
    let mut buf = vec![0u8; size];
    // SAFETY: `buf` holds the `size` bytes (NUL included) NVRTC reported.
    if unsafe { (nvrtc.nvrtcGetProgramLog)(prog, buf.as_mut_ptr().cast()) } != 0 {
        return String::new();
    }
    String::from_utf8_lossy(&buf[..size - 1]).into_owned()
}

/// A kernel's entry in ptxas' report (`--ptxas-options=-v`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KernelReport {
    /// The (mangled or `extern "C"`) function name.
    pub name: String,
    /// Registers per thread.
    pub registers: u32,
    /// Bytes of spill stores and loads.
    pub spill_stores: u32,
    pub spill_loads: u32,
}

/// Reads ptxas' per-function report out of a compile log: for each `Function properties
/// for NAME` block, its spills and registers.
pub fn kernel_reports(log: &str) -> Vec<KernelReport> {
    let mut out: Vec<KernelReport> = Vec::new();
    let number_before = |l: &str, what: &str| -> Option<u32> {
        let i = l.find(what)?;
        l[..i].split_whitespace().last()?.parse().ok()
    };
    for l in log.lines() {
        if let Some(i) = l.find("Function properties for ") {
            out.push(KernelReport {
                name: l[i + "Function properties for ".len()..].trim().to_string(),
                registers: 0,
                spill_stores: 0,
                spill_loads: 0,
            });
        } else if let Some(k) = out.last_mut() {
            if let Some(n) = number_before(l, "bytes spill stores") {
                k.spill_stores = n;
            }
            if let Some(n) = number_before(l, "bytes spill loads") {
                k.spill_loads = n;
            }
            if let Some(n) = number_before(l, "registers") {
                k.registers = n;
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ptxas_reports_are_read() {
        let log = "ptxas info    : 0 bytes gmem\n\
            ptxas info    : Compiling entry function 'mv_q8_0' for 'sm_90'\n\
            ptxas info    : Function properties for mv_q8_0\n\
            \x20   8 bytes stack frame, 4 bytes spill stores, 12 bytes spill loads\n\
            ptxas info    : Used 40 registers, 380 bytes cmem[0]\n\
            ptxas info    : Function properties for rms_norm\n\
            \x20   0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads\n\
            ptxas info    : Used 18 registers\n";
        let r = kernel_reports(log);
        assert_eq!(r.len(), 2);
        assert_eq!(
            r[0],
            KernelReport {
                name: "mv_q8_0".into(),
                registers: 40,
                spill_stores: 4,
                spill_loads: 12
            }
        );
        assert_eq!((r[1].registers, r[1].spill_stores), (18, 0));
    }

    #[test]
    fn the_cache_key_changes_with_every_input() {
        let d = Path::new("/c");
        let o = vec!["--gpu-architecture=sm_90".to_string()];
        let base = cache_file(d, "k", "src", &o, (12, 9), "sm_90");
        assert_ne!(base, cache_file(d, "k", "src2", &o, (12, 9), "sm_90"));
        assert_ne!(base, cache_file(d, "k", "src", &[], (12, 9), "sm_90"));
        assert_ne!(base, cache_file(d, "k", "src", &o, (13, 0), "sm_90"));
        assert_ne!(base, cache_file(d, "k", "src", &o, (12, 9), "sm_80"));
        assert_eq!(base, cache_file(d, "k", "src", &o, (12, 9), "sm_90"));
    }
}
