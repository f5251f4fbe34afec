//! The mock agent's command line: `mock-agent <scenario> [NAME...] [--flag VALUE | --flag=VALUE ...]`.
//!
//! Parsing is strict on purpose: an unknown scenario, an unknown flag, or a flag the chosen
//! scenario does not read is a usage error (the binary exits 64). A typo in a test's agent
//! command then fails loudly instead of silently running a different script.
//! Parsing is pure (no I/O), so it is unit-tested here.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

/// Exit status for usage errors (`EX_USAGE` from sysexits.h).
pub const USAGE_EXIT: i32 = 64;

/// Scenario names, in the order the usage message lists them.
pub const SCENARIOS: &str = "hello, text, thought, hang, ignore-cancel, crash-on-cancel, \
    crash-on-prompt, permission, permission-after-cancel, gated-session, gated-prompt, no-session-id, auth-required, garbage, \
    huge, grandchild, stubborn, flush-on-eof, term-marker, exit-before-init, silent, echo-cwd, \
    echo-env, fs-request, session-echo, echo-prompt, slow-stream, probe-fd, ancestor-environ, \
    escapee, permission-raw, foreign-session, echo-initialize, flood, bad-utf8, batch, configurable, answers";

/// Flags only some scenarios read; each scenario takes the ones it uses, leftovers are errors.
const SPECIFIC_FLAGS: &[&str] = &[
    "text",
    "stop",
    "chunks",
    "options",
    "go",
    "bytes",
    "count",
    "marker",
    "delay-ms",
    "code",
    "interval-ms",
    "fd",
    "tokens",
    "cost",
    "then",
    "stdout",
    "message",
    "options-json",
    "models",
    "answers-json",
    "answers-file",
];

/// The permission option kinds offered when `--options` is absent: all four, `allow_always`
/// first, because a host choosing by position (not by kind) is exactly the bug to catch.
pub const DEFAULT_PERMISSION_OPTIONS: &[&str] =
    &["allow_always", "allow_once", "reject_once", "reject_always"];

/// Default size of the `huge` scenario's single chunk: 8 MiB.
pub const DEFAULT_HUGE_BYTES: usize = 8 * 1024 * 1024;

