//! The offline backend's slash commands (`/read`, `/write`, `/sleep`, `/delegate`).
//!
//! Pure and synchronous: a prompt's text goes in, a [`Parsed`] value comes out. Every place that
//! names the commands to a user (the offline reply, the unknown-command reply, `--help`) uses
//! [`COMMANDS_SUMMARY`] or [`COMMANDS_HELP`], so the list has one home.
//!
//! Grammar (after leading whitespace is skipped):
//! - text that does not start with `/` is a plain prompt;
//! - `/read PATH`;
//! - `/write PATH TEXT`: `PATH` is one whitespace-free token, `TEXT` is everything after the
//!   whitespace that follows it, kept verbatim (inner newlines included);
//! - `/sleep SECONDS`: a whole number from 0 to [`MAX_SLEEP_SECS`];
//! - `/delegate NAME PROMPT`: `NAME` is one token, `PROMPT` the rest, verbatim.

use thiserror::Error;

use crate::backend::CommandHelp;

/// One line naming every offline command, for replies.
pub(crate) const COMMANDS_SUMMARY: &str =
    "/read PATH, /write PATH TEXT, /sleep SECONDS, /delegate NAME PROMPT";

/// Every offline command, in the order the offline reply names them.
pub const COMMANDS_HELP: &[CommandHelp] = &[
    CommandHelp {
        name: "read",
        input: "PATH",
        description: "show a file inside the session directory",
    },
    CommandHelp {
        name: "write",
        input: "PATH TEXT",
        description: "write TEXT to a file inside the session directory, after asking permission",
    },
    CommandHelp {
        name: "sleep",
        input: "SECONDS",
        description: "wait SECONDS (0 to 3600); session/cancel stops the wait",
    },
    CommandHelp {
        name: "delegate",
        input: "NAME PROMPT",
        description: "run subagent NAME on PROMPT in its own process (see --subagent-agents)",
    },
];

/// The longest `/sleep` accepted: long enough to test cancellation, short enough that a typo can't
/// park a session for days.
pub(crate) const MAX_SLEEP_SECS: u64 = 3600;

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Parsed {
    /// Free-form text for a model.
    Text(String),
    Command(Command),
}

/// A well-formed offline command.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Command {
    Read { path: String },
    Write { path: String, text: String },
    Sleep { secs: u64 },
    Delegate { name: String, prompt: String },
}

/// Why a `/...` prompt is not a command; the `Display` text is the reply shown to the user.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub(crate) enum ParseError {
    #[error("unknown command /{name}. Offline commands: {COMMANDS_SUMMARY}.")]
    Unknown { name: String },
    #[error("usage: /{command} {usage} ({reason})")]
    Usage {
        command: &'static str,
        usage: &'static str,
        reason: String,
    },
}

/// Classifies a prompt's text.
pub(crate) fn parse(prompt: &str) -> Result<Parsed, ParseError> {
    let trimmed = prompt.trim_start();
    let Some(body) = trimmed.strip_prefix('/') else {
        return Ok(Parsed::Text(prompt.to_owned()));
    };
    let (name, rest) = split_token(body);
    let command = match name {
        "read" => {
            let (path, extra) = split_token(rest);
            if path.is_empty() {
                return Err(usage("read", "PATH", "missing PATH"));
            }
            if !extra.trim().is_empty() {
                return Err(usage(
                    "read",
                    "PATH",
                    "PATH is one word; paths with spaces are not supported",
                ));
            }
            Command::Read {
                path: path.to_owned(),
            }
        }
        "write" => {
            let (path, text) = split_token(rest);
            if path.is_empty() {
                return Err(usage("write", "PATH TEXT", "missing PATH and TEXT"));
            }
            if text.is_empty() {
                return Err(usage("write", "PATH TEXT", "missing TEXT"));
            }
            Command::Write {
                path: path.to_owned(),
                text: text.to_owned(),
            }
        }
        "sleep" => {
            let (secs, extra) = split_token(rest);
            let reason = || format!("SECONDS must be a whole number from 0 to {MAX_SLEEP_SECS}");
            if !extra.trim().is_empty() {
                return Err(usage("sleep", "SECONDS", &reason()));
            }
            match secs.parse::<u64>() {
                Ok(secs) if secs <= MAX_SLEEP_SECS => Command::Sleep { secs },
                _ => return Err(usage("sleep", "SECONDS", &reason())),
            }
        }
        "delegate" => {
            let (name, prompt) = split_token(rest);
            if name.is_empty() {
                return Err(usage("delegate", "NAME PROMPT", "missing NAME and PROMPT"));
            }
            if prompt.trim().is_empty() {
                return Err(usage("delegate", "NAME PROMPT", "missing PROMPT"));
            }
            Command::Delegate {
                name: name.to_owned(),
                prompt: prompt.to_owned(),
            }
        }
        other => {
            return Err(ParseError::Unknown {
                name: other.to_owned(),
            });
        }
    };
    Ok(Parsed::Command(command))
}

