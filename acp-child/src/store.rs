//! Session persistence: one JSONL file per session under the state directory.
//!
//! File `<dir>/<session-id>.jsonl`: the first line is a [`Record::Session`] header (the session's
//! directory), then one [`Record`] per conversation step, appended as the turn goes (a user prompt,
//! an assistant message with its tool calls, a tool result, a background task's completion notice).
//! Loading reads them back in order.
//! Between them, a `{"type": "settings", ...}` line ([`SavedSettings`]) is appended whenever the
//! session's settings change (at `session/new`, on `session/set_config_option`); the last one is
//! the session's settings when it is loaded. It is not part of the conversation.
//! A `{"type": "turn_end"}` line is appended when a prompt turn ends (however it ended): the
//! records before the last one are the session's completed turns, what `session/fork` copies
//! ([`Saved::completed`]); it is not part of the conversation either.
//!
//! Forking reads a session without opening it ([`Store::snapshot`]): read-only, without its lock
//! (it may be open, mid-turn, in another acp-child: the parent of a forked child), never written.
//!
//! Invariants: a session id becomes a file name only after [`check_id`] (letters, digits, `-`, `_`;
//! no path separators, so a client cannot name a file outside the directory); records are only ever
//! appended, one complete line per write, so a crash loses at most the line being written and a
//! torn last line is skipped on load (with a warning) rather than making the session unloadable,
//! wherever it was cut (inside a multi-byte character too: a line that is not UTF-8 is skipped like
//! any unreadable one). Loading a file whose last line is torn ends it with a newline first, so the
//! next record starts a line of its own.
//!
//! Versions: the header and each child record carry a `version` (absent: 1, read as version 1:
//! files from before the field). A session file whose header is newer than
//! [`SESSION_VERSION`] is refused, naming both; a child record newer than [`CHILD_VERSION`], or
//! one that does not read as a child record (a missing `id`), is kept as an unusable child with
//! why ([`Saved::unusable_children`]), never dropped silently.
//!
//! One writer per session: a session file is opened ([`Store::create`], [`Store::load`]) into a
//! [`SessionFile`] that holds an exclusive lock on it (`flock`, which dies with the process, or
//! with the handle) for as long as the session is open, and every append goes through it. A
//! second open of a session open elsewhere (another acp-child, or another session of this one) is
//! refused at once ([`StoreError::Busy`]), never waited for. Only a regular file is a session
//! file: a FIFO, a device, a directory or a symlink (a link could lead out of the state directory)
//! is refused at once, without blocking (the file is opened non-blocking, not following links).

use std::fs::File;
use std::io::{self, Read as _, Write as _};
use std::os::unix::fs::{FileTypeExt as _, OpenOptionsExt as _};
use std::path::{Path, PathBuf};
use std::sync::{Mutex, PoisonError};

use nix::fcntl::OFlag;

use protocol::capabilities::ToolFilter;
use serde::{Deserialize, Serialize};
use thiserror::Error;

/// The version of the session header written.
pub(crate) const SESSION_VERSION: u32 = 2;

/// The version of the child records written.
pub(crate) const CHILD_VERSION: u32 = 2;

/// What a record without a `version` is: written before versions.
const fn unversioned() -> u32 {
    1
}

/// A child as saved in its parent's session file: one each time a run of it ends. Its first
/// record is its descriptor (id, subagent, creation label); later ones change only how it stands
/// (`backend::children::table` checks they agree).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct ChildRecord {
    #[serde(default = "unversioned")]
    pub(crate) version: u32,
    pub(crate) id: String,
    /// The subagent's name (a registry agent or a definition).
    pub(crate) agent: String,
    /// The task it was created with (its label: the call's description, else its prompt's first
    /// line); absent in records of version 1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) label: Option<String>,
    /// The ACP session id its agent reported, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) session: Option<String>,
    /// Whether its agent advertises `loadSession` (absent: not known, as in version 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) resumable: Option<bool>,
    /// Whether its last run failed.
    #[serde(default)]
    pub(crate) failed: bool,
    /// It started from a fork of this session's conversation (`context: fork`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub(crate) forked: bool,
    /// It worked in a git worktree of its own (`isolation: worktree`), settled when its run
    /// ended: it cannot be continued.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub(crate) isolated: bool,
}

