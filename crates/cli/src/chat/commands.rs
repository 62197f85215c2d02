//! `frink chat`'s commands, as Ollama's prompt has them: `/help`, `/bye`, `/clear`,
//! `/set system …`, `/set parameter NAME VALUE`, `/set verbose|quiet`, `/show info|system|
//! parameters`, `/save FILE`, `/load FILE`, and `/image FILE` (llama-mtmd-cli's). Parsing
//! only; `super` carries them out.

use anyhow::{bail, Context, Result};
use frink_engine::sampling::SamplingParams;

/// One command line.
#[derive(Debug, PartialEq)]
pub enum Command {
    Help,
    Bye,
    Clear,
    /// `/set system TEXT` (empty: no system message).
    System(String),
    /// `/set parameter NAME VALUE`.
    Parameter(Parameter),
    /// `/set verbose` (true) or `/set quiet` (false): the timing line after each answer.
    Verbose(bool),
    ShowInfo,
    ShowSystem,
    ShowParameters,
    Save(String),
    Load(String),
    /// `/image FILE`: an image for the next message.
    Image(String),
}

/// A setting `/set parameter` changes, by Ollama's parameter names.
#[derive(Debug, PartialEq)]
pub enum Parameter {
    Temperature(f32),
    TopK(i32),
    TopP(f32),
    MinP(f32),
    RepeatPenalty(f32),
    RepeatLastN(usize),
    PresencePenalty(f32),
    FrequencyPenalty(f32),
    Seed(u64),
    /// `num_predict`: the most tokens per answer (-1: no limit).
    NumPredict(i64),
    /// `stop`: the stop strings (each word one string, as Ollama's `/set parameter stop`).
    Stop(Vec<String>),
}

/// What `/help` prints.
pub const HELP: &str = "\
Commands:
  /set system TEXT          set the system message (empty: none)
  /set parameter NAME VALUE set a sampling parameter: temperature, top_k, top_p, min_p,
                            repeat_penalty, repeat_last_n, presence_penalty,
                            frequency_penalty, seed, num_predict, stop
  /set verbose | quiet      show the timing line after each answer, or not
  /show info | system | parameters
  /clear                    forget the conversation (the system message stays)
  /save FILE | /load FILE   the conversation as JSON
  /image FILE               an image for the next message (with --mmproj)
  /bye                      leave (also Ctrl+D)
Ctrl+C stops an answer; Alt+Enter or \"\"\" … \"\"\" writes a message over several lines.";

/// The parameter names `/set parameter` takes.
const PARAMETERS: &str = "temperature, top_k, top_p, min_p, repeat_penalty, repeat_last_n, \
presence_penalty, frequency_penalty, seed, num_predict, stop";

/// Parses `line` as a command: `None` when it is a message (it does not start with `/`).
///
/// # Errors
/// An unknown command, a missing argument or a value that does not parse, naming it.
pub fn parse(line: &str) -> Result<Option<Command>> {
    let line = line.trim();
    let Some(rest) = line.strip_prefix('/') else {
        return Ok(None);
    };
    let (word, arg) = split_word(rest);
    let cmd = match word {
        "help" | "?" => Command::Help,
        "bye" | "exit" | "quit" => Command::Bye,
        "clear" => Command::Clear,
        "set" => set(arg)?,
        "show" => match arg {
            "info" => Command::ShowInfo,
            "system" => Command::ShowSystem,
            "parameters" => Command::ShowParameters,
            other => bail!("/show takes info, system or parameters, not `{other}`"),
        },
        "save" | "load" | "image" if arg.is_empty() => bail!("/{word} needs a file name"),
        "image" => Command::Image(arg.to_string()),
        "save" => Command::Save(arg.to_string()),
        "load" => Command::Load(arg.to_string()),
        other => bail!("unknown command /{other}; /help lists them"),
    };
    Ok(Some(cmd))
}

fn split_word(s: &str) -> (&str, &str) {
    let s = s.trim_start();
    match s.split_once(char::is_whitespace) {
        Some((w, rest)) => (w, rest.trim()),
        None => (s, ""),
    }
}

fn set(arg: &str) -> Result<Command> {
    let (what, rest) = split_word(arg);
    Ok(match what {
        "system" => Command::System(rest.to_string()),
        "verbose" => Command::Verbose(true),
        "quiet" => Command::Verbose(false),
        "parameter" => Command::Parameter(parameter(rest)?),
        other => bail!("/set takes system, parameter, verbose or quiet, not `{other}`"),
    })
}