/// The script the mock follows. Unless a variant says otherwise: `initialize` and
/// `session/new` are answered at once, `--ready` is touched when the prompt arrives, and stdin
/// EOF ends the process with status 0.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Scenario {
    /// Text "hello from acp child", `end_turn`.
    Hello,
    /// `text` split into `chunks` chunks (none when empty), then the stop reason `stop`, which
    /// may be any string, including ones ACP does not define.
    Text {
        text: String,
        stop: String,
        chunks: usize,
    },
    /// A thought, a tool call (+ update), a plan and a user-message chunk, then "final answer".
    Thought,
    /// Text "partial ", `--ready`, then waits; answers `session/cancel` with `cancelled`.
    Hang,
    /// Like `Hang` but never answers `session/cancel`.
    IgnoreCancel,
    /// Like `Hang` but exits with status 9 when `session/cancel` arrives.
    CrashOnCancel,
    /// Text "partial output", "mock: fatal error" on stderr, exit status 3.
    CrashOnPrompt,
    /// Asks `session/request_permission` with these option kinds (ids = kinds), in this order,
    /// `count` times one after the other (`--count`, default 1), then reports the answers as text
    /// (`selected <id>` / `cancelled`, one line each).
    Permission { options: Vec<String>, count: usize },
    /// `--ready` on prompt, waits for `session/cancel`, then asks permission and reports the
    /// outcome on stderr and in `--log`, then answers the prompt `cancelled`.
    PermissionAfterCancel,
    /// On `session/new`: touches `--ready`, answers only once `go` exists (or exits on EOF).
    GatedSession { go: PathBuf },
    /// On the prompt: text "waiting for go", `--ready`, then answers "released" (`end_turn`) only
    /// once `go` exists (or exits on EOF).
    GatedPrompt { go: PathBuf },
    /// Answers `session/new` with `{}` (no session id).
    NoSessionId,
    /// Answers `session/new` with ACP's `auth_required` error (-32000) and `message` (default
    /// "Authentication required").
    AuthRequired { message: String },
    /// Non-JSON lines on stdout before and between frames, otherwise `Hello`.
    Garbage,
    /// One text chunk of `bytes` bytes of `x`, `end_turn`.
    Huge { bytes: usize },
    /// Spawns `sleep 1000` in the mock's process group, writes ITS pid to `--pid-file`, then `Hang`.
    Grandchild,
    /// `Hello` (touching `--ready` after answering), but ignores stdin EOF and SIGTERM.
    Stubborn,
    /// `Hello`; on stdin EOF waits `delay`, creates `marker`, exits 0.
    FlushOnEof { marker: PathBuf, delay: Duration },
    /// `Hello`; ignores stdin EOF; on SIGTERM creates `marker` and exits 0.
    TermMarker { marker: PathBuf },
    /// "mock: cannot start" on stderr and exit `code` before reading anything.
    ExitBeforeInit { code: u8 },
    /// Reads everything, answers nothing.
    Silent,
    /// Text `"process: <getcwd>\nsession: <session/new cwd>"`.
    EchoCwd,
    /// One line per name: `NAME=value` or `NAME unset`.
    EchoEnv { names: Vec<String> },
    /// Sends `fs/read_text_file` and `terminal/create`, reports each error code (or result).
    FsRequest,
    /// Text `"session <the prompt's session id>"`.
    SessionEcho,
    /// The prompt's text blocks, joined by newlines, as the reply.
    EchoPrompt,
    /// `chunks` chunks "c1 ", "c2 ", ... `interval` apart (`--ready` after the first);
    /// answers `session/cancel` mid-stream with `cancelled`.
    SlowStream { chunks: usize, interval: Duration },
    /// Text `fd <n>: <what /proc/self/fd/<n> links to>` or `fd <n>: closed`, looked up at start
    /// (before our own runtime could reuse the number).
    ProbeFd { fd: u32 },
    /// One line per ancestor (parent first, up to but excluding pid 1): `<pid>: <its environ,
    /// NUL-separated entries as spaces>` or `<pid>: unreadable (<error>)`. What a same-user agent
    /// could learn from the processes above it.
    AncestorEnviron,
    /// Spawns two `sleep 1000` grandchildren: one in our process group, one that calls `setsid()`
    /// (through the `setsid` utility) and so leaves the group and the session; writes
    /// `<group pid> <setsid pid>` to `--pid-file`. Then `then` decides the turn.
    Escapee {
        then: EscapeeThen,
        hold_stdout: bool,
    },
    /// Asks `session/request_permission` offering exactly `options` (a JSON array, sent as is:
    /// unknown kinds, numeric ids, missing names), then reports the answer as text like
    /// `permission` (a non-string id as `selected json:<id>`).
    PermissionRaw { options: serde_json::Value },
    /// Before answering like `hello`, sends a message chunk "intruder " and a tool call for
    /// another session id (`other-session`).
    ForeignSession,
    /// Text: the `clientInfo` of the `initialize` request as JSON (`null` when absent).
    EchoInitialize,
    /// `chunks` chunks of `bytes` bytes each, as fast as the pipe takes them, then `end_turn`.
    /// Chunk `i` (from 0) is `i` in decimal, zero-padded to `bytes - 1` digits, then a newline
    /// ([`flood_chunk`]), so any tail of the output says exactly where it starts.
    Flood { chunks: usize, bytes: usize },
    /// A chunk `caf\xe9` (Latin-1, not UTF-8), then the prompt's answer with one invalid byte in
    /// an extra field: a client must decode both lossily, not drop them.
    BadUtf8,
    /// Sends a JSON-RPC batch array holding one `fs/read_text_file` request, waits for the
    /// client's answer to it, and reports the answer as text (`batch: <error code>`).
    Batch,
    /// A foreign agent with start-time options: `session/new` answers a select config option
    /// `llm` of category `model` offering `models` (the first current), `session/set_config_option`
    /// selects one (what it advertises comes from the common `--advertise`). The reply reports,
    /// one per line, `model <current>`, `systemPrompt <JSON>`, `meta <JSON>` (of `session/new`)
    /// and `prompt <text>`.
    Configurable { models: Vec<String> },
    /// Answers the n-th prompt of the session with the n-th of `answers` (the last one again
    /// after that), `{prompt}` in it replaced by the prompt's text, `end_turn`; an answer
    /// `{hang}` behaves like `hang` instead (the only time `--ready` is touched). When
    /// `session/new` asked for an `outputSchema` through the start extension, an answer that is
    /// JSON is returned in the prompt response's `_meta` (as `structured`), with the text
    /// "captured". `--answers-json JSON`, or `--answers-file FILE` holding that JSON (for
    /// answers larger than a command line takes).
    Answers { answers: Vec<String> },
    /// Reports usage as opencode does: text "counted", a `usage_update` with `used`, `size` and
    /// the session's cumulative `cost` (`--cost`, USD; no token counts), then the prompt answer
    /// with `usage` (`--tokens` in all: input 3/4 of it, output the rest, cached reads 10).
    OpencodeUsage { tokens: u64, cost: String },
}

