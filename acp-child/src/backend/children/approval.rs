//! The person's approval of a repository definition (`protocol::trust`), asked before its child
//! starts: through the ordinary ACP permission flow, of kind `execute`, on the call's tool card.
//!
//! Invariants: the request shows everything the start hands the definition (file, whole command
//! line, forwarded names, permission policy, and whether it starts from a copy of this
//! conversation); only an allow option starts it; "allow always" is
//! remembered for the file's exact content (`acp_host::trust::TrustStore`), never the session's
//! standing answers; a cancelled turn starts nothing whatever the answer.

use std::path::PathBuf;

use acp_host::trust::TrustStore;
use agent_client_protocol::v1::schema::{
    PermissionOption, PermissionOptionKind, ToolCallContent, ToolCallId, ToolCallUpdateFields,
    ToolKind,
};
use protocol::trust::Digest;

use super::Delegated;
use protocol::definition::{RunContext, RunPermission};

use crate::backend::CANCELLED;
use crate::backend::{Turn, permission};

/// What the person is shown before a repository definition's child starts: everything the start
/// would hand the definition.
pub(super) struct Asking {
    pub(super) file: PathBuf,
    pub(super) digest: Option<Digest>,
    /// The whole command line, quoted as a shell would read it.
    pub(super) command: String,
    /// Every variable forwarded (names; `--subagent-env`'s and the definition's).
    pub(super) env: Vec<String>,
    pub(super) permission: RunPermission,
    /// Whether the child starts from a copy of this conversation (`context: fork`): it then reads
    /// this session's saved turns, so the person is told, beside what it runs.
    pub(super) fork: bool,
    /// The sandbox it starts in (`workspace-write, network off`, or `none`).
    pub(super) sandbox: String,
}

impl Asking {
    /// The refusal when the person did not approve.
    fn refused(&self, name: &str, why: &str) -> Delegated {
        Delegated::failed(format!(
            "subagent {name} needs your approval to run {}{why}; nothing was started. Approve it \
             when asked, or from a shell: acp-host trust --approve {}",
            self.command,
            self.file.display()
        ))
    }
}

/// Asks the person (this agent's client, `session/request_permission` of kind `execute` on tool
/// call `call`) whether repository definition `name` may start, showing its file, command line,
/// forwarded variables and permission policy. "Allow always" is remembered in `store` for this
/// exact content. `Err` is the call's result: rejected, dismissed, unanswerable or cancelled.
pub(super) async fn approve(
    turn: &Turn,
    call: &ToolCallId,
    name: &str,
    asking: &Asking,
    store: Option<&TrustStore>,
) -> Result<(), Delegated> {
    let env = if asking.env.is_empty() {
        "no variables".to_owned()
    } else {
        asking.env.join(", ")
    };
    let permission = asking.permission.as_str();
    let mut text = format!(
        "Subagent {name} is defined in {file}, a file of this folder (not one you named). \
         Starting it runs:\n\n    {command}\n\nforwarding {env}; its own permission requests: \
         {permission}; its sandbox: {sandbox}.",
        file = asking.file.display(),
        command = asking.command,
        sandbox = asking.sandbox,
    );
    let context = if asking.fork {
        text.push_str(
            " It starts from a copy of this conversation: it reads this session's completed \
             turns from this agent's state directory.",
        );
        RunContext::Fork
    } else {
        RunContext::Fresh
    };
    let fields = ToolCallUpdateFields::new()
        .title(format!("Start subagent {name}: {}", asking.command))
        .kind(ToolKind::Execute)
        .content(vec![ToolCallContent::from(text)])
        .raw_input(serde_json::json!({
            "definition": asking.file,
            "command": asking.command,
            "env": asking.env,
            "permission": permission,
            "context": context,
            "sandbox": asking.sandbox,
        }));
    let options = vec![
        PermissionOption::new(
            permission::ALLOW_ONCE,
            "Allow once",
            PermissionOptionKind::AllowOnce,
        ),
        PermissionOption::new(
            permission::ALLOW_ALWAYS,
            "Allow always (until the file changes)",
            PermissionOptionKind::AllowAlways,
        ),
        PermissionOption::new(
            permission::REJECT_ONCE,
            "Reject",
            PermissionOptionKind::RejectOnce,
        ),
    ];
    let answer = match turn.request_permission(call, fields, options).await {
        Ok(answer) => answer,
        Err(error) => {
            return Err(asking.refused(
                name,
                &format!(" (cannot ask: {})", protocol::report::describe(&error)),
            ));
        }
    };
    if turn.is_cancelled() {
        return Err(Delegated::failed(CANCELLED));
    }
    match answer {
        permission::Answer::Selected(option) if option == permission::ALLOW_ONCE => Ok(()),
        permission::Answer::Selected(option) if option == permission::ALLOW_ALWAYS => {
            if let (Some(store), Some(digest)) = (store, &asking.digest) {
                if let Err(error) = store.approve(&asking.file, digest) {
                    tracing::warn!(
                        error = %protocol::report::describe(&error),
                        "the approval holds for this start only"
                    );
                }
            } else {
                tracing::warn!("no state directory: the approval holds for this start only");
            }
            Ok(())
        }
        permission::Answer::TurnCancelled => Err(Delegated::failed(CANCELLED)),
        permission::Answer::ClientError(error) => Err(asking.refused(
            name,
            &format!(" (the client answered the request with an error: {error})"),
        )),
        permission::Answer::Selected(_) | permission::Answer::Dismissed => {
            Err(asking.refused(name, ""))
        }
    }
}
