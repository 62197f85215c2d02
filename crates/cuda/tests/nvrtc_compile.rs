//! Every embedded kernel compiled by NVRTC for every supported architecture (sm_80, sm_86,
//! sm_89, sm_90), with ptxas' report: no kernel may spill registers. NVRTC runs without a
//! GPU: the test takes the NVRTC the machine has (`FRINK_TEST_NVRTC=/path/libnvrtc.so.N`,
//! or the backend's own search), else installs the `nvidia-cuda-nvrtc` wheel (13.0.88, the
//! GPU machine's version) under `target/`; without pip or network it prints SKIPPED,
//! except under `CI=true`, where that fails.

use std::path::{Path, PathBuf};

use frink_cuda::ffi::Nvrtc;
use frink_cuda::kernels::{ALL, ARCHS, OPTIONS};
use frink_cuda::nvrtc::{compile, kernel_reports, REPORT_OPTIONS};

const WHEEL: &str = "nvidia-cuda-nvrtc==13.0.88";

/// `libnvrtc.so.*` under `dir` (pip's layout: `nvidia/*/lib`).
fn find_lib(dir: &Path) -> Option<PathBuf> {
    let nv = dir.join("nvidia");
    for e in std::fs::read_dir(&nv).ok()?.flatten() {
        for f in std::fs::read_dir(e.path().join("lib"))
            .into_iter()
            .flatten()
            .flatten()
        {
            let n = f.file_name().to_string_lossy().into_owned();
            if n.starts_with("libnvrtc.so") {
                return Some(f.path());
            }
        }
    }
    None
}

/// NVRTC for the test, or why there is none.
fn nvrtc() -> Result<Nvrtc, String> {
    if let Some(p) = std::env::var_os("FRINK_TEST_NVRTC").filter(|p| !p.is_empty()) {
        return Nvrtc::open_path(Path::new(&p)).map_err(|e| e.to_string());
    }
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("nvrtc-wheel");
    if find_lib(&dir).is_none() {
        let out = std::process::Command::new("python3")
            .args([
                "-m",
                "pip",
                "install",
                "--quiet",
                "--disable-pip-version-check",
                "--no-deps",
                "--target",
            ])
            .arg(&dir)
            .arg(WHEEL)
            .output()
            .map_err(|e| format!("cannot run pip: {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "pip install {WHEEL} failed: {}",
                String::from_utf8_lossy(&out.stderr)
            ));
        }
    }
    let lib = find_lib(&dir).ok_or_else(|| format!("no libnvrtc.so in {}", dir.display()))?;
    Nvrtc::open_path(&lib).map_err(|e| e.to_string())
}

#[test]
fn every_kernel_compiles_for_every_architecture_without_spills() {
    let nvrtc = match nvrtc() {
        Ok(n) => n,
        Err(e) if std::env::var("CI").is_ok_and(|v| v == "true") => panic!("{e}"),
        Err(e) => {
            frink_testdata::skipped("the NVRTC compile checks", &e);
            return;
        }
    };
    let (major, minor) = nvrtc.version();
    eprintln!("NVRTC {major}.{minor} at {}", nvrtc.path);
    let opts: Vec<&str> = OPTIONS.iter().chain(REPORT_OPTIONS).copied().collect();
    for src in ALL {
        for &cc in ARCHS {
            let c = compile(&nvrtc, src.name, src.text, cc, &opts, None)
                .unwrap_or_else(|e| panic!("{e}"));
            assert!(!c.image.is_empty());
            let reports = kernel_reports(&c.log);
            for k in src.kernels {
                let r = reports.iter().find(|r| r.name == *k).unwrap_or_else(|| {
                    panic!(
                        "{} sm_{}{}: no report for {k} in:\n{}",
                        src.name, cc.0, cc.1, c.log
                    )
                });
                assert_eq!(
                    (r.spill_stores, r.spill_loads),
                    (0, 0),
                    "{k} spills on sm_{}{}: {r:?}",
                    cc.0,
                    cc.1
                );
                eprintln!(
                    "{} sm_{}{} {k}: {} registers",
                    src.name, cc.0, cc.1, r.registers
                );
            }
        }
    }
}

#[test]
fn a_compiled_kernel_is_cached_and_read_back() {
    let Ok(nvrtc) = nvrtc() else {
        frink_testdata::skipped(
            "the NVRTC cache check",
            "no NVRTC (the compile check says why)",
        );
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let src = "extern \"C\" __global__ void k(float* x) { x[threadIdx.x] += 1.0f; }";
    let a = compile(&nvrtc, "tiny", src, (9, 0), &[], Some(dir.path())).unwrap();
    assert!(!a.cached);
    let b = compile(&nvrtc, "tiny", src, (9, 0), &[], Some(dir.path())).unwrap();
    assert!(b.cached && b.image == a.image);
    // Another architecture is another entry.
    let c = compile(&nvrtc, "tiny", src, (8, 0), &[], Some(dir.path())).unwrap();
    assert!(!c.cached);
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 2);
    // A syntax error is an error with NVRTC's log, not a panic.
    let e = compile(
        &nvrtc,
        "bad",
        "extern \"C\" __global__ void k( {",
        (9, 0),
        &[],
        None,
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("bad") && e.contains("sm_90"), "{e}");
}