/// One line of a session file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub(crate) enum Record {
    /// The header: the file's version and where the session works.
    Session {
        #[serde(default = "unversioned")]
        version: u32,
        cwd: PathBuf,
    },
    /// A prompt from the user.
    User { text: String },
    /// A reply from the model: its text and the tools it called.
    Assistant {
        text: String,
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        tool_calls: Vec<RecordedCall>,
    },
    /// The result of one tool call, as returned to the model.
    Tool {
        call_id: String,
        content: String,
        #[serde(default)]
        failed: bool,
    },
    /// What the agent told the model between requests: a background task's completion notice.
    /// Sent as the result of a `task_output` call of `task` that the agent makes up (never as a
    /// user message: it quotes a child's output), never replayed to the client. A notice without
    /// `task` was saved before notices were tool results; its `text` (the child's output
    /// unquoted) is quoted when sent (`tasks::saved_notice`).
    Notice {
        text: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        task: Option<String>,
    },
    /// A delegated child of this session (kept out of the conversation when loaded).
    Child(ChildRecord),
}

/// What a session was set up with, as saved: the `session/new` choices (system prompt, tool
/// filter, output schema, depth limit) and the model selected since.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct SavedSettings {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) model: Option<String>,
    /// The system prompt's template text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) persona: Option<String>,
    /// Whether the system prompt replaces the agent's own (`override`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub(crate) persona_replaces: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) tools: Option<ToolFilter>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) output_schema: Option<serde_json::Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) max_depth: Option<u32>,
}

/// The settings line's `type`.
const SETTINGS_TYPE: &str = "settings";

/// The turn-end line's `type`.
const TURN_END_TYPE: &str = "turn_end";

/// A child record's `type`.
const CHILD_TYPE: &str = "child";

/// A tool call the model made.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct RecordedCall {
    /// The call id, shared by the model's message, the ACP tool call and the tool result.
    pub(crate) id: String,
    /// The tool's name (`read_file`, ...).
    pub(crate) name: String,
    /// The arguments, as the JSON text the model sent.
    pub(crate) arguments: String,
}

/// A session file could not be used.
#[derive(Debug, Error)]
pub(crate) enum StoreError {
    #[error(
        "invalid session id {id:?}: session ids are letters, digits, '-' and '_' (as returned by session/new)"
    )]
    BadId { id: String },
    #[error("unknown session {id}: no saved session in {}; create one with session/new", dir.display())]
    NotFound { id: String, dir: PathBuf },
    #[error("cannot {action} session file {}; check the state directory (--state-dir / ACP_CHILD_STATE_DIR)", path.display())]
    Io {
        action: &'static str,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("session file {} does not start with a session header; it is not an acp-child session", path.display())]
    NoHeader { path: PathBuf },
    #[error(
        "session busy: session {id} is open elsewhere (another acp-child, or another session of this one); one writer per session: wait until it ends"
    )]
    Busy { id: String },
    #[error("session file {} is {kind}, not a regular file; acp-child reads only regular files of its state directory", path.display())]
    NotAFile { path: PathBuf, kind: &'static str },
    #[error("session file {} is of version {version}, newer than this acp-child reads ({SESSION_VERSION}); load it with a newer acp-child", path.display())]
    Newer { path: PathBuf, version: u32 },
}

/// A loaded session: where it works and what was said.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Saved {
    /// The session directory recorded at session/new.
    pub(crate) cwd: PathBuf,
    /// The conversation, in order (without the header).
    pub(crate) history: Vec<Record>,
    /// The last settings saved, if any.
    pub(crate) settings: Option<SavedSettings>,
    /// How many records of `history` were saved before the last turn-end line; `None` when the
    /// file has none (saved before turn ends were marked).
    pub(crate) turns_end: Option<usize>,
    /// Child records that cannot be used, each with its line and why.
    pub(crate) unusable_children: Vec<String>,
}

