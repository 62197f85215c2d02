//! The docs cannot rot: every `sh` block of README.md and `docs/*.md` is run as a bash
//! script (`frink` on the `PATH` is this build; `curl` fails on an HTTP error status), and
//! a block marked `<!-- docs: check -->` on the line before it (it needs the hub, a GPU,
//! docker, an anchor or minutes) has each command's program, subcommand and options
//! checked against that program's own `--help`, as is every inline `` `frink …` `` span.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The marker that turns a block from run into checked.
const CHECK: &str = "<!-- docs: check -->";

/// A fenced `sh` block: where it is, its text, whether it is only checked.
struct Block {
    at: String,
    text: String,
    check_only: bool,
}

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// README.md and every `docs/*.md`, with their text.
fn documents() -> Vec<(String, String)> {
    let mut files = vec![repo().join("README.md")];
    let mut docs: Vec<PathBuf> = std::fs::read_dir(repo().join("docs"))
        .expect("docs/ exists")
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "md"))
        .collect();
    docs.sort();
    files.extend(docs);
    files
        .into_iter()
        .map(|p| {
            let name = p.strip_prefix(repo()).unwrap_or(&p).display().to_string();
            (name, std::fs::read_to_string(&p).unwrap())
        })
        .collect()
}

/// The fenced blocks of one document whose info string is `sh`, and the text outside
/// every fence (for the inline spans).
fn split(name: &str, text: &str) -> (Vec<Block>, String) {
    let (mut blocks, mut prose) = (Vec::new(), String::new());
    let mut open: Option<(usize, bool, bool, String)> = None; // (line, sh, check, text)
    let mut last_nonblank = "";
    for (i, line) in text.lines().enumerate() {
        let fence = line.trim_start().starts_with("```");
        match (&mut open, fence) {
            (None, true) => {
                let info = line.trim_start().trim_start_matches('`').trim();
                open = Some((i + 1, info == "sh", last_nonblank == CHECK, String::new()));
            }
            (Some((at, sh, check, body)), true) => {
                if *sh {
                    blocks.push(Block {
                        at: format!("{name}:{at}"),
                        text: std::mem::take(body),
                        check_only: *check,
                    });
                }
                open = None;
            }
            (Some((_, _, _, body)), false) => {
                body.push_str(line);
                body.push('\n');
            }
            (None, false) => {
                prose.push_str(line);
                prose.push('\n');
            }
        }
        if !line.trim().is_empty() {
            last_nonblank = line.trim();
        }
    }
    assert!(open.is_none(), "{name}: a code fence is never closed");
    (blocks, prose)
}

/// Logical command lines: `\` continuations joined, and a synopsis line that starts with
/// `[` or a flag joined to the command it continues.
fn logical_lines(text: &str) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    let mut joining = false;
    for line in text.lines() {
        let t = line.trim();
        let continues = joining || t.starts_with('[') || (t.starts_with('-') && !out.is_empty());
        let body = t.strip_suffix('\\').unwrap_or(t);
        match out.last_mut() {
            Some(last) if continues => {
                last.push(' ');
                last.push_str(body);
            }
            _ => out.push(body.to_string()),
        }
        joining = t.ends_with('\\');
    }
    out
}

/// A line with its comment (from a `#` after a space) and the contents of its quoted
/// strings removed; `$( … )` substitutions returned separately.
fn strip(line: &str) -> (String, Vec<String>) {
    let (mut out, mut subs) = (String::new(), Vec::new());
    let chars: Vec<char> = line.chars().collect();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        if c == '\'' || c == '"' {
            let end = chars[i + 1..].iter().position(|&d| d == c);
            out.push_str(" Q ");
            i += end.map_or(chars.len(), |e| e + 2);
            continue;
        }
        if c == '$' && chars.get(i + 1) == Some(&'(') {
            let end = chars[i..]
                .iter()
                .position(|&d| d == ')')
                .map_or(chars.len(), |e| e + i);
            subs.push(chars[i + 2..end].iter().collect());
            out.push_str(" S ");
            i = end + 1;
            continue;
        }
        if c == '#' && (i == 0 || chars[i - 1].is_whitespace()) {
            break;
        }
        out.push(c);
        i += 1;
    }
    (out, subs)
}

/// The option names in a command's words: `--long` and `-x`, found after any of
/// `[`, `(`, `|`, `=`, `,` (a synopsis' punctuation); values such as `-1` are not options.
fn options(words: &[&str]) -> Vec<String> {
    let mut out = Vec::new();
    for w in words {
        for part in w.split(['[', ']', '(', ')', '|', '=', ',']) {
            let long = part.strip_prefix("--").is_some_and(|r| {
                r.starts_with(|c: char| c.is_ascii_lowercase())
                    && r.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
            });
            let short = part.len() == 2
                && part.starts_with('-')
                && part[1..].starts_with(|c: char| c.is_ascii_alphabetic());
            // llama.cpp's two-letter flags, which frink's main.rs reads as their long
            // names (LLAMA_CPP_FLAGS).
            let llama = [
                ("-md", "--draft-model"),
                ("-np", "--parallel"),
                ("-ngl", "--gpu-layers"),
            ];
            if let Some((_, long)) = llama.iter().find(|(s, _)| *s == part) {
                out.push(long.to_string());
            } else if long || short {
                out.push(part.to_string());
            }
        }
    }
    out
}

