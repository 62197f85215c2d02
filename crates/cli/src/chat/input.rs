//! What `frink chat` reads: on a terminal, a line editor (rustyline: arrow keys, history
//! kept in `$FRINK_HOME/chat_history`, Alt+Enter for a new line); from a pipe, plain lines.
//! In both, a message that starts with `"""` goes on over lines until one ends with `"""`,
//! as in Ollama's prompt.

use std::io::{BufRead, IsTerminal, Read};
use std::path::PathBuf;

use anyhow::{Context, Result};
use rustyline::error::ReadlineError;
use rustyline::history::DefaultHistory;
use rustyline::{Cmd, Editor, EventHandler, KeyCode, KeyEvent, Modifiers};

/// The prompt of a new message, and of the lines of a multi-line one.
const PROMPT: &str = ">>> ";
const MORE: &str = "... ";

/// Quotes that open and close a multi-line message.
const FENCE: &str = "\"\"\"";

/// Most entries the history file keeps.
const HISTORY_LINES: usize = 1000;

/// One thing the user typed.
#[derive(Debug, PartialEq, Eq)]
pub enum Input {
    /// A line: a message, or a command when it starts with `/`.
    Text(String),
    /// A `"""` block: always a message (its lines joined with `\n`, without the quotes and
    /// the line breaks right after the opening and before the closing ones).
    Block(String),
    /// Ctrl+C at the prompt (on a terminal).
    Interrupted,
    /// Ctrl+D or the end of the input.
    End,
}

/// The source of [`Input`]s: a line editor on a terminal, lines from a pipe otherwise.
pub struct Reader {
    source: Source,
}

enum Source {
    Editor {
        editor: Box<Editor<(), DefaultHistory>>,
        history: Option<PathBuf>,
    },
    Lines(std::io::StdinLock<'static>),
}

/// The longest line read from a pipe (bytes); a longer one is refused, not buffered.
const MAX_LINE: usize = 16 << 20;

/// One line of `r` without its newline, at most [`MAX_LINE`] bytes (`None` at the end).
fn read_line_capped<R: BufRead>(r: &mut R) -> Result<Option<String>> {
    let mut buf = Vec::new();
    let n = Read::take(&mut *r, MAX_LINE as u64 + 1)
        .read_until(b'\n', &mut buf)
        .context("reading standard input")?;
    if n == 0 {
        return Ok(None);
    }
    if buf.last() == Some(&b'\n') {
        buf.pop();
        if buf.last() == Some(&b'\r') {
            buf.pop();
        }
    } else if buf.len() > MAX_LINE {
        anyhow::bail!("an input line is longer than {MAX_LINE} bytes");
    }
    String::from_utf8(buf)
        .map(Some)
        .context("standard input is not UTF-8")
}

impl Reader {
    /// A line editor when standard input and standard error are terminals (history in
    /// `history`, if given), plain lines otherwise.
    ///
    /// # Errors
    /// The terminal cannot be set up.
    pub fn new(history: Option<PathBuf>) -> Result<Reader> {
        let tty = std::io::stdin().is_terminal() && std::io::stderr().is_terminal();
        if !tty {
            return Ok(Reader {
                source: Source::Lines(std::io::stdin().lock()),
            });
        }
        let config = rustyline::Config::builder()
            .max_history_size(HISTORY_LINES)
            .context("history size")?
            .auto_add_history(false)
            .build();
        let mut editor: Editor<(), DefaultHistory> =
            Editor::with_config(config).context("cannot set up the line editor")?;
        // Alt+Enter (Esc then Enter on most terminals) inserts a new line.
        editor.bind_sequence(
            KeyEvent(KeyCode::Enter, Modifiers::ALT),
            EventHandler::Simple(Cmd::Newline),
        );
        if let Some(p) = &history {
            // A first session has no history file yet.
            let _ = editor.load_history(p);
        }
        Ok(Reader {
            source: Source::Editor {
                editor: Box::new(editor),
                history,
            },
        })
    }

    /// Reads one message or command: a line, or the lines of a `"""` block.
    ///
    /// # Errors
    /// Standard input cannot be read.
    pub fn read(&mut self) -> Result<Input> {
        let first = match self.line(PROMPT)? {
            Input::Text(t) => t,
            other => return Ok(other),
        };
        let Some(rest) = first.trim_start().strip_prefix(FENCE) else {
            self.remember(&first);
            return Ok(Input::Text(first));
        };
        let mut lines = vec![rest.to_string()];
        while !ends_block(&lines) {
            match self.line(MORE)? {
                Input::Text(t) | Input::Block(t) => lines.push(t),
                // Ctrl+C abandons the block; Ctrl+D ends it as it stands.
                Input::Interrupted => return Ok(Input::Interrupted),
                Input::End => break,
            }
        }
        let mut text = lines.join("\n");
        if let Some(t) = text.trim_end().strip_suffix(FENCE) {
            text = t.to_string();
        }
        let text = text.strip_prefix('\n').unwrap_or(&text);
        let text = text.strip_suffix('\n').unwrap_or(text).to_string();
        self.remember(&format!("{FENCE}{text}{FENCE}"));
        Ok(Input::Block(text))
    }

    fn line(&mut self, prompt: &str) -> Result<Input> {
        match &mut self.source {
            Source::Editor { editor, .. } => match editor.readline(prompt) {
                Ok(l) => Ok(Input::Text(l)),
                Err(ReadlineError::Interrupted) => Ok(Input::Interrupted),
                Err(ReadlineError::Eof) => Ok(Input::End),
                Err(e) => Err(e).context("reading the terminal"),
            },
            Source::Lines(stdin) => {
                eprint!("{prompt}");
                Ok(read_line_capped(stdin)?.map_or(Input::End, Input::Text))
            }
        }
    }

    /// Adds `entry` to the history (and its file) when there is one.
    fn remember(&mut self, entry: &str) {
        let Source::Editor { editor, history } = &mut self.source else {
            return;
        };
        if entry.trim().is_empty() || editor.add_history_entry(entry).is_err() {
            return;
        }
        if let Some(p) = history {
            if let Some(dir) = p.parent() {
                let _ = std::fs::create_dir_all(dir);
            }
            // History is a convenience: a read-only home does not stop the chat.
            let _ = editor.save_history(p);
        }
    }
}

/// Whether the block's lines so far close it: the last ends with `"""` (the first line
/// only when it holds more than the opening quotes' remainder).
fn ends_block(lines: &[String]) -> bool {
    lines.last().is_some_and(|l| l.trim_end().ends_with(FENCE))
}

/// Where the chat history lives: `$FRINK_HOME/chat_history` (default
/// `~/.cache/frink/chat_history`), beside the model store.
pub fn history_path() -> Option<PathBuf> {
    frink_store::home_file("chat_history")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_block_ends_at_closing_quotes() {
        let v = |s: &[&str]| s.iter().map(|x| x.to_string()).collect::<Vec<_>>();
        assert!(!ends_block(&v(&["first line"])));
        assert!(ends_block(&v(&["first", "last\"\"\"  "])));
        assert!(ends_block(&v(&["one line\"\"\""])));
    }
}