impl Saved {
    /// The conversation as of its last completed turn: what a fork starts from. A turn still in
    /// flight (or cut off by a crash) is left out; so are the session's children, which stay
    /// its own. A file saved before turn ends were marked counts every turn as complete but a
    /// last one whose tool calls are unanswered (in flight, or torn).
    pub(crate) fn completed(&self) -> Vec<Record> {
        let end = self
            .turns_end
            .unwrap_or_else(|| answered_prefix(&self.history));
        self.history[..end.min(self.history.len())]
            .iter()
            .filter(|record| !matches!(record, Record::Child(_)))
            .cloned()
            .collect()
    }
}

/// The records before the last turn (from its user prompt on) when that turn has a tool call
/// without a result; all of them otherwise.
fn answered_prefix(history: &[Record]) -> usize {
    let start = history
        .iter()
        .rposition(|record| matches!(record, Record::User { .. }))
        .unwrap_or(0);
    let turn = &history[start..];
    let answered = |id: &str| {
        turn.iter()
            .any(|record| matches!(record, Record::Tool { call_id, .. } if call_id == id))
    };
    let unanswered = turn.iter().any(|record| match record {
        Record::Assistant { tool_calls, .. } => tool_calls.iter().any(|call| !answered(&call.id)),
        _ => false,
    });
    if unanswered { start } else { history.len() }
}

/// The directory holding the session files.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Store {
    dir: PathBuf,
}

impl Store {
    /// A store in `dir`; the directory is created on the first write.
    #[must_use]
    pub(crate) fn new(dir: PathBuf) -> Self {
        Self { dir }
    }

    /// Starts a session file with its header, locked for this session. Refuses to overwrite an
    /// existing file (or link).
    pub(crate) fn create(&self, id: &str, cwd: &Path) -> Result<SessionFile, StoreError> {
        let path = self.path(id)?;
        let io_error = |action, source| StoreError::Io {
            action,
            path: path.clone(),
            source,
        };
        std::fs::create_dir_all(&self.dir)
            .map_err(|source| io_error("create the directory of", source))?;
        let line = line(&Record::Session {
            version: SESSION_VERSION,
            cwd: cwd.to_path_buf(),
        });
        // Write-only: nothing reads a session through the handle that made it, and a sandbox
        // kept by Landlock alone lets a run make and append to a new session file, not read it.
        let file = std::fs::OpenOptions::new()
            .append(true)
            .create_new(true)
            .open(&path)
            .map_err(|source| io_error("create", source))?;
        let file = SessionFile::locked(id, path.clone(), file)?;
        file.append_text(&line)?;
        Ok(file)
    }

    /// Opens session `id`'s file for this session (locked: refused while open elsewhere) and
    /// reads it back.
    pub(crate) fn load(&self, id: &str) -> Result<(Saved, SessionFile), StoreError> {
        let path = self.path(id)?;
        let (file, writable) =
            open_existing(&path, true).map_err(|error| self.open_error(id, &path, error))?;
        let mut file = SessionFile::locked(id, path.clone(), file)?;
        let mut bytes = Vec::new();
        file.file
            .get_mut()
            .unwrap_or_else(PoisonError::into_inner)
            .read_to_end(&mut bytes)
            .map_err(|source| StoreError::Io {
                action: "read",
                path: path.clone(),
                source,
            })?;
        let saved = parse(&path, &bytes)?;
        // A torn last line is ended, so the next append is a line of its own.
        if writable && !bytes.is_empty() && !bytes.ends_with(b"\n") {
            file.append_text("\n")?;
        }
        Ok((saved, file))
    }

    /// Reads session `id` without opening it: read-only, without taking its lock (it may be open
    /// elsewhere, mid-turn), never writing to it. What `session/fork` copies from.
    pub(crate) fn snapshot(&self, id: &str) -> Result<Saved, StoreError> {
        let path = self.path(id)?;
        let mut file = open_existing(&path, false)
            .map_err(|error| self.open_error(id, &path, error))?
            .0;
        let mut bytes = Vec::new();
        file.read_to_end(&mut bytes)
            .map_err(|source| StoreError::Io {
                action: "read",
                path: path.clone(),
                source,
            })?;
        parse(&path, &bytes)
    }

