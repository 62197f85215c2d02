//! Where the CUDA libraries are looked for, in order, and what was found.
//!
//! Users install the driver alone (`libcuda`, in the loader's path) and get NVRTC and
//! cuBLAS from a CUDA toolkit or from pip wheels (`nvidia-cuda-nvrtc`, `nvidia-cublas`),
//! often outside the loader's path. Each library is looked for in:
//!
//! 1. `$FRINK_CUDA_LIB_DIR` (a folder; `:`-separated folders);
//! 2. the dynamic loader's own search (`LD_LIBRARY_PATH`, `ldconfig`'s cache), by soname;
//! 3. `$CUDA_HOME` and `$CUDA_PATH`: `lib64`, `lib`, `targets/x86_64-linux/lib`;
//! 4. `/usr/local/cuda*` (the same subfolders), `/usr/local/nvidia/lib64`,
//!    `/usr/lib/x86_64-linux-gnu`, `/usr/lib/wsl/lib`;
//! 5. pip's `nvidia-*` wheels (`site-packages/nvidia/*/lib`) in the active Python
//!    environment (`$VIRTUAL_ENV`, `$CONDA_PREFIX`, the user's site-packages, and the
//!    site-packages `python3` reports).
//!
//! Every place tried is recorded, so an error can say where it looked.

use std::path::{Path, PathBuf};

/// A library of the backend.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Lib {
    /// The driver API (`libcuda.so.1`): comes with the NVIDIA driver.
    Driver,
    /// The run-time compiler (`libnvrtc.so.*`).
    Nvrtc,
    /// cuBLAS (`libcublas.so.*`), for prefill products.
    Cublas,
}

impl Lib {
    /// The file names tried, newest first.
    pub fn sonames(self) -> &'static [&'static str] {
        match self {
            Lib::Driver => &["libcuda.so.1", "libcuda.so"],
            Lib::Nvrtc => &[
                "libnvrtc.so.13",
                "libnvrtc.so.12",
                "libnvrtc.so.11.2",
                "libnvrtc.so",
            ],
            Lib::Cublas => &[
                "libcublas.so.13",
                "libcublas.so.12",
                "libcublas.so.11",
                "libcublas.so",
            ],
        }
    }

    /// Its name in messages.
    pub fn name(self) -> &'static str {
        match self {
            Lib::Driver => "the NVIDIA driver (libcuda)",
            Lib::Nvrtc => "NVRTC (libnvrtc)",
            Lib::Cublas => "cuBLAS (libcublas)",
        }
    }

    /// What installs it.
    pub fn how_to_get(self) -> &'static str {
        match self {
            Lib::Driver => "install the NVIDIA driver",
            Lib::Nvrtc => {
                "install the CUDA toolkit, or `pip install nvidia-cuda-nvrtc` (or \
                 nvidia-cuda-nvrtc-cu12), or point FRINK_CUDA_LIB_DIR at the folder holding it"
            }
            Lib::Cublas => {
                "install the CUDA toolkit, or `pip install nvidia-cublas` (or \
                 nvidia-cublas-cu12), or point FRINK_CUDA_LIB_DIR at the folder holding it"
            }
        }
    }
}

/// One candidate: a full path, or a bare soname for the loader's own search.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Candidate {
    /// A file in a folder.
    Path(PathBuf),
    /// A name the dynamic loader resolves.
    Soname(&'static str),
}

impl std::fmt::Display for Candidate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Candidate::Path(p) => write!(f, "{}", p.display()),
            Candidate::Soname(s) => write!(f, "{s} (loader path)"),
        }
    }
}

/// The folders of `$VAR` (`:`-separated), if set.
fn env_dirs(var: &str) -> Vec<PathBuf> {
    std::env::var_os(var)
        .map(|v| std::env::split_paths(&v).collect())
        .unwrap_or_default()
}

