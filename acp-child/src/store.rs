//! Session persistence: one JSONL file per session under the state directory.
//!
//! File `<dir>/<session-id>.jsonl`: the first line is a [`Record::Session`] header (the session's
//! directory), then one [`Record`] per conversation step, appended as the turn goes (a user prompt,
//! an assistant message with its tool calls, a tool result, a background task's completion notice).
//! Loading reads them back in order.
//! Between them, a `{"type": "settings", ...}` line ([`SavedSettings`]) is appended whenever the
//! session's settings change (at `session/new`, on `session/set_config_option`); the last one is
//! the session's settings when it is loaded. It is not part of the conversation.
//!
//! Invariants: a session id becomes a file name only after [`check_id`] (letters, digits, `-`, `_`;
//! no path separators, so a client cannot name a file outside the directory); records are only ever
//! appended, one complete line per write, so a crash loses at most the line being written and a
//! torn last line is skipped on load (with a warning) rather than making the session unloadable.

use std::io::{self, BufRead as _, Write as _};
use std::path::{Path, PathBuf};

use protocol::capabilities::ToolFilter;
use serde::{Deserialize, Serialize};
use thiserror::Error;

/// A child as saved in its parent's session file (the last record of an id wins).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct ChildRecord {
    pub(crate) id: String,
    /// The subagent's name (a registry agent or a definition).
    pub(crate) agent: String,
    /// The ACP session id its agent reported, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) session: Option<String>,
    /// Whether its last run failed.
    #[serde(default)]
    pub(crate) failed: bool,
}

/// One line of a session file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub(crate) enum Record {
    /// The header: where the session works.
    Session { cwd: PathBuf },
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

    /// Starts a session file with its header. Refuses to overwrite an existing file.
    pub(crate) fn create(&self, id: &str, cwd: &Path) -> Result<(), StoreError> {
        let path = self.path(id)?;
        let io_error = |action, source| StoreError::Io {
            action,
            path: path.clone(),
            source,
        };
        std::fs::create_dir_all(&self.dir)
            .map_err(|source| io_error("create the directory of", source))?;
        let line = line(&Record::Session {
            cwd: cwd.to_path_buf(),
        });
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&path)
            .map_err(|source| io_error("create", source))?;
        file.write_all(line.as_bytes())
            .map_err(|source| io_error("write", source))
    }

    /// Appends records to a session file, one line each, in one write.
    pub(crate) fn append(&self, id: &str, records: &[Record]) -> Result<(), StoreError> {
        let text: String = records.iter().map(line).collect();
        self.append_text(id, &text)
    }

    /// Appends a session's settings, replacing the earlier ones when it is loaded.
    pub(crate) fn save_settings(
        &self,
        id: &str,
        settings: &SavedSettings,
    ) -> Result<(), StoreError> {
        let mut value = serde_json::to_value(settings).unwrap_or_default();
        value["type"] = SETTINGS_TYPE.into();
        let mut text = value.to_string();
        text.push('\n');
        self.append_text(id, &text)
    }

    /// Appends whole lines to session `id`'s file, in one write.
    fn append_text(&self, id: &str, text: &str) -> Result<(), StoreError> {
        let path = self.path(id)?;
        let io_error = |action, source| StoreError::Io {
            action,
            path: path.clone(),
            source,
        };
        let mut file = std::fs::OpenOptions::new()
            .append(true)
            .open(&path)
            .map_err(|source| io_error("open", source))?;
        file.write_all(text.as_bytes())
            .map_err(|source| io_error("append to", source))
    }

    /// Reads a session back.
    pub(crate) fn load(&self, id: &str) -> Result<Saved, StoreError> {
        let path = self.path(id)?;
        let file = match std::fs::File::open(&path) {
            Ok(file) => file,
            Err(error) if error.kind() == io::ErrorKind::NotFound => {
                return Err(StoreError::NotFound {
                    id: id.to_owned(),
                    dir: self.dir.clone(),
                });
            }
            Err(source) => {
                return Err(StoreError::Io {
                    action: "open",
                    path,
                    source,
                });
            }
        };
        let mut records = Vec::new();
        let mut settings = None;
        for (number, text) in io::BufReader::new(file).lines().enumerate() {
            let text = text.map_err(|source| StoreError::Io {
                action: "read",
                path: path.clone(),
                source,
            })?;
            if text.trim().is_empty() {
                continue;
            }
            let parsed = serde_json::from_str::<serde_json::Value>(&text).and_then(|value| {
                if value.get("type").and_then(serde_json::Value::as_str) == Some(SETTINGS_TYPE) {
                    serde_json::from_value::<SavedSettings>(value).map(|saved| {
                        settings = Some(saved);
                        None
                    })
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
            Some(Record::Session { cwd }) => Ok(Saved {
                cwd,
                history: records.collect(),
                settings,
            }),
            _ => Err(StoreError::NoHeader { path }),
        }
    }

    fn path(&self, id: &str) -> Result<PathBuf, StoreError> {
        check_id(id)?;
        Ok(self.dir.join(format!("{id}.jsonl")))
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
        store.create("sess-a", Path::new("/project")).unwrap();
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
        store.append("sess-a", &history[..1]).unwrap();
        store.append("sess-a", &history[1..]).unwrap();
        let saved = store.load("sess-a").unwrap();
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
    fn the_last_settings_saved_win_and_are_not_history() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::new(dir.path().to_path_buf());
        store.create("s", Path::new("/p")).unwrap();
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
        store.save_settings("s", &first).unwrap();
        store
            .append("s", &[Record::User { text: "a".into() }])
            .unwrap();
        assert_eq!(store.load("s").unwrap().settings, Some(first.clone()));
        let second = SavedSettings {
            model: Some("m2".into()),
            ..first
        };
        store.save_settings("s", &second).unwrap();
        let saved = store.load("s").unwrap();
        assert_eq!(saved.settings, Some(second));
        assert_eq!(saved.history, vec![Record::User { text: "a".into() }]);
    }

    #[test]
    fn a_notice_saved_before_notices_named_their_task_still_loads() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::new(dir.path().to_path_buf());
        store.create("s", Path::new("/p")).unwrap();
        let notice = Record::Notice {
            text: "quoted".into(),
            task: Some("subagent-1".into()),
        };
        store.append("s", std::slice::from_ref(&notice)).unwrap();
        let path = dir.path().join("s.jsonl");
        let mut text = std::fs::read_to_string(&path).unwrap();
        assert!(
            text.ends_with("{\"type\":\"notice\",\"text\":\"quoted\",\"task\":\"subagent-1\"}\n"),
            "{text}"
        );
        text.push_str("{\"type\":\"notice\",\"text\":\"Background task subagent-1 ...\"}\n");
        std::fs::write(&path, text).unwrap();
        assert_eq!(
            store.load("s").unwrap().history,
            vec![
                notice,
                Record::Notice {
                    text: "Background task subagent-1 ...".into(),
                    task: None
                }
            ]
        );
    }

    #[test]
    fn a_torn_last_line_is_skipped() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::new(dir.path().to_path_buf());
        store.create("s", Path::new("/p")).unwrap();
        store
            .append("s", &[Record::User { text: "a".into() }])
            .unwrap();
        let path = dir.path().join("s.jsonl");
        let mut text = std::fs::read_to_string(&path).unwrap();
        text.push_str("{\"type\":\"user\",\"te");
        std::fs::write(&path, text).unwrap();
        assert_eq!(
            store.load("s").unwrap().history,
            vec![Record::User { text: "a".into() }]
        );
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
