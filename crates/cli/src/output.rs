//! Files a command writes whole or not at all (`quantize`, `imatrix`): checked before any
//! work (a regular file or nothing, in an existing folder, none of the inputs), written to
//! a temporary file of its own beside the target (created new, so never another file, an
//! input or another run's), and renamed over the target only when complete; removed on
//! failure.

use std::fs::File;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};

/// Refuses `out` unless it can be written whole: it names a file (no trailing `/`) that
/// is not a symbolic link (the rename would replace the link), its folder exists, and it
/// is either absent or a regular file (not a device, FIFO, socket or folder, which a
/// rename would replace) that is none of `inputs` (the same file by device and inode,
/// through any name or link; `-` is standard input).
///
/// # Errors
/// Which of those fails, naming `out`.
pub fn check(out: &Path, inputs: &[PathBuf]) -> Result<()> {
    if out.file_name().is_none() || out.as_os_str().to_string_lossy().ends_with('/') {
        bail!("{}: names a folder, not a file", out.display());
    }
    if std::fs::symlink_metadata(out).is_ok_and(|m| m.file_type().is_symlink()) {
        bail!(
            "{}: is a symbolic link (the finished file would replace the link, not what it \
             points to); name the file itself",
            out.display()
        );
    }
    let parent = match out.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    if !parent.is_dir() {
        bail!(
            "{}: its folder {} does not exist",
            out.display(),
            parent.display()
        );
    }
    let Ok(meta) = std::fs::metadata(out) else {
        return Ok(());
    };
    if !meta.is_file() {
        bail!(
            "{}: exists and is not a regular file (a folder, device or pipe is not replaced)",
            out.display()
        );
    }
    for input in inputs {
        // `-` is standard input: the file it reads, if it is one.
        let named = if input.as_os_str() == "-" {
            Path::new("/dev/stdin")
        } else {
            input.as_path()
        };
        if same_file(out, named) {
            bail!(
                "the output {} is the input {}",
                out.display(),
                input.display()
            );
        }
    }
    Ok(())
}

/// Whether `a` and `b` name the same existing file.
fn same_file(a: &Path, b: &Path) -> bool {
    match (std::fs::metadata(a), std::fs::metadata(b)) {
        (Ok(x), Ok(y)) => {
            #[cfg(unix)]
            {
                use std::os::unix::fs::MetadataExt;
                x.dev() == y.dev() && x.ino() == y.ino()
            }
            #[cfg(not(unix))]
            {
                let _ = (x, y);
                a.canonicalize().ok() == b.canonicalize().ok()
            }
        }
        _ => false,
    }
}

/// A new temporary file beside `out` (`.NAME.PID.N.part`, created only if no such file
/// exists), and its path.
///
/// # Errors
/// The folder cannot be written.
pub fn create_part(out: &Path) -> Result<(File, PathBuf)> {
    let name = out
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "output".into());
    for n in 0..1000 {
        let part = out.with_file_name(format!(".{name}.{}.{n}.part", std::process::id()));
        match std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&part)
        {
            Ok(f) => return Ok((f, part)),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(e).with_context(|| format!("cannot create {}", part.display())),
        }
    }
    bail!("cannot find a free temporary name beside {}", out.display())
}

/// Moves the finished `part` over `out`, or removes it when that fails.
///
/// # Errors
/// The rename fails (the temporary file is gone either way).
pub fn finish(part: &Path, out: &Path) -> Result<()> {
    std::fs::rename(part, out).map_err(|e| {
        let _ = std::fs::remove_file(part);
        anyhow::Error::new(e).context(format!("cannot write {}", out.display()))
    })
}

/// Writes `bytes` to `out` whole or not at all.
///
/// # Errors
/// As [`create_part`] and [`finish`], or a failed write (the temporary file removed).
pub fn write_all(out: &Path, bytes: &[u8]) -> Result<()> {
    use std::io::Write;
    let (mut f, part) = create_part(out)?;
    let written = f.write_all(bytes).and_then(|()| f.sync_all());
    if let Err(e) = written {
        let _ = std::fs::remove_file(&part);
        return Err(e).with_context(|| format!("cannot write {}", out.display()));
    }
    finish(&part, out)
}