/// Chunk `index` of the `flood` scenario.
#[must_use]
pub fn flood_chunk(index: usize, bytes: usize) -> String {
    let width = bytes.saturating_sub(1);
    let mut chunk = format!("{index:0width$}");
    chunk.truncate(width);
    chunk.push('\n');
    chunk
}

/// What the `escapee` scenario does with the prompt once its grandchildren run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EscapeeThen {
    /// Answer like `hello` (then exit on EOF).
    Answer,
    /// Exit with status 0 without answering.
    Exit,
    /// Like `hang`.
    Hang,
}

/// The common flags that take a value.
const COMMON_VALUE_FLAGS: [&str; 8] = [
    "log",
    "trace-log",
    "record",
    "ready",
    "pid-file",
    "stderr",
    "advertise",
    "write-file",
];

/// Flags every scenario accepts.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Common {
    /// `--log FILE`: one line per received message, appended and flushed at once.
    pub log: Option<PathBuf>,
    /// `--trace-log FILE`: `trace <method> <traceparent> [<tracestate>]` appended for each
    /// request whose `_meta` carries a W3C trace context.
    pub trace_log: Option<PathBuf>,
    /// `--record FILE`: `start <pid> <ns>` appended when the process starts and `end <pid> <ns>`
    /// when it exits on stdin EOF (`ns`: wall-clock nanoseconds since the Unix epoch, comparable
    /// across processes), so a test can tell how many agents ran at once.
    pub record: Option<PathBuf>,
    /// `--ready FILE`: touched when the scenario reaches its "ready" point (normally the prompt).
    pub ready: Option<PathBuf>,
    /// `--pid-file FILE`: the mock's pid (for `grandchild`: the grandchild's pid; for `escapee`:
    /// both grandchildren's).
    pub pid_file: Option<PathBuf>,
    /// `--stderr TEXT`: written to stderr at start.
    pub stderr: Option<String>,
    /// `--ignore-eof`: keep running after stdin closes (until a signal ends the process).
    pub ignore_eof: bool,
    /// `--ignore-cancel`: hang-like scenarios never answer `session/cancel`.
    pub ignore_cancel: bool,
    /// `--trap-term`: register a SIGTERM listener that does nothing, so only SIGKILL ends us.
    pub trap_term: bool,
    /// `--advertise LIST`: what `initialize` advertises ([`ADVERTISABLE`]); nothing by default.
    pub advertise: Vec<String>,
    /// `--write-file PATH=TEXT` (repeatable): on each prompt, before anything else, TEXT is
    /// written to PATH (relative to the mock's working directory): an agent that edits files.
    pub write_files: Vec<(PathBuf, String)>,
}

