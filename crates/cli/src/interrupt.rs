//! Ctrl+C during generation: the first SIGINT sets a flag the token loop reads (the answer
//! stops at the next token and the timing line is printed); a second one ends the process
//! at once, as an interrupted program does.

use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use anyhow::{Context, Result};
use signal_hook::consts::SIGINT;

/// A flag set by the first SIGINT from now on; a second SIGINT exits with status 130.
///
/// # Errors
/// The handler cannot be installed.
pub fn on_sigint() -> Result<Arc<AtomicBool>> {
    let flag = Arc::new(AtomicBool::new(false));
    // Registered first, so it sees the flag before the second handler sets it: a SIGINT
    // with the flag already set exits.
    signal_hook::flag::register_conditional_shutdown(SIGINT, 130, Arc::clone(&flag))
        .context("cannot install the Ctrl+C handler")?;
    signal_hook::flag::register(SIGINT, Arc::clone(&flag))
        .context("cannot install the Ctrl+C handler")?;
    Ok(flag)
}