fn usage(command: &'static str, usage: &'static str, reason: &str) -> ParseError {
    ParseError::Usage {
        command,
        usage,
        reason: reason.to_owned(),
    }
}

/// Splits off the first whitespace-delimited token; the rest starts after the whitespace run that
/// ends the token, so `/write` text keeps its own inner and trailing whitespace.
fn split_token(input: &str) -> (&str, &str) {
    let input = input.trim_start();
    match input.find(char::is_whitespace) {
        Some(end) => (&input[..end], input[end..].trim_start()),
        None => (input, ""),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn command(prompt: &str) -> Command {
        match parse(prompt) {
            Ok(Parsed::Command(command)) => command,
            other => panic!("expected a command for {prompt:?}, got {other:?}"),
        }
    }

    #[test]
    fn plain_text_is_kept_verbatim() {
        assert_eq!(parse("hello"), Ok(Parsed::Text("hello".into())));
        assert_eq!(
            parse("  what is a /read?  "),
            Ok(Parsed::Text("  what is a /read?  ".into()))
        );
    }

    #[test]
    fn read_takes_one_path() {
        assert_eq!(
            command("/read src/main.rs"),
            Command::Read {
                path: "src/main.rs".into()
            }
        );
        assert_eq!(
            command("  /read   a.txt \n"),
            Command::Read {
                path: "a.txt".into()
            }
        );
        assert!(matches!(
            parse("/read"),
            Err(ParseError::Usage {
                command: "read",
                ..
            })
        ));
        assert!(matches!(
            parse("/read a b"),
            Err(ParseError::Usage {
                command: "read",
                ..
            })
        ));
    }

    #[test]
    fn write_keeps_text_verbatim() {
        assert_eq!(
            command("/write notes.md hello  world\nline 2\n"),
            Command::Write {
                path: "notes.md".into(),
                text: "hello  world\nline 2\n".into()
            }
        );
        assert_eq!(
            parse("/write notes.md").unwrap_err().to_string(),
            "usage: /write PATH TEXT (missing TEXT)"
        );
        assert!(matches!(
            parse("/write"),
            Err(ParseError::Usage {
                command: "write",
                ..
            })
        ));
    }

    #[test]
    fn sleep_takes_bounded_whole_seconds() {
        assert_eq!(command("/sleep 30"), Command::Sleep { secs: 30 });
        assert_eq!(command("/sleep 0"), Command::Sleep { secs: 0 });
        assert_eq!(command("/sleep 3600"), Command::Sleep { secs: 3600 });
        for bad in [
            "/sleep",
            "/sleep -1",
            "/sleep 1.5",
            "/sleep 3601",
            "/sleep x",
            "/sleep 1 2",
        ] {
            assert_eq!(
                parse(bad).unwrap_err().to_string(),
                "usage: /sleep SECONDS (SECONDS must be a whole number from 0 to 3600)",
                "{bad}"
            );
        }
    }

    #[test]
    fn delegate_takes_a_name_and_the_rest_as_prompt() {
        assert_eq!(
            command("/delegate acp-child /write a.txt two  words\n"),
            Command::Delegate {
                name: "acp-child".into(),
                prompt: "/write a.txt two  words\n".into()
            }
        );
        assert_eq!(
            parse("/delegate acp-child").unwrap_err().to_string(),
            "usage: /delegate NAME PROMPT (missing PROMPT)"
        );
    }

    #[test]
    fn help_and_summary_agree() {
        let from_help: Vec<String> = COMMANDS_HELP
            .iter()
            .map(|help| format!("/{} {}", help.name, help.input))
            .collect();
        assert_eq!(from_help.join(", "), COMMANDS_SUMMARY);
    }

    #[test]
    fn unknown_command_lists_the_commands() {
        assert_eq!(
            parse("/frobnicate now").unwrap_err().to_string(),
            "unknown command /frobnicate. Offline commands: /read PATH, /write PATH TEXT, /sleep SECONDS, /delegate NAME PROMPT."
        );
        assert_eq!(
            parse("/").unwrap_err(),
            ParseError::Unknown {
                name: String::new()
            }
        );
    }
}