/// What `--advertise` takes: a session system prompt (`system-prompt`: append only, `override`:
/// both modes) and fields of acp-host's start extension (`tools`, `output-schema`, `max-depth`).
pub const ADVERTISABLE: &[&str] = &[
    "system-prompt",
    "override",
    "tools",
    "output-schema",
    "max-depth",
];

/// A parsed command line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    pub scenario: Scenario,
    pub common: Common,
}

/// Why a command line was rejected. Each message names the offending argument and what would
/// be accepted instead.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum UsageError {
    #[error("missing scenario: usage is `mock-agent <scenario> [flags]`; scenarios: {SCENARIOS}")]
    MissingScenario,
    #[error("unknown scenario {0:?}; known scenarios: {SCENARIOS}")]
    UnknownScenario(String),
    #[error(
        "unknown flag --{0}; common flags are --log, --trace-log, --record, --ready, --pid-file, --stderr, \
         --ignore-eof, --ignore-cancel, --trap-term, --advertise"
    )]
    UnknownFlag(String),
    #[error("flag --{0} needs a value (`--{0} VALUE` or `--{0}=VALUE`)")]
    MissingValue(String),
    #[error("flag --{0} takes no value")]
    UnexpectedValue(String),
    #[error("flag --{flag} does not apply to scenario {scenario}; remove it")]
    NotApplicable { flag: String, scenario: String },
    #[error("scenario {scenario} needs --{flag}")]
    MissingFlag { scenario: String, flag: String },
    #[error("invalid value {value:?} for --{flag}: expected {expected}")]
    InvalidValue {
        flag: String,
        value: String,
        expected: &'static str,
    },
    #[error("unexpected argument {arg:?}: scenario {scenario} takes no positional arguments")]
    UnexpectedPositional { scenario: String, arg: String },
    #[error("argument {0:?} is not valid UTF-8")]
    NotUtf8(String),
}

/// Parses the arguments after the program name.
pub fn parse<I>(args: I) -> Result<Config, UsageError>
where
    I: IntoIterator<Item = String>,
{
    let mut args = args.into_iter();
    let name = args.next().ok_or(UsageError::MissingScenario)?;
    let mut common = Common::default();
    let mut specific = Specific {
        scenario: name.clone(),
        values: BTreeMap::new(),
    };
    let mut positional = Vec::new();

    while let Some(arg) = args.next() {
        let Some(flag) = arg.strip_prefix("--") else {
            positional.push(arg);
            continue;
        };
        let (flag, inline) = match flag.split_once('=') {
            Some((flag, value)) => (flag, Some(value.to_owned())),
            None => (flag, None),
        };
        let switch = match flag {
            "ignore-eof" => Some(&mut common.ignore_eof),
            "ignore-cancel" => Some(&mut common.ignore_cancel),
            "trap-term" => Some(&mut common.trap_term),
            _ => None,
        };
        if let Some(switch) = switch {
            if inline.is_some() {
                return Err(UsageError::UnexpectedValue(flag.to_owned()));
            }
            *switch = true;
            continue;
        }
        let known = COMMON_VALUE_FLAGS.contains(&flag) || SPECIFIC_FLAGS.contains(&flag);
        if !known {
            return Err(UsageError::UnknownFlag(flag.to_owned()));
        }
        // The value is the next argument verbatim, even when it starts with `--`: a test may
        // well want the mock to print "--".
        let value = match inline {
            Some(value) => value,
            None => args
                .next()
                .ok_or_else(|| UsageError::MissingValue(flag.to_owned()))?,
        };
        match flag {
            "log" => common.log = Some(value.into()),
            "trace-log" => common.trace_log = Some(value.into()),
            "record" => common.record = Some(value.into()),
            "ready" => common.ready = Some(value.into()),
            "pid-file" => common.pid_file = Some(value.into()),
            "stderr" => common.stderr = Some(value),
            "write-file" => {
                let (path, text) =
                    value
                        .split_once('=')
                        .ok_or_else(|| UsageError::InvalidValue {
                            flag: "write-file".to_owned(),
                            value: value.clone(),
                            expected: "PATH=TEXT",
                        })?;
                common.write_files.push((path.into(), text.to_owned()));
            }
            "advertise" => {
                let list: Vec<String> = value
                    .split(',')
                    .map(str::trim)
                    .filter(|v| !v.is_empty())
                    .map(str::to_owned)
                    .collect();
                if let Some(bad) = list.iter().find(|a| !ADVERTISABLE.contains(&a.as_str())) {
                    return Err(UsageError::InvalidValue {
                        flag: "advertise".to_owned(),
                        value: bad.clone(),
                        expected: "a list of system-prompt, override, tools, output-schema, \
                                   max-depth",
                    });
                }
                common.advertise = list;
            }
            _ => {
                specific.values.insert(flag.to_owned(), value);
            }
        }
    }

    let scenario = scenario(&name, &mut specific, &common, &mut positional)?;
    if let Some(arg) = positional.into_iter().next() {
        return Err(UsageError::UnexpectedPositional {
            scenario: name,
            arg,
        });
    }
    if let Some(flag) = specific.values.into_keys().next() {
        return Err(UsageError::NotApplicable {
            flag,
            scenario: name,
        });
    }
    Ok(Config { scenario, common })
}