/// `--help`'s text names the option (followed by a non-name character).
fn help_names(help: &str, option: &str) -> bool {
    help.match_indices(option).any(|(i, _)| {
        let before = help[..i].chars().last();
        let after = help[i + option.len()..].chars().next();
        !before.is_some_and(|c| c.is_ascii_alphanumeric() || c == '-')
            && !after.is_some_and(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
    })
}

fn help_of(program: &str, args: &[&str]) -> String {
    let out = Command::new(program)
        .args(args)
        .arg("--help")
        .current_dir(repo())
        .output()
        .unwrap_or_else(|e| panic!("cannot run {program}: {e}"));
    assert!(
        out.status.success(),
        "`{program} {} --help` failed: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The subcommands `frink --help` lists.
fn frink_subcommands() -> Vec<String> {
    let help = help_of(env!("CARGO_BIN_EXE_frink"), &[]);
    let list = help
        .split("Commands:")
        .nth(1)
        .expect("frink --help lists commands");
    list.lines()
        .skip_while(|l| l.trim().is_empty())
        .take_while(|l| !l.trim().is_empty())
        .filter_map(|l| l.split_whitespace().next().map(str::to_string))
        .collect()
}

/// Checks one `frink …` command's words (after `frink`): its subcommand exists and its
/// options are in the subcommand's `--help`. Returns the problems.
fn check_frink(words: &[&str], subcommands: &[String]) -> Vec<String> {
    let sub = words
        .iter()
        .find(|w| !w.starts_with('-') && !w.starts_with('['));
    let sub = match sub {
        Some(s) if subcommands.iter().any(|c| c == s) => Some(*s),
        Some(s) if words.first() == Some(s) => return vec![format!("no subcommand `{s}`")],
        _ => None,
    };
    let help = help_of(env!("CARGO_BIN_EXE_frink"), sub.as_slice());
    options(words)
        .into_iter()
        .filter(|o| !help_names(&help, o))
        .map(|o| format!("`frink {}` has no option `{o}`", sub.unwrap_or("")))
        .collect()
}

/// Checks one simple command (its words) and returns the problems.
fn check_command(words: &[&str], subcommands: &[String]) -> Vec<String> {
    match words {
        ["frink", rest @ ..] => check_frink(rest, subcommands),
        ["cargo", "run", rest @ ..] => {
            let split = rest.iter().position(|w| *w == "--");
            let (cargo, args) = match split {
                Some(i) => (&rest[..i], &rest[i + 1..]),
                None => (rest, &[][..]),
            };
            match cargo.iter().position(|w| *w == "--example") {
                Some(i) => {
                    let name = cargo.get(i + 1).copied().unwrap_or("");
                    let found = ["cuda", "models", "quant", "engine", "cli"]
                        .iter()
                        .any(|c| {
                            repo()
                                .join(format!("crates/{c}/examples/{name}.rs"))
                                .exists()
                        })
                        || std::fs::read_to_string(repo().join("crates/models/Cargo.toml"))
                            .unwrap()
                            .contains(&format!("name = \"{name}\""));
                    if found {
                        vec![]
                    } else {
                        vec![format!("no example `{name}`")]
                    }
                }
                None => check_frink(args, subcommands),
            }
        }
        ["cargo", "install", "--path", path, ..] if !repo().join(path).exists() => {
            vec![format!("no path `{path}`")]
        }
        ["python3", script, rest @ ..] if script.starts_with("benches/") => {
            if !repo().join(script).exists() {
                return vec![format!("no script `{script}`")];
            }
            let help = help_of("python3", &[script]);
            options(rest)
                .into_iter()
                .filter(|o| !help_names(&help, o))
                .map(|o| format!("`{script}` has no option `{o}`"))
                .collect()
        }
        _ => vec![],
    }
}

/// Every simple command of a block or span: split at pipes, `;`, `&&` and `&`; a piece
/// that starts with an option or `[` continues the command before it (a synopsis'
/// alternatives).
fn check_text(text: &str, subcommands: &[String]) -> Vec<String> {
    let mut problems = Vec::new();
    for line in logical_lines(text) {
        let (clean, subs) = strip(&line);
        for s in subs {
            problems.extend(check_text(&s, subcommands));
        }
        let mut command: Vec<&str> = Vec::new();
        for piece in clean.split(['|', ';', '&']) {
            let words: Vec<&str> = piece.split_whitespace().collect();
            let continues = words.first().is_some_and(|w| w.starts_with(['-', '[']));
            if !continues && !command.is_empty() {
                problems.extend(check_command(&command, subcommands));
                command.clear();
            }
            command.extend(words);
        }
        problems.extend(check_command(&command, subcommands));
    }
    problems
}

#[test]
fn every_documented_command_names_real_commands_and_options() {
    let subcommands = frink_subcommands();
    let mut problems = Vec::new();
    let mut checked = 0;
    for (name, text) in documents() {
        let (blocks, prose) = split(&name, &text);
        for b in &blocks {
            for p in check_text(&b.text, &subcommands) {
                problems.push(format!("{} (block): {p}", b.at));
            }
            checked += 1;
        }
        // Inline spans: `frink …`.
        for (i, span) in prose.split('`').enumerate() {
            if i % 2 == 1 && span.starts_with("frink ") {
                for p in check_text(span, &subcommands) {
                    problems.push(format!("{name} (`{span}`): {p}"));
                }
                checked += 1;
            }
        }
    }
    println!("{checked} blocks and spans checked");
    assert!(checked > 30, "too few commands found: {checked}");
    assert!(
        problems.is_empty(),
        "the docs name what does not exist:\n{}",
        problems.join("\n")
    );
}

/// A directory put first on the blocks' `PATH`: `frink` is this build, and `curl` fails on
/// an HTTP error status (a 401 or a 500 is a broken example, not a printed error).
fn tool_dir() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let link = |name: &str, body: String| {
        let p = dir.path().join(name);
        std::fs::write(&p, body).unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
    };
    link(
        "frink",
        format!("#!/bin/sh\nexec '{}' \"$@\"\n", env!("CARGO_BIN_EXE_frink")),
    );
    let curl = ["/usr/bin/curl", "/bin/curl", "/usr/local/bin/curl"]
        .into_iter()
        .find(|p| Path::new(p).exists())
        .expect("the docs' examples need curl");
    // `--fail-with-body` unless the example asks for `-f` itself (the two conflict).
    link(
        "curl",
        format!(
            "#!/bin/sh\nfor a in \"$@\"; do case \"$a\" in --fail|-[a-zA-Z]*f*) \
             exec {curl} --max-time 120 \"$@\";; esac; done\n\
             exec {curl} --fail-with-body --max-time 120 \"$@\"\n"
        ),
    );
    dir
}

/// Runs one block as `bash -euo pipefail` in its own process group from the repository's
/// root, at most `limit`; the group (a server the block started) is killed afterwards.
fn run_block(block: &Block, path: &str, limit: Duration) -> Result<String, String> {
    use std::os::unix::process::CommandExt;
    let out_dir = tempfile::tempdir().unwrap();
    let (out, err) = (out_dir.path().join("out"), out_dir.path().join("err"));
    let mut child = Command::new("bash")
        .args(["-euo", "pipefail", "-c", &block.text])
        .current_dir(repo())
        .env("PATH", path)
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&out).unwrap())
        .stderr(std::fs::File::create(&err).unwrap())
        .process_group(0)
        .spawn()
        .unwrap();
    let start = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break Some(s);
        }
        if start.elapsed() > limit {
            break None;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let _ = Command::new("kill")
        .args(["-s", "KILL", "--", &format!("-{}", child.id())])
        .stderr(Stdio::null())
        .status();
    let _ = child.wait();
    let text = format!(
        "stdout:\n{}\nstderr:\n{}",
        std::fs::read_to_string(&out).unwrap_or_default(),
        std::fs::read_to_string(&err).unwrap_or_default()
    );
    match status {
        Some(s) if s.success() => Ok(text),
        Some(s) => Err(format!("exited with {s}\n{text}")),
        None => Err(format!("still running after {limit:?}\n{text}")),
    }
}