/// `lib64`, `lib` and `targets/x86_64-linux/lib` of a toolkit root.
fn toolkit_dirs(root: &Path) -> [PathBuf; 3] {
    [
        root.join("lib64"),
        root.join("lib"),
        root.join("targets/x86_64-linux/lib"),
    ]
}

/// `/usr/local/cuda*` folders, newest name last (as `read_dir` lists them, sorted).
fn usr_local_cudas() -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir("/usr/local")
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("cuda"))
        })
        .collect();
    v.sort();
    v.reverse();
    v
}

/// The `site-packages` folders of the active Python environment: `$VIRTUAL_ENV`,
/// `$CONDA_PREFIX`, the user's, and (`ask_python`) those `python3` reports.
fn site_packages(ask_python: bool) -> Vec<PathBuf> {
    let mut roots: Vec<PathBuf> = ["VIRTUAL_ENV", "CONDA_PREFIX"]
        .iter()
        .filter_map(std::env::var_os)
        .map(PathBuf::from)
        .collect();
    if let Some(home) = std::env::var_os("HOME") {
        roots.push(PathBuf::from(home).join(".local"));
    }
    let mut out = Vec::new();
    for r in roots {
        for lib in ["lib", "lib64"] {
            for e in std::fs::read_dir(r.join(lib))
                .into_iter()
                .flatten()
                .flatten()
            {
                let name = e.file_name();
                if name.to_string_lossy().starts_with("python3") {
                    out.push(e.path().join("site-packages"));
                }
            }
        }
    }
    if ask_python {
        out.extend(python_site_packages());
    }
    out.dedup();
    out
}

/// The `site-packages` folders `python3` reports (nothing if it is not there).
fn python_site_packages() -> Vec<PathBuf> {
    let script =
        "import site,sys\nfor p in site.getsitepackages()+[site.getusersitepackages()]: print(p)";
    std::process::Command::new("python3")
        .args(["-c", script])
        .stdin(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| {
            String::from_utf8_lossy(&o.stdout)
                .lines()
                .map(PathBuf::from)
                .collect()
        })
        .unwrap_or_default()
}

/// `site-packages/nvidia/*/lib` folders (pip's CUDA wheels: `cuda_nvrtc`, `cublas`,
/// `cu13`, `cu12`, …).
fn wheel_dirs(site: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(site.join("nvidia"))
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path().join("lib"))
        .filter(|p| p.is_dir())
        .collect();
    v.sort();
    v
}

/// Every candidate for `lib`, in search order (see the module documentation). Folders
/// that do not exist are left out, but `$FRINK_CUDA_LIB_DIR`'s are kept (a mistyped
/// folder shows in the error). `ask_python`: also run `python3` for its site-packages.
pub fn candidates(lib: Lib, ask_python: bool) -> Vec<Candidate> {
    let names = lib.sonames();
    let mut out = Vec::new();
    let in_dir = |dir: &Path, out: &mut Vec<Candidate>| {
        for n in names {
            out.push(Candidate::Path(dir.join(n)));
        }
    };
    for d in env_dirs("FRINK_CUDA_LIB_DIR") {
        in_dir(&d, &mut out);
    }
    out.extend(names.iter().map(|n| Candidate::Soname(n)));
    let mut dirs: Vec<PathBuf> = Vec::new();
    for var in ["CUDA_HOME", "CUDA_PATH"] {
        for root in env_dirs(var) {
            dirs.extend(toolkit_dirs(&root));
        }
    }
    for root in usr_local_cudas() {
        dirs.extend(toolkit_dirs(&root));
    }
    dirs.extend(
        [
            "/usr/local/nvidia/lib64",
            "/usr/lib/x86_64-linux-gnu",
            "/usr/lib/wsl/lib",
        ]
        .map(PathBuf::from),
    );
    if lib != Lib::Driver {
        for site in site_packages(ask_python) {
            dirs.extend(wheel_dirs(&site));
        }
    }
    let mut seen = std::collections::HashSet::new();
    for d in dirs.into_iter().filter(|d| d.is_dir()) {
        if seen.insert(d.clone()) {
            in_dir(&d, &mut out);
        }
    }
    out
}