    fn open_error(&self, id: &str, path: &Path, error: Opened) -> StoreError {
        match error {
            Opened::Missing => StoreError::NotFound {
                id: id.to_owned(),
                dir: self.dir.clone(),
            },
            Opened::NotAFile(kind) => StoreError::NotAFile {
                path: path.to_path_buf(),
                kind,
            },
            Opened::Io(source) => StoreError::Io {
                action: "open",
                path: path.to_path_buf(),
                source,
            },
        }
    }

    fn path(&self, id: &str) -> Result<PathBuf, StoreError> {
        check_id(id)?;
        Ok(self.dir.join(format!("{id}.jsonl")))
    }
}

/// Why an existing session file could not be opened.
enum Opened {
    Missing,
    NotAFile(&'static str),
    Io(io::Error),
}

/// Opens an existing session file for reading and, with `append`, appending (reading only, when
/// it may not be written: its appends then fail and are logged). Never blocks (a FIFO would,
/// opened for reading) and never follows a link; only a regular file is taken.
fn open_existing(path: &Path, append: bool) -> Result<(File, bool), Opened> {
    let flags = (OFlag::O_NONBLOCK | OFlag::O_NOFOLLOW).bits();
    let open = |append: bool| {
        std::fs::OpenOptions::new()
            .read(true)
            .append(append)
            .custom_flags(flags)
            .open(path)
    };
    let (file, writable) = match open(append) {
        Ok(file) => (file, append),
        Err(error) if error.kind() == io::ErrorKind::PermissionDenied => {
            (open(false).map_err(Opened::Io)?, false)
        }
        Err(error) => {
            return Err(match error.kind() {
                io::ErrorKind::NotFound => Opened::Missing,
                // O_NOFOLLOW on a link.
                _ if error.raw_os_error() == Some(nix::libc::ELOOP) => {
                    Opened::NotAFile("a symlink")
                }
                io::ErrorKind::IsADirectory => Opened::NotAFile("a directory"),
                _ => Opened::Io(error),
            });
        }
    };
    let kind = file.metadata().map_err(Opened::Io)?.file_type();
    if kind.is_file() {
        return Ok((file, writable));
    }
    Err(Opened::NotAFile(if kind.is_fifo() {
        "a FIFO"
    } else if kind.is_dir() {
        "a directory"
    } else if kind.is_socket() {
        "a socket"
    } else if kind.is_char_device() || kind.is_block_device() {
        "a device"
    } else {
        "not a regular file"
    }))
}

/// A session's file, open and locked for as long as the session is: the one way to append to
/// it. Dropping it (or the process ending) releases the lock.
#[derive(Debug)]
pub(crate) struct SessionFile {
    id: String,
    path: PathBuf,
    file: Mutex<File>,
}

impl SessionFile {
    /// Takes the session's lock on `file`, or refuses: it is open elsewhere.
    fn locked(id: &str, path: PathBuf, file: File) -> Result<Self, StoreError> {
        match file.try_lock() {
            Ok(()) => Ok(Self {
                id: id.to_owned(),
                path,
                file: Mutex::new(file),
            }),
            Err(std::fs::TryLockError::WouldBlock) => Err(StoreError::Busy { id: id.to_owned() }),
            Err(std::fs::TryLockError::Error(source)) => Err(StoreError::Io {
                action: "lock",
                path,
                source,
            }),
        }
    }

    /// The session's id.
    pub(crate) fn id(&self) -> &str {
        &self.id
    }

    /// The state directory the file is in.
    pub(crate) fn dir(&self) -> Option<&Path> {
        self.path.parent()
    }

    /// Appends records, one line each, in one write.
    pub(crate) fn append(&self, records: &[Record]) -> Result<(), StoreError> {
        let text: String = records.iter().map(line).collect();
        self.append_text(&text)
    }

    /// Appends the session's settings, replacing the earlier ones when it is loaded.
    pub(crate) fn save_settings(&self, settings: &SavedSettings) -> Result<(), StoreError> {
        let mut value = serde_json::to_value(settings).unwrap_or_default();
        value["type"] = SETTINGS_TYPE.into();
        let mut text = value.to_string();
        text.push('\n');
        self.append_text(&text)
    }