#[test]
fn every_documented_example_runs() {
    let tools = tool_dir();
    let path = format!(
        "{}:{}",
        tools.path().display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let shared = repo().join("../shared");
    let ci = std::env::var("CI").is_ok_and(|v| v == "true");
    let mut ran = 0;
    for (name, text) in documents() {
        for b in split(&name, &text).0.into_iter().filter(|b| !b.check_only) {
            if b.text.contains("../shared") && !shared.exists() {
                assert!(!ci, "{}: ../shared is missing under CI=true", b.at);
                frink_testdata::skipped(&b.at, "../shared is absent");
                continue;
            }
            if b.text.contains("frink serve") {
                // The examples listen on the default port; a busy one is named, not a hang.
                // (A server killed by the block before lets go of it within moments.)
                let port = 8080;
                let free = || std::net::TcpListener::bind(("127.0.0.1", port)).is_ok();
                let since = Instant::now();
                while !free() && since.elapsed() < Duration::from_secs(10) {
                    std::thread::sleep(Duration::from_millis(100));
                }
                assert!(
                    free(),
                    "{}: port {port} is in use; the docs' server examples need it",
                    b.at
                );
            }
            let start = Instant::now();
            match run_block(&b, &path, Duration::from_secs(300)) {
                Ok(_) => println!("ran {} in {:.1} s", b.at, start.elapsed().as_secs_f64()),
                Err(e) => panic!("{} failed:\n{}\n{e}", b.at, b.text),
            }
            ran += 1;
        }
    }
    assert!(ran >= 5, "too few runnable blocks: {ran}");
}