/// Builds the scenario, taking the scenario-specific flags (and positionals) it reads.
fn scenario(
    name: &str,
    s: &mut Specific,
    common: &Common,
    positional: &mut Vec<String>,
) -> Result<Scenario, UsageError> {
    Ok(match name {
        "hello" => Scenario::Hello,
        "text" => Scenario::Text {
            text: s.take("text").unwrap_or_default(),
            stop: s.take("stop").unwrap_or_else(|| "end_turn".to_owned()),
            chunks: s.positive("chunks")?.unwrap_or(1),
        },
        "thought" => Scenario::Thought,
        "hang" => Scenario::Hang,
        "ignore-cancel" => Scenario::IgnoreCancel,
        "crash-on-cancel" => Scenario::CrashOnCancel,
        "crash-on-prompt" => Scenario::CrashOnPrompt,
        "permission" => Scenario::Permission {
            options: s.take("options").map_or_else(
                || {
                    DEFAULT_PERMISSION_OPTIONS
                        .iter()
                        .map(|kind| (*kind).to_owned())
                        .collect()
                },
                |list| {
                    list.split(',')
                        .map(str::trim)
                        .filter(|kind| !kind.is_empty())
                        .map(str::to_owned)
                        .collect()
                },
            ),
            count: s.number("count")?.unwrap_or(1),
        },
        "permission-after-cancel" => Scenario::PermissionAfterCancel,
        "gated-session" => {
            if common.ready.is_none() {
                return Err(s.missing("ready"));
            }
            Scenario::GatedSession {
                go: s.take("go").ok_or_else(|| s.missing("go"))?.into(),
            }
        }
        "gated-prompt" => Scenario::GatedPrompt {
            go: s.take("go").ok_or_else(|| s.missing("go"))?.into(),
        },
        "no-session-id" => Scenario::NoSessionId,
        "auth-required" => Scenario::AuthRequired {
            message: s
                .take("message")
                .unwrap_or_else(|| "Authentication required".to_owned()),
        },
        "permission-raw" => permission_raw(s)?,
        "foreign-session" => Scenario::ForeignSession,
        "echo-initialize" => Scenario::EchoInitialize,
        "garbage" => Scenario::Garbage,
        "huge" => Scenario::Huge {
            bytes: s.number("bytes")?.unwrap_or(DEFAULT_HUGE_BYTES),
        },
        "grandchild" => {
            if common.pid_file.is_none() {
                return Err(s.missing("pid-file"));
            }
            Scenario::Grandchild
        }
        "stubborn" => Scenario::Stubborn,
        "flush-on-eof" => Scenario::FlushOnEof {
            marker: s.take("marker").ok_or_else(|| s.missing("marker"))?.into(),
            delay: Duration::from_millis(s.number("delay-ms")?.unwrap_or(0)),
        },
        "term-marker" => Scenario::TermMarker {
            marker: s.take("marker").ok_or_else(|| s.missing("marker"))?.into(),
        },
        "exit-before-init" => Scenario::ExitBeforeInit {
            code: s.number("code")?.unwrap_or(7),
        },
        "silent" => Scenario::Silent,
        "echo-cwd" => Scenario::EchoCwd,
        "echo-env" => Scenario::EchoEnv {
            names: std::mem::take(positional),
        },
        "fs-request" => Scenario::FsRequest,
        "session-echo" => Scenario::SessionEcho,
        "echo-prompt" => Scenario::EchoPrompt,
        "slow-stream" => Scenario::SlowStream {
            chunks: s.positive("chunks")?.unwrap_or(5),
            interval: Duration::from_millis(s.number("interval-ms")?.unwrap_or(100)),
        },
        "opencode-usage" => opencode_usage(s)?,
        "probe-fd" => Scenario::ProbeFd {
            fd: s.number("fd")?.ok_or_else(|| s.missing("fd"))?,
        },
        "ancestor-environ" => Scenario::AncestorEnviron,
        "escapee" => escapee(s, common)?,
        "flood" => Scenario::Flood {
            chunks: s.positive("chunks")?.unwrap_or(1000),
            bytes: s.positive("bytes")?.unwrap_or(1024),
        },
        "bad-utf8" => Scenario::BadUtf8,
        "configurable" => configurable(s),
        "batch" => Scenario::Batch,
        "answers" => answers(s)?,
        other => return Err(UsageError::UnknownScenario(other.to_owned())),
    })
}