/// Where the search for `lib` looks, source by source, with what each held: the text
/// an error about a missing library gives.
pub fn searched(lib: Lib, ask_python: bool) -> String {
    let mut parts = Vec::new();
    let set = |var: &str| -> String {
        match std::env::var_os(var) {
            Some(v) if !v.is_empty() => format!("{var}={}", v.to_string_lossy()),
            _ => format!("{var} (not set)"),
        }
    };
    parts.push(set("FRINK_CUDA_LIB_DIR"));
    parts.push("the dynamic loader's path (LD_LIBRARY_PATH, ldconfig)".to_string());
    parts.push(set("CUDA_HOME"));
    parts.push(set("CUDA_PATH"));
    let cudas = usr_local_cudas();
    parts.push(if cudas.is_empty() {
        "/usr/local/cuda* (none)".to_string()
    } else {
        cudas
            .iter()
            .map(|p| p.display().to_string())
            .collect::<Vec<_>>()
            .join(", ")
    });
    parts.push("/usr/local/nvidia/lib64, /usr/lib/x86_64-linux-gnu, /usr/lib/wsl/lib".into());
    if lib != Lib::Driver {
        let sites = site_packages(ask_python);
        let wheels: Vec<PathBuf> = sites.iter().flat_map(|s| wheel_dirs(s)).collect();
        parts.push(if sites.is_empty() {
            "pip's nvidia-* wheels (no Python environment found)".to_string()
        } else if wheels.is_empty() {
            format!(
                "pip's nvidia-* wheels (none in {})",
                sites
                    .iter()
                    .map(|p| p.display().to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        } else {
            format!(
                "pip's nvidia-* wheels in {}",
                wheels
                    .iter()
                    .map(|p| p.display().to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        });
    }
    parts.join("; ")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `$FRINK_CUDA_LIB_DIR` comes first (kept even when it does not exist, so a mistyped
    /// folder shows in the error), then the loader's names; pip wheels' `nvidia/*/lib`
    /// folders are found under a site-packages; the driver is never taken from a wheel.
    #[test]
    fn the_search_starts_with_frink_cuda_lib_dir_and_finds_wheels() {
        let tmp = tempfile::tempdir().unwrap();
        let wheel = tmp
            .path()
            .join("venv/lib/python3.11/site-packages/nvidia/cu13/lib");
        std::fs::create_dir_all(&wheel).unwrap();
        let mine = tmp.path().join("mine");
        // (The only test of this crate that reads the variable.)
        std::env::set_var("FRINK_CUDA_LIB_DIR", &mine);
        std::env::set_var("VIRTUAL_ENV", tmp.path().join("venv"));
        let c = candidates(Lib::Nvrtc, false);
        std::env::remove_var("FRINK_CUDA_LIB_DIR");
        std::env::remove_var("VIRTUAL_ENV");
        assert_eq!(c[0], Candidate::Path(mine.join("libnvrtc.so.13")));
        let first_soname = c.iter().position(|c| matches!(c, Candidate::Soname(_)));
        assert_eq!(first_soname, Some(Lib::Nvrtc.sonames().len()));
        assert!(
            c.contains(&Candidate::Path(wheel.join("libnvrtc.so.12"))),
            "{c:?}"
        );
        let driver = candidates(Lib::Driver, false);
        assert!(!driver
            .iter()
            .any(|c| c.to_string().contains("site-packages")));
        let said = searched(Lib::Nvrtc, false);
        assert!(
            said.contains("FRINK_CUDA_LIB_DIR (not set)")
                && said.contains("loader")
                && said.contains("CUDA_HOME")
                && said.contains("/usr/local/cuda")
                && said.contains("wheels"),
            "{said}"
        );
    }
}
