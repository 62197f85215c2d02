//! What a pull reports as it goes: one stream of [`PullEvent`]s, drawn as one progress bar
//! on a terminal ([`TerminalBar`], `frink pull`) or sent as Ollama's `/api/pull` status
//! lines by the server.

use std::io::IsTerminal;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

/// One step of a pull.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PullEvent {
    /// `completed` of `total` bytes fetched so far, over every part or shard of the model
    /// (`total` 0: not known). Sent often (every 100 ms at most while bytes arrive).
    Downloading { completed: u64, total: u64 },
    /// Every byte is in: the file is checked against its sha256 and moved into place.
    Verifying,
}

/// Receives a pull's [`PullEvent`]s, from the pulling thread or a thread watching pip.
pub trait Progress: Sync {
    /// Called for each event, in order.
    fn event(&self, event: PullEvent);
}

impl<F: Fn(PullEvent) + Sync> Progress for F {
    fn event(&self, event: PullEvent) {
        self(event)
    }
}

/// Reports nothing.
pub struct NoProgress;

impl Progress for NoProgress {
    fn event(&self, _: PullEvent) {}
}

/// One byte bar for the whole model on stderr, labelled with the model's name, drawn from
/// the first bytes on (a model already present draws nothing); nothing when stderr is not a
/// terminal. Cleared when dropped.
pub struct TerminalBar {
    bar: ProgressBar,
    label: String,
    tty: bool,
}

impl TerminalBar {
    /// A bar for the model `label` (hidden unless stderr is a terminal).
    pub fn new(label: &str) -> TerminalBar {
        let bar = ProgressBar::with_draw_target(Some(0), ProgressDrawTarget::hidden());
        if let Ok(style) = ProgressStyle::with_template(
            "{msg} [{wide_bar}] {decimal_bytes}/{decimal_total_bytes} {decimal_bytes_per_sec} eta {eta}",
        ) {
            bar.set_style(style.progress_chars("=> "));
        }
        bar.set_message(format!("pulling {label}"));
        TerminalBar {
            bar,
            label: label.to_string(),
            tty: std::io::stderr().is_terminal(),
        }
    }
}

impl Progress for TerminalBar {
    fn event(&self, event: PullEvent) {
        match event {
            PullEvent::Downloading { completed, total } => {
                if self.tty && self.bar.is_hidden() {
                    self.bar.set_draw_target(ProgressDrawTarget::stderr());
                }
                // An unknown total grows with what arrives.
                self.bar.set_length(total.max(completed));
                self.bar.set_position(completed);
            }
            PullEvent::Verifying => self.bar.set_message(format!("verifying {}", self.label)),
        }
    }
}

impl Drop for TerminalBar {
    fn drop(&mut self) {
        self.bar.finish_and_clear();
    }
}