    /// Marks the end of a prompt turn: the records before it are completed turns.
    pub(crate) fn end_turn(&self) -> Result<(), StoreError> {
        self.append_text(&format!("{{\"type\":\"{TURN_END_TYPE}\"}}\n"))
    }

    /// Appends whole lines, in one write.
    fn append_text(&self, text: &str) -> Result<(), StoreError> {
        self.file
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .write_all(text.as_bytes())
            .map_err(|source| StoreError::Io {
                action: "append to",
                path: self.path.clone(),
                source,
            })
    }
}

/// A session file's bytes as a session: every line that reads as a record, in order (one that
/// does not, a torn last line included, is skipped with a warning), and the last settings.
fn parse(path: &Path, bytes: &[u8]) -> Result<Saved, StoreError> {
    let mut records = Vec::new();
    let mut settings = None;
    let mut turns_end = None;
    let mut unusable_children = Vec::new();
    for (number, text) in bytes.split(|&b| b == b'\n').enumerate() {
        let Ok(text) = std::str::from_utf8(text) else {
            tracing::warn!(
                path = %path.display(),
                line = number + 1,
                "skipping a line of a session file that is not UTF-8 (a torn last line?)"
            );
            continue;
        };
        if text.trim().is_empty() {
            continue;
        }
        let parsed = serde_json::from_str::<serde_json::Value>(text).and_then(|value| {
            let kind = value.get("type").and_then(serde_json::Value::as_str);
            if kind == Some(TURN_END_TYPE) {
                // Counted without the header.
                turns_end = Some(records.len().saturating_sub(1));
                Ok(None)
            } else if kind == Some(SETTINGS_TYPE) {
                serde_json::from_value::<SavedSettings>(value).map(|saved| {
                    settings = Some(saved);
                    None
                })
            } else if kind == Some(CHILD_TYPE) {
                // A child is listed even when its record cannot be used: it existed.
                let problem = match serde_json::from_value::<ChildRecord>(value) {
                    Ok(child) if child.version <= CHILD_VERSION => {
                        return Ok(Some(Record::Child(child)));
                    }
                    Ok(child) => format!(
                        "child {} (subagent {}): its record is of version {}, newer than this \
                         acp-child reads ({CHILD_VERSION})",
                        child.id, child.agent, child.version
                    ),
                    Err(error) => format!("a child record that cannot be read ({error})"),
                };
                unusable_children.push(format!("line {}: {problem}", number + 1));
                Ok(None)
            } else {
                serde_json::from_value::<Record>(value).map(Some)
            }
        });
        match parsed {
            Ok(record) => records.extend(record),
            Err(error) => tracing::warn!(
                path = %path.display(),
                line = number + 1,
                %error,
                "skipping an unreadable line of a session file"
            ),
        }
    }
    let mut records = records.into_iter();
    match records.next() {
        Some(Record::Session { version, .. }) if version > SESSION_VERSION => {
            Err(StoreError::Newer {
                path: path.to_path_buf(),
                version,
            })
        }
        Some(Record::Session { cwd, .. }) => Ok(Saved {
            cwd,
            history: records.collect(),
            settings,
            turns_end,
            unusable_children,
        }),
        _ => Err(StoreError::NoHeader {
            path: path.to_path_buf(),
        }),
    }
}

/// Checks that a session id is safe as a file name.
pub(crate) fn check_id(id: &str) -> Result<(), StoreError> {
    let valid = !id.is_empty()
        && id.len() <= 128
        && id
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_');
    if valid {
        Ok(())
    } else {
        Err(StoreError::BadId { id: id.to_owned() })
    }
}

fn line(record: &Record) -> String {
    // Serialising these plain structs cannot fail.
    let mut text = serde_json::to_string(record).unwrap_or_default();
    text.push('\n');
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_round_trip_through_a_file() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::new(dir.path().join("sessions"));
        let file = store.create("sess-a", Path::new("/project")).unwrap();
        let history = vec![
            Record::User {
                text: "hi\nthere".into(),
            },
            Record::Assistant {
                text: String::new(),
                tool_calls: vec![RecordedCall {
                    id: "call_1".into(),
                    name: "read_file".into(),
                    arguments: r#"{"path":"a.txt"}"#.into(),
                }],
            },
            Record::Tool {
                call_id: "call_1".into(),
                content: "A".into(),
                failed: false,
            },
        ];
        file.append(&history[..1]).unwrap();
        file.append(&history[1..]).unwrap();
        drop(file);
        let (saved, _file) = store.load("sess-a").unwrap();
        assert_eq!(saved.cwd, PathBuf::from("/project"));
        assert_eq!(saved.history, history);
        assert_eq!(saved.settings, None);
        // Never clobbered.
        assert!(matches!(
            store.create("sess-a", Path::new("/other")),
            Err(StoreError::Io { .. })
        ));
    }