fn parameter(arg: &str) -> Result<Parameter> {
    let (name, value) = split_word(arg);
    if name.is_empty() {
        bail!("/set parameter NAME VALUE: NAME is one of {PARAMETERS}");
    }
    if value.is_empty() {
        bail!("/set parameter {name}: no value given");
    }
    fn num<T: std::str::FromStr>(name: &str, v: &str) -> Result<T> {
        v.parse()
            .ok()
            .with_context(|| format!("/set parameter {name}: `{v}` is not a valid value"))
    }
    // A number that is not NaN or infinite.
    let real = |name: &str, v: &str| -> Result<f32> {
        let x: f32 = num(name, v)?;
        anyhow::ensure!(
            x.is_finite(),
            "/set parameter {name}: `{v}` is not a finite number"
        );
        Ok(x)
    };
    Ok(match name {
        "temperature" => Parameter::Temperature(real(name, value)?),
        "top_k" => Parameter::TopK(num(name, value)?),
        "top_p" => Parameter::TopP(real(name, value)?),
        "min_p" => Parameter::MinP(real(name, value)?),
        "repeat_penalty" => Parameter::RepeatPenalty(real(name, value)?),
        "repeat_last_n" => Parameter::RepeatLastN(num(name, value)?),
        "presence_penalty" => Parameter::PresencePenalty(real(name, value)?),
        "frequency_penalty" => Parameter::FrequencyPenalty(real(name, value)?),
        "seed" => Parameter::Seed(num(name, value)?),
        "num_predict" => match num::<i64>(name, value)? {
            n if n >= -1 => Parameter::NumPredict(n),
            n => bail!("/set parameter num_predict: {n} is below -1 (-1: no limit)"),
        },
        "stop" => Parameter::Stop(value.split_whitespace().map(str::to_string).collect()),
        "num_ctx" => bail!(
            "/set parameter num_ctx: the context is sized when the chat starts; restart with --ctx"
        ),
        other => bail!("/set parameter: unknown parameter `{other}`; one of {PARAMETERS}"),
    })
}

/// The settings an answer is sampled with, as `/set parameter` changes them.
#[derive(Clone, Debug)]
pub struct Settings {
    pub sampling: SamplingParams,
    /// `-n`/`num_predict` (-1: no limit).
    pub n_predict: i64,
    pub stop: Vec<String>,
    /// Print the timing line after each answer.
    pub verbose: bool,
}

impl Settings {
    /// Applies `p`.
    pub fn set(&mut self, p: Parameter) {
        let s = &mut self.sampling;
        match p {
            Parameter::Temperature(v) => s.temperature = v,
            Parameter::TopK(v) => s.top_k = v,
            Parameter::TopP(v) => s.top_p = v,
            Parameter::MinP(v) => s.min_p = v,
            Parameter::RepeatPenalty(v) => s.repeat_penalty = v,
            Parameter::RepeatLastN(v) => s.repeat_last_n = v,
            Parameter::PresencePenalty(v) => s.presence_penalty = v,
            Parameter::FrequencyPenalty(v) => s.frequency_penalty = v,
            Parameter::Seed(v) => s.seed = v,
            Parameter::NumPredict(v) => self.n_predict = v,
            Parameter::Stop(v) => self.stop = v,
        }
    }

    /// The most tokens of one answer (`None`: no limit but the context).
    pub fn max_tokens(&self) -> Option<usize> {
        crate::common::budget(self.n_predict)
    }

    /// `/show parameters`: one `name value` line each, Ollama's names.
    pub fn describe(&self) -> String {
        let s = &self.sampling;
        let mut out = format!(
            "temperature {}\ntop_k {}\ntop_p {}\nmin_p {}\nrepeat_penalty {}\nrepeat_last_n {}\n\
             presence_penalty {}\nfrequency_penalty {}\nseed {}\nnum_predict {}",
            s.temperature,
            s.top_k,
            s.top_p,
            s.min_p,
            s.repeat_penalty,
            s.repeat_last_n,
            s.presence_penalty,
            s.frequency_penalty,
            s.seed,
            self.n_predict
        );
        for stop in &self.stop {
            out.push_str(&format!("\nstop {stop:?}"));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commands_parse_and_messages_do_not() {
        assert_eq!(parse("hello /set").unwrap(), None);
        assert_eq!(parse("/bye").unwrap(), Some(Command::Bye));
        assert_eq!(parse(" /? ").unwrap(), Some(Command::Help));
        assert_eq!(
            parse("/set system You are terse.  ").unwrap(),
            Some(Command::System("You are terse.".into()))
        );
        assert_eq!(
            parse("/set parameter temperature 0.2").unwrap(),
            Some(Command::Parameter(Parameter::Temperature(0.2)))
        );
        assert_eq!(
            parse("/set parameter stop <|end|> ###").unwrap(),
            Some(Command::Parameter(Parameter::Stop(vec![
                "<|end|>".into(),
                "###".into()
            ])))
        );
        assert_eq!(
            parse("/save chat.json").unwrap(),
            Some(Command::Save("chat.json".into()))
        );
        for (bad, says) in [
            ("/wizard", "unknown command /wizard"),
            (
                "/set parameter temperature warm",
                "`warm` is not a valid value",
            ),
            ("/set parameter top_x 1", "unknown parameter `top_x`"),
            ("/set parameter num_predict -5", "-5 is below -1"),
            ("/set parameter num_ctx 8192", "restart with --ctx"),
            ("/load", "needs a file name"),
            ("/show everything", "not `everything`"),
        ] {
            let e = parse(bad).unwrap_err().to_string();
            assert!(e.contains(says), "{bad}: {e}");
        }
    }
}