fn opencode_usage(s: &mut Specific) -> Result<Scenario, UsageError> {
    Ok(Scenario::OpencodeUsage {
        tokens: s.number("tokens")?.unwrap_or(1000),
        // Kept as given (the scenario enum compares whole), checked to be an amount.
        cost: match s.take("cost") {
            Some(value) if value.parse::<f64>().is_ok_and(f64::is_finite) => value,
            Some(value) => {
                return Err(UsageError::InvalidValue {
                    flag: "cost".to_owned(),
                    value,
                    expected: "an amount",
                });
            }
            None => "0.01".to_owned(),
        },
    })
}

fn escapee(s: &mut Specific, common: &Common) -> Result<Scenario, UsageError> {
    if common.pid_file.is_none() {
        return Err(s.missing("pid-file"));
    }
    let then = match s.take("then").as_deref() {
        None | Some("answer") => EscapeeThen::Answer,
        Some("exit") => EscapeeThen::Exit,
        Some("hang") => EscapeeThen::Hang,
        Some(other) => {
            return Err(Specific::invalid("then", other, "answer, exit or hang"));
        }
    };
    let hold_stdout = match s.take("stdout").as_deref() {
        None | Some("null") => false,
        Some("hold") => true,
        Some(other) => return Err(Specific::invalid("stdout", other, "hold or null")),
    };
    Ok(Scenario::Escapee { then, hold_stdout })
}

