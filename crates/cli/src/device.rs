//! `--device auto|cpu|cuda[:N]` and `frink devices`.
//!
//! The CUDA backend is being built (docs/gpu.md): its libraries are found and checked,
//! its kernels compile and are tested against the CPU on a GPU, but no model runs on a
//! GPU yet. So `auto` runs on the CPU (saying so when a usable GPU is present), and `cuda`
//! is refused with an error naming what is missing, or, when nothing is, saying that
//! models do not run there yet.

use anyhow::Result;

/// Where a model runs (`--device`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Device {
    /// The GPU when one is usable and the model runs there, else the CPU.
    #[default]
    Auto,
    /// The CPU.
    Cpu,
    /// GPU `N` (`cuda` is `cuda:0`).
    Cuda(usize),
}

/// `auto`, `cpu`, `cuda` or `cuda:N`.
pub fn parse_device(s: &str) -> std::result::Result<Device, String> {
    match s {
        "auto" => Ok(Device::Auto),
        "cpu" => Ok(Device::Cpu),
        "cuda" => Ok(Device::Cuda(0)),
        _ => s
            .strip_prefix("cuda:")
            .and_then(|n| n.parse().ok())
            .map(Device::Cuda)
            .ok_or_else(|| format!("{s:?}: expected auto, cpu, cuda or cuda:N")),
    }
}

/// Decides where the model runs; `Ok` means the CPU.
///
/// Errors: `cuda[:N]` always, for now: what is missing (the driver, the GPU, NVRTC, an
/// old GPU; where it looked), or, when nothing is, that models do not run on GPUs yet.
pub fn resolve(d: Device) -> Result<()> {
    match d {
        Device::Cpu => Ok(()),
        Device::Auto => {
            if let Ok(ctx) = frink_cuda::Context::new(0) {
                eprintln!(
                    "frink: {} is here, but models do not run on GPUs yet (the CUDA backend \
                     is being built); running on the CPU",
                    ctx.gpu.name
                );
            }
            Ok(())
        }
        Device::Cuda(n) => {
            let ctx = frink_cuda::Context::new(n)
                .map_err(|e| anyhow::anyhow!("--device cuda:{n}: {e}"))?;
            frink_cuda::ffi::Nvrtc::open()
                .map_err(|e| anyhow::anyhow!("--device cuda:{n}: {e}"))?;
            anyhow::bail!(
                "--device cuda:{n}: {} and the CUDA libraries are usable, but models do not \
                 run on GPUs yet (the CUDA backend is being built; `frink devices` shows what \
                 was found); use --device cpu or auto",
                ctx.gpu.name
            )
        }
    }
}

/// `frink devices`: the driver, NVRTC and the GPUs, as text or (`json`) one JSON object.
pub fn list(json: bool) -> Result<()> {
    let p = frink_cuda::probe();
    if json {
        outln!("{}", p.json());
        return Ok(());
    }
    match &p.driver {
        Ok((path, v)) => outln!(
            "driver: CUDA {} ({path})",
            frink_cuda::device::version_name(*v)
        ),
        Err(e) => outln!("driver: {e}"),
    }
    match &p.nvrtc {
        Ok((path, (a, b))) => outln!("NVRTC: {a}.{b} ({path})"),
        Err(e) => outln!("NVRTC: {e}"),
    }
    if p.gpus.is_empty() {
        outln!("GPUs: none");
    }
    for g in &p.gpus {
        outln!(
            "GPU {}: {}, {:.1} GiB, compute capability {}.{}, {} multiprocessors",
            g.index,
            g.name,
            g.total_memory as f64 / (1u64 << 30) as f64,
            g.cc.0,
            g.cc.1,
            g.sms
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn devices_parse() {
        assert_eq!(parse_device("auto"), Ok(Device::Auto));
        assert_eq!(parse_device("cpu"), Ok(Device::Cpu));
        assert_eq!(parse_device("cuda"), Ok(Device::Cuda(0)));
        assert_eq!(parse_device("cuda:3"), Ok(Device::Cuda(3)));
        for bad in ["gpu", "cuda:", "cuda:x", "CUDA", "cuda:-1"] {
            assert!(parse_device(bad).is_err(), "{bad}");
        }
    }
}
