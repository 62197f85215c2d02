//! A running `frink serve` (the real binary on a loopback port) for the tests of the
//! command; its client is [`frink_testdata::http::Client`].

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

#[allow(unused_imports)] // each test binary uses its own subset
pub use frink_testdata::http::{stream_text, Client, Response, Stream};

/// Given to [`Server::start`]: start the server without `-m` (it loads the models that
/// requests name); not passed to frink.
pub const NO_M: &str = "<no -m>";

/// A `frink serve` child process on a free loopback port; killed on drop.
pub struct Server {
    child: Option<Child>,
    client: Client,
    /// Everything it wrote on stderr so far.
    pub log: Arc<Mutex<String>>,
}

impl std::ops::Deref for Server {
    type Target = Client;
    fn deref(&self) -> &Client {
        &self.client
    }
}

impl Server {
    /// Starts `frink serve -t 2 --port 0 ARGS` and waits until the model is loaded.
    pub fn start(args: &[&str]) -> Server {
        Server::start_env(args, &[])
    }

    /// As [`Server::start`], with environment variables set.
    pub fn start_env(args: &[&str], env: &[(&str, &str)]) -> Server {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_frink"));
        cmd.args(["serve", "-t", "2", "--port", "0"])
            .args(args.iter().filter(|a| **a != NO_M));
        // Most tests serve one model: the default one unless they name another, or ask
        // for none with [`NO_M`].
        let single = !args.iter().any(|a| *a == "-m" || *a == "--model");
        if single && !args.contains(&NO_M) {
            cmd.args(["-m", "smollm2-135m"]);
        }
        for var in [
            "RUST_LOG",
            "FRINK_MODEL",
            "FRINK_API_KEY",
            "FRINK_PARALLEL",
            "FRINK_CTX",
        ] {
            cmd.env_remove(var);
        }
        cmd.envs(env.iter().copied());
        let mut child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start frink serve");
        let stderr = child.stderr.take().unwrap();
        let log = Arc::new(Mutex::new(String::new()));
        let (tx, rx) = std::sync::mpsc::channel();
        {
            let log = Arc::clone(&log);
            std::thread::spawn(move || {
                for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                    if let Some(rest) = line.split("ready on http://127.0.0.1:").nth(1) {
                        let _ = tx.send(rest.trim().parse::<u16>().ok());
                    }
                    log.lock().unwrap().push_str(&(line + "\n"));
                }
                let _ = tx.send(None);
            });
        }
        let port = rx
            .recv_timeout(Duration::from_secs(120))
            .ok()
            .flatten()
            .unwrap_or_else(|| panic!("frink serve did not start: {}", log.lock().unwrap()));
        Server {
            child: Some(child),
            client: Client { port },
            log,
        }
    }

    /// The server's process id.
    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("running").id()
    }

    /// The server's resident memory (`VmRSS` of /proc), in bytes.
    pub fn rss_bytes(&self) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid()))
            .expect("read /proc/PID/status");
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
            .expect("VmRSS")
            * 1024
    }

    /// Sends SIGTERM and waits for the exit (at most `limit`).
    pub fn terminate(&mut self, limit: Duration) -> Option<ExitStatus> {
        let ok = Command::new("kill")
            .args(["-TERM", &self.pid().to_string()])
            .status()
            .is_ok_and(|s| s.success());
        assert!(ok, "kill -TERM");
        self.wait_exit(limit)
    }

    /// Waits for the process to exit (at most `limit`; killed after that).
    pub fn wait_exit(&mut self, limit: Duration) -> Option<ExitStatus> {
        let mut child = self.child.take()?;
        let t0 = Instant::now();
        while t0.elapsed() < limit {
            if let Some(st) = child.try_wait().unwrap() {
                return Some(st);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = child.kill();
        let _ = child.wait();
        None
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}