fn answers(s: &mut Specific) -> Result<Scenario, UsageError> {
    let json = match (s.take("answers-json"), s.take("answers-file")) {
        (Some(json), None) => json,
        (None, Some(file)) => std::fs::read_to_string(&file)
            .map_err(|_| Specific::invalid("answers-file", &file, "a readable file"))?,
        _ => return Err(s.missing("answers-json")),
    };
    let answers: Vec<String> = serde_json::from_str(&json)
        .ok()
        .filter(|answers: &Vec<String>| !answers.is_empty())
        .ok_or_else(|| {
            Specific::invalid("answers-json", &json, "a non-empty JSON array of strings")
        })?;
    Ok(Scenario::Answers { answers })
}

fn configurable(s: &mut Specific) -> Scenario {
    let list = |value: String| -> Vec<String> {
        value
            .split(',')
            .map(str::trim)
            .filter(|v| !v.is_empty())
            .map(str::to_owned)
            .collect()
    };
    Scenario::Configurable {
        models: list(
            s.take("models")
                .unwrap_or_else(|| "mock-small,mock-large".to_owned()),
        ),
    }
}

fn permission_raw(s: &mut Specific) -> Result<Scenario, UsageError> {
    let json = s
        .take("options-json")
        .ok_or_else(|| s.missing("options-json"))?;
    let options = serde_json::from_str(&json)
        .ok()
        .filter(serde_json::Value::is_array)
        .ok_or_else(|| Specific::invalid("options-json", &json, "a JSON array"))?;
    Ok(Scenario::PermissionRaw { options })
}

/// The scenario-specific flag values not yet taken by the scenario.
struct Specific {
    scenario: String,
    values: BTreeMap<String, String>,
}

impl Specific {
    fn take(&mut self, flag: &str) -> Option<String> {
        self.values.remove(flag)
    }

    fn missing(&self, flag: &str) -> UsageError {
        UsageError::MissingFlag {
            scenario: self.scenario.clone(),
            flag: flag.to_owned(),
        }
    }

    fn invalid(flag: &str, value: &str, expected: &'static str) -> UsageError {
        UsageError::InvalidValue {
            flag: flag.to_owned(),
            value: value.to_owned(),
            expected,
        }
    }

    fn number<T: std::str::FromStr>(&mut self, flag: &str) -> Result<Option<T>, UsageError> {
        self.take(flag)
            .map(|value| {
                value.parse().map_err(|_| UsageError::InvalidValue {
                    flag: flag.to_owned(),
                    value,
                    expected: "a non-negative integer in range",
                })
            })
            .transpose()
    }