    #[test]
    fn versions_are_written_and_an_unversioned_file_still_loads() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::new(dir.path().to_path_buf());
        drop(store.create("new", Path::new("/p")).unwrap());
        let header = std::fs::read_to_string(dir.path().join("new.jsonl")).unwrap();
        assert_eq!(
            header,
            "{\"type\":\"session\",\"version\":2,\"cwd\":\"/p\"}\n"
        );
        // What acp-child wrote before versions.
        std::fs::write(
            dir.path().join("old.jsonl"),
            "{\"type\":\"session\",\"cwd\":\"/p\"}\n\
             {\"type\":\"child\",\"id\":\"agent-1\",\"agent\":\"echo\",\"session\":\"s-1\"}\n",
        )
        .unwrap();
        let (saved, _file) = store.load("old").unwrap();
        assert_eq!(
            saved.history,
            [Record::Child(ChildRecord {
                version: 1,
                id: "agent-1".into(),
                agent: "echo".into(),
                label: None,
                session: Some("s-1".into()),
                resumable: None,
                failed: false,
                forked: false,
                isolated: false,
            })]
        );
        assert!(saved.unusable_children.is_empty());
        std::fs::write(
            dir.path().join("future.jsonl"),
            "{\"type\":\"session\",\"version\":3,\"cwd\":\"/p\"}\n",
        )
        .unwrap();
        let error = store.load("future").unwrap_err().to_string();
        assert!(
            error.ends_with(
                "future.jsonl is of version 3, newer than this acp-child reads (2); load it with a \
                 newer acp-child"
            ),
            "{error}"
        );
    }

    #[test]
    fn a_child_record_that_cannot_be_used_is_kept_as_unusable_with_why() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::new(dir.path().to_path_buf());
        std::fs::write(
            dir.path().join("s.jsonl"),
            "{\"type\":\"session\",\"version\":2,\"cwd\":\"/p\"}\n\
             {\"type\":\"child\",\"agent\":\"echo\"}\n\
             {\"type\":\"child\",\"version\":9,\"id\":\"agent-2\",\"agent\":\"echo\"}\n",
        )
        .unwrap();
        let (saved, _file) = store.load("s").unwrap();
        assert!(saved.history.is_empty());
        assert_eq!(
            saved.unusable_children,
            [
                "line 2: a child record that cannot be read (missing field `id`)",
                "line 3: child agent-2 (subagent echo): its record is of version 9, newer than \
                 this acp-child reads (2)"
            ]
        );
    }

    #[test]
    fn the_last_settings_saved_win_and_are_not_history() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::new(dir.path().to_path_buf());
        let file = store.create("s", Path::new("/p")).unwrap();
        let first = SavedSettings {
            model: Some("m1".into()),
            persona: Some("Be {{model}}.".into()),
            persona_replaces: true,
            tools: Some(ToolFilter {
                allow: None,
                deny: vec!["run_command".into()],
            }),
            output_schema: Some(serde_json::json!({"type": "object"})),
            max_depth: Some(0),
        };
        file.save_settings(&first).unwrap();
        file.append(&[Record::User { text: "a".into() }]).unwrap();
        drop(file);
        let (saved, file) = store.load("s").unwrap();
        assert_eq!(saved.settings, Some(first.clone()));
        let second = SavedSettings {
            model: Some("m2".into()),
            ..first
        };
        file.save_settings(&second).unwrap();
        drop(file);
        let (saved, _file) = store.load("s").unwrap();
        assert_eq!(saved.settings, Some(second));
        assert_eq!(saved.history, vec![Record::User { text: "a".into() }]);
    }

    #[test]
    fn a_notice_saved_before_notices_named_their_task_still_loads() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::new(dir.path().to_path_buf());
        let file = store.create("s", Path::new("/p")).unwrap();
        let notice = Record::Notice {
            text: "quoted".into(),
            task: Some("subagent-1".into()),
        };
        file.append(std::slice::from_ref(&notice)).unwrap();
        drop(file);
        let path = dir.path().join("s.jsonl");
        let mut text = std::fs::read_to_string(&path).unwrap();
        assert!(
            text.ends_with("{\"type\":\"notice\",\"text\":\"quoted\",\"task\":\"subagent-1\"}\n"),
            "{text}"
        );
        text.push_str("{\"type\":\"notice\",\"text\":\"Background task subagent-1 ...\"}\n");
        std::fs::write(&path, text).unwrap();
        assert_eq!(
            store.load("s").unwrap().0.history,
            vec![
                notice,
                Record::Notice {
                    text: "Background task subagent-1 ...".into(),
                    task: None
                }
            ]
        );
    }

    /// A session `s` in `dir` holding one user record, its file closed; the file's path.
    fn one_record(store: &Store, dir: &Path) -> PathBuf {
        let file = store.create("s", Path::new("/p")).unwrap();
        file.append(&[Record::User { text: "a".into() }]).unwrap();
        dir.join("s.jsonl")
    }

    #[test]
    fn a_torn_last_line_is_skipped_and_the_next_record_gets_a_line_of_its_own() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::new(dir.path().to_path_buf());
        let path = one_record(&store, dir.path());
        let mut text = std::fs::read_to_string(&path).unwrap();
        text.push_str("{\"type\":\"user\",\"te");
        std::fs::write(&path, text).unwrap();
        let (saved, file) = store.load("s").unwrap();
        assert_eq!(saved.history, vec![Record::User { text: "a".into() }]);
        file.append(&[Record::User { text: "b".into() }]).unwrap();
        drop(file);
        assert_eq!(
            store.load("s").unwrap().0.history,
            vec![
                Record::User { text: "a".into() },
                Record::User { text: "b".into() }
            ]
        );
    }

    #[test]
    fn a_last_line_torn_inside_a_multi_byte_character_is_skipped() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::new(dir.path().to_path_buf());
        let path = one_record(&store, dir.path());
        let mut bytes = std::fs::read(&path).unwrap();
        let torn = "{\"type\":\"user\",\"text\":\"caf\u{e9}\"}\n".as_bytes();
        // Cut between the two bytes of the é.
        let cut = torn.iter().position(|&b| b == 0xC3).unwrap() + 1;
        bytes.extend_from_slice(&torn[..cut]);
        std::fs::write(&path, &bytes).unwrap();
        let (saved, _file) = store.load("s").unwrap();
        assert_eq!(saved.history, vec![Record::User { text: "a".into() }]);
    }

    #[test]
    fn one_writer_per_session_until_it_lets_go() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::new(dir.path().to_path_buf());
        let file = store.create("s", Path::new("/p")).unwrap();
        let busy = store.load("s").unwrap_err();
        assert!(matches!(busy, StoreError::Busy { .. }), "{busy:?}");
        assert_eq!(
            busy.to_string(),
            "session busy: session s is open elsewhere (another acp-child, or another session of \
             this one); one writer per session: wait until it ends"
        );
        drop(file);
        let (_, loaded) = store.load("s").unwrap();
        assert!(matches!(store.load("s"), Err(StoreError::Busy { .. })));
        drop(loaded);
        store.load("s").unwrap();
    }

    #[test]
    fn only_a_regular_file_is_a_session_file_and_a_fifo_never_blocks() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::new(dir.path().to_path_buf());
        nix::unistd::mkfifo(
            &dir.path().join("fifo.jsonl"),
            nix::sys::stat::Mode::S_IRWXU,
        )
        .unwrap();
        let error = store.load("fifo").unwrap_err();
        assert!(
            matches!(error, StoreError::NotAFile { kind: "a FIFO", .. }),
            "{error:?}"
        );
        assert!(error.to_string().ends_with(
            "fifo.jsonl is a FIFO, not a regular file; acp-child reads only regular files of \
             its state directory"
        ));
        let outside = tempfile::tempdir().unwrap();
        let target = outside.path().join("x.jsonl");
        std::fs::write(&target, "{\"type\":\"session\",\"cwd\":\"/\"}\n").unwrap();
        std::os::unix::fs::symlink(&target, dir.path().join("link.jsonl")).unwrap();
        assert!(matches!(
            store.load("link"),
            Err(StoreError::NotAFile {
                kind: "a symlink",
                ..
            })
        ));
        std::fs::create_dir(dir.path().join("dir.jsonl")).unwrap();
        assert!(matches!(
            store.load("dir"),
            Err(StoreError::NotAFile {
                kind: "a directory",
                ..
            })
        ));
    }

    #[test]
    fn a_snapshot_holds_the_completed_turns_and_never_touches_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::new(dir.path().to_path_buf());
        let file = store.create("s", Path::new("/p")).unwrap();
        let done = vec![
            Record::User { text: "a".into() },
            Record::Assistant {
                text: "A".into(),
                tool_calls: Vec::new(),
            },
        ];
        file.append(&done).unwrap();
        file.end_turn().unwrap();
        let call = RecordedCall {
            id: "c1".into(),
            name: "subagent".into(),
            arguments: "{}".into(),
        };
        file.append(&[
            Record::Child(ChildRecord {
                version: CHILD_VERSION,
                id: "subagent-1".into(),
                agent: "acp-child".into(),
                label: None,
                session: None,
                resumable: None,
                failed: false,
                forked: true,
                isolated: false,
            }),
            Record::User { text: "b".into() },
            Record::Assistant {
                text: String::new(),
                tool_calls: vec![call],
            },
        ])
        .unwrap();
        let path = dir.path().join("s.jsonl");
        let before = std::fs::read(&path).unwrap();
        // Open (and locked) here: a snapshot is read all the same.
        let saved = store.snapshot("s").unwrap();
        assert_eq!(saved.completed(), done);
        assert_eq!(saved.history.len(), 5);
        assert_eq!(std::fs::read(&path).unwrap(), before);
        // Without turn-end lines (an older file), an unanswered last turn is left out.
        let legacy = Saved {
            turns_end: None,
            ..saved.clone()
        };
        assert_eq!(legacy.completed(), done);
        let mut answered = legacy.clone();
        answered.history.push(Record::Tool {
            call_id: "c1".into(),
            content: "x".into(),
            failed: false,
        });
        assert_eq!(answered.completed().len(), 5);
        // With turn ends marked, a turn in flight is left out even when its calls are answered
        // (the model is streaming its next reply).
        let streaming = Saved {
            turns_end: saved.turns_end,
            ..answered
        };
        assert_eq!(streaming.completed(), done);
        assert!(matches!(
            store.snapshot("missing"),
            Err(StoreError::NotFound { .. })
        ));
        assert!(matches!(
            store.snapshot("../x"),
            Err(StoreError::BadId { .. })
        ));
    }

    #[test]
    fn ids_cannot_name_other_files() {
        let store = Store::new(PathBuf::from("/state"));
        for bad in ["", "../x", "a/b", "a.b", "é"] {
            assert!(
                matches!(store.load(bad), Err(StoreError::BadId { .. })),
                "{bad}"
            );
        }
        assert!(matches!(
            store.load("sess-missing"),
            Err(StoreError::NotFound { .. })
        ));
        assert_eq!(
            store.load("x/y").unwrap_err().to_string(),
            "invalid session id \"x/y\": session ids are letters, digits, '-' and '_' (as returned by session/new)"
        );
    }
}
