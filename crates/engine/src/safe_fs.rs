//! Reading and writing the files a server keeps for its clients (saved slot states, the
//! prefix cache's disk tier) in a folder others may write to: a read takes only a
//! regular file, of bounded size, following no symbolic link and never blocking on a
//! FIFO; a write never writes through a link that is already there (it writes a new
//! file, created exclusively, and renames it over the name).

use std::io::{Read, Write};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

/// The contents of the regular file at `path`, at most `max` bytes.
///
/// Errors: the file is missing or unreadable, is a symbolic link (not followed), a
/// FIFO, a device or a folder ([`std::io::ErrorKind::InvalidInput`]), or holds more than
/// `max` bytes ([`std::io::ErrorKind::InvalidData`]).
pub fn read_regular(path: &Path, max: usize) -> std::io::Result<Vec<u8>> {
    let mut opts = std::fs::OpenOptions::new();
    opts.read(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        opts.custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK);
    }
    let file = opts.open(path).map_err(|e| match e.raw_os_error() {
        #[cfg(unix)]
        Some(libc::ELOOP) => invalid("a symbolic link (not followed)"),
        _ => e,
    })?;
    let meta = file.metadata()?;
    if !meta.is_file() {
        return Err(invalid("not a regular file"));
    }
    if meta.len() > max as u64 {
        return Err(too_large(meta.len(), max));
    }
    let mut out = Vec::with_capacity(meta.len() as usize);
    file.take(max as u64 + 1).read_to_end(&mut out)?;
    if out.len() > max {
        return Err(too_large(out.len() as u64, max));
    }
    Ok(out)
}

fn invalid(what: &str) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::InvalidInput, what.to_string())
}

fn too_large(len: u64, max: usize) -> std::io::Error {
    std::io::Error::new(
        std::io::ErrorKind::InvalidData,
        format!("{len} bytes, more than the {max} it may hold"),
    )
}

/// Writes `bytes` as the file at `path`: into a new file beside it (created exclusively:
/// an existing name or link there is an error, not followed) renamed over `path` (which
/// replaces a link there, not its target).
pub fn write_replacing(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    static N: AtomicU64 = AtomicU64::new(0);
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let tmp = path.with_file_name(format!(
        ".{name}.{}.{}.tmp",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    let written = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&tmp)
        .and_then(|mut f| f.write_all(bytes));
    match written.and_then(|()| std::fs::rename(&tmp, path)) {
        Ok(()) => Ok(()),
        Err(e) => {
            let _ = std::fs::remove_file(&tmp);
            Err(e)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_only_bounded_regular_files_and_writes_past_links() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("a.bin");
        write_replacing(&f, b"hello").unwrap();
        assert_eq!(read_regular(&f, 5).unwrap(), b"hello");
        assert!(read_regular(&f, 4).is_err());
        assert!(read_regular(dir.path(), 100).is_err());
        #[cfg(unix)]
        {
            let victim = dir.path().join("victim.txt");
            std::fs::write(&victim, b"keep").unwrap();
            let link = dir.path().join("link.bin");
            std::os::unix::fs::symlink(&victim, &link).unwrap();
            let e = read_regular(&link, 100).unwrap_err();
            assert!(e.to_string().contains("symbolic link"), "{e}");
            write_replacing(&link, b"new").unwrap();
            assert_eq!(std::fs::read(&victim).unwrap(), b"keep");
            assert_eq!(std::fs::read(&link).unwrap(), b"new");
            let zero = dir.path().join("zero.bin");
            std::os::unix::fs::symlink("/dev/zero", &zero).unwrap();
            assert!(read_regular(&zero, 100).is_err());
            let fifo = dir.path().join("fifo.bin");
            let made = std::process::Command::new("mkfifo").arg(&fifo).status();
            assert!(made.is_ok_and(|s| s.success()), "mkfifo");
            let e = read_regular(&fifo, 100).unwrap_err();
            assert!(e.to_string().contains("regular"), "{e}");
        }
    }
}