    fn positive(&mut self, flag: &str) -> Result<Option<usize>, UsageError> {
        match self.number::<usize>(flag)? {
            Some(0) => Err(UsageError::InvalidValue {
                flag: flag.to_owned(),
                value: "0".to_owned(),
                expected: "a positive integer",
            }),
            other => Ok(other),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_str(line: &str) -> Result<Config, UsageError> {
        parse(line.split(' ').map(str::to_owned))
    }

    #[test]
    fn text_takes_any_stop_reason_and_chunk_count() {
        let config = parse_str("text --text hi --stop galaxy_brain --chunks=3").unwrap();
        assert_eq!(
            config.scenario,
            Scenario::Text {
                text: "hi".into(),
                stop: "galaxy_brain".into(),
                chunks: 3
            }
        );
    }

    #[test]
    fn common_flags_follow_the_scenario_in_any_order() {
        let config = parse_str("--log l hang --ready r --ignore-eof --ignore-cancel");
        // The scenario is the first argument, so a leading flag is not a scenario name.
        assert_eq!(config, Err(UsageError::UnknownScenario("--log".into())));
        let config =
            parse_str("hang --log l --ready r --ignore-eof --record=rec --trap-term").unwrap();
        assert_eq!(config.scenario, Scenario::Hang);
        assert_eq!(
            config.common,
            Common {
                log: Some("l".into()),
                record: Some("rec".into()),
                ready: Some("r".into()),
                ignore_eof: true,
                trap_term: true,
                ..Common::default()
            }
        );
    }

    #[test]
    fn flag_values_may_start_with_dashes() {
        let config = parse_str("text --text --").unwrap();
        assert!(matches!(config.scenario, Scenario::Text { text, .. } if text == "--"));
    }

    #[test]
    fn permission_options_keep_order_and_default_to_all_four() {
        let config = parse_str("permission --options reject_once,allow_once").unwrap();
        assert_eq!(
            config.scenario,
            Scenario::Permission {
                options: vec!["reject_once".into(), "allow_once".into()],
                count: 1,
            }
        );
        let config = parse_str("permission").unwrap();
        assert_eq!(
            config.scenario,
            Scenario::Permission {
                options: DEFAULT_PERMISSION_OPTIONS
                    .iter()
                    .map(|k| (*k).to_owned())
                    .collect(),
                count: 1,
            }
        );
    }

    #[test]
    fn echo_env_takes_names_other_scenarios_reject_positionals() {
        let config = parse_str("echo-env A B").unwrap();
        assert_eq!(
            config.scenario,
            Scenario::EchoEnv {
                names: vec!["A".into(), "B".into()]
            }
        );
        assert_eq!(
            parse_str("hello extra"),
            Err(UsageError::UnexpectedPositional {
                scenario: "hello".into(),
                arg: "extra".into()
            })
        );
    }

    #[test]
    fn usage_errors_are_specific() {
        assert_eq!(
            parse(Vec::<String>::new()),
            Err(UsageError::MissingScenario)
        );
        assert_eq!(
            parse_str("nope"),
            Err(UsageError::UnknownScenario("nope".into()))
        );
        assert_eq!(
            parse_str("hello --bogus"),
            Err(UsageError::UnknownFlag("bogus".into()))
        );
        assert_eq!(
            parse_str("hello --bytes 3"),
            Err(UsageError::NotApplicable {
                flag: "bytes".into(),
                scenario: "hello".into()
            })
        );
        assert_eq!(
            parse_str("hello --log"),
            Err(UsageError::MissingValue("log".into()))
        );
        assert_eq!(
            parse_str("hello --ignore-eof=yes"),
            Err(UsageError::UnexpectedValue("ignore-eof".into()))
        );
        assert_eq!(
            parse_str("gated-session --go g"),
            Err(UsageError::MissingFlag {
                scenario: "gated-session".into(),
                flag: "ready".into()
            })
        );
        assert!(matches!(
            parse_str("text --chunks 0"),
            Err(UsageError::InvalidValue { .. })
        ));
        assert!(matches!(
            parse_str("exit-before-init --code 300"),
            Err(UsageError::InvalidValue { .. })
        ));
    }

    #[test]
    fn escapee_modes_parse_and_bad_ones_are_named() {
        assert_eq!(
            parse_str("escapee --pid-file p --then exit --stdout hold")
                .unwrap()
                .scenario,
            Scenario::Escapee {
                then: EscapeeThen::Exit,
                hold_stdout: true
            }
        );
        assert!(matches!(
            parse_str("escapee --pid-file p --then later"),
            Err(UsageError::InvalidValue { .. })
        ));
        assert!(matches!(
            parse_str("escapee"),
            Err(UsageError::MissingFlag { .. })
        ));
        assert_eq!(
            parse_str("probe-fd --fd 7").unwrap().scenario,
            Scenario::ProbeFd { fd: 7 }
        );
    }

    #[test]
    fn defaults() {
        assert_eq!(
            parse_str("huge").unwrap().scenario,
            Scenario::Huge {
                bytes: DEFAULT_HUGE_BYTES
            }
        );
        assert_eq!(
            parse_str("exit-before-init").unwrap().scenario,
            Scenario::ExitBeforeInit { code: 7 }
        );
        assert_eq!(
            parse_str("flush-on-eof --marker m").unwrap().scenario,
            Scenario::FlushOnEof {
                marker: "m".into(),
                delay: Duration::ZERO
            }
        );
    }
}
