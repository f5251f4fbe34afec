//! The planner: every row of the state table, then aggregation per physical file.
//!
//! Invariant: this is the only place that maps (target state, marker, definition, authorization)
//! to an action; the CLI and the executor read the resulting [`Plan`], never re-decide.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use super::dsh::{self, Edits};
use super::render;
use super::{
    Action, AgentView, Authorization, Change, FileFacts, FilePlan, FileState, ForceTarget,
    Location, Operation, Plan, Readiness, RegistryView, Snapshot,
};
use crate::definition::Definition;
use crate::registry;

/// A file-level effect of one or more operations, before aggregation.
struct Intent {
    agent: &'static str,
    target: PathBuf,
    pre_image: Option<FileFacts>,
    change: Change,
    /// Indices into the unsorted operation list.
    operations: Vec<usize>,
}

/// Plan state shared by the per-agent planners.
struct Planner<'a> {
    auth: &'a Authorization,
    unwritable: &'a BTreeMap<PathBuf, String>,
    operations: Vec<Operation>,
    intents: Vec<Intent>,
    used_forces: BTreeSet<ForceTarget>,
}

/// Computes the full plan. Pure: reads only its arguments.
#[must_use]
pub fn plan(
    definitions: &[Definition],
    view: &RegistryView,
    snapshot: &Snapshot,
    auth: &Authorization,
) -> Plan {
    let mut planner = Planner {
        auth,
        unwritable: &snapshot.unwritable,
        operations: Vec::new(),
        intents: Vec::new(),
        used_forces: BTreeSet::new(),
    };
    for agent in &view.agents {
        let location = view.location(agent);
        let defined: Vec<&Definition> = definitions
            .iter()
            .filter(|d| d.targets(agent.spec.name))
            .collect();
        match (&agent.readiness, location) {
            (Readiness::Ready, Some(location)) => match location.folder() {
                Some(folder) => planner.dedicated(&location, &folder, &defined, snapshot),
                None => planner.shared(&location, &defined, snapshot),
            },
            (readiness, location) => planner.held(agent, readiness, location.as_ref(), &defined),
        }
    }
    planner.finish()
}

/// The verdict on one present, readable target of a defined subagent.
fn verdict(managed: bool, identical: bool, forced: bool) -> (Action, &'static str, bool) {
    match (managed, identical, forced) {
        (true, true, _) => (Action::Noop, "up to date", true),
        (true, false, _) => (Action::Update, "managed, differs from the definition", true),
        (false, _, true) => (
            Action::Update,
            "not managed by acp-host; replaced as authorized by --force",
            true,
        ),
        (false, _, false) => (
            Action::Conflict,
            "exists without the acp-host marker (not ours); preserved",
            false,
        ),
    }
}

/// A new operation; only ERROR starts unauthorized (the state-table helpers adjust the rest).
fn new_op(
    action: Action,
    agent: &'static str,
    name: &str,
    path: Option<PathBuf>,
    reason: impl Into<String>,
) -> Operation {
    Operation {
        action,
        agent,
        name: name.to_owned(),
        path,
        reason: reason.into(),
        requires_force: false,
        requires_prune: false,
        authorized: action != Action::Error,
    }
}

const NOT_READ: &str = "was not read before planning (internal error; please report)";

/// Why a target that exists cannot be used, if it cannot.
fn unusable(state: &FileState) -> Option<String> {
    match state {
        FileState::NotAFile => {
            Some("is a folder or special file where a file belongs; move it away".to_owned())
        }
        FileState::Unwritable(reason) => Some(reason.clone()),
        FileState::Missing | FileState::File(_) => None,
    }
}

/// Whether a spliced shared file still parses as a list (an alias to an anchor that lived in a
/// replaced item, for one, breaks the parse). The count of its items needs no check of its own:
/// [`dsh::apply`] swaps each edited item's exact byte range for one rendered item (or nothing) and
/// appends whole items after a line break, so a splice that parses holds the items it should.
fn spliced_is_sound(new: &str) -> Result<(), String> {
    match dsh::locate(new.as_bytes()) {
        // The last item went and the user's comments stay.
        Ok(_) | Err(dsh::DshError::Empty) => Ok(()),
        Err(e) => Err(format!(
            "editing this file would make it invalid (it {e}); nothing written to it — is an anchor (`&name`) of an acp-host item aliased (`*name`) elsewhere? copy its value instead"
        )),
    }
}

/// The shared file's text and items, or why it cannot be edited.
fn shared_items(state: &FileState) -> Result<(String, Vec<dsh::Item>), String> {
    if let Some(reason) = unusable(state) {
        return Err(reason);
    }
    let FileState::File(bytes) = state else {
        return Ok((String::new(), Vec::new()));
    };
    let text = std::str::from_utf8(bytes).map_err(|_| dsh::DshError::NotUtf8.to_string())?;
    let items = dsh::locate(bytes).map_err(|e| e.to_string())?;
    Ok((text.to_owned(), items))
}

impl Planner<'_> {
    fn push(&mut self, operation: Operation) -> usize {
        self.operations.push(operation);
        self.operations.len() - 1
    }

    fn intent(
        &mut self,
        agent: &'static str,
        target: PathBuf,
        pre_image: Option<FileFacts>,
        change: Change,
        operations: Vec<usize>,
    ) {
        self.intents.push(Intent {
            agent,
            target,
            pre_image,
            change,
            operations,
        });
    }

    /// Whether `agent/name` is forced; remembers that the force was used.
    fn forced(&mut self, agent: &'static str, name: &str) -> bool {
        let target = ForceTarget {
            agent,
            name: name.to_owned(),
        };
        let forced = self.auth.forces.contains(&target);
        if forced {
            self.used_forces.insert(target);
        }
        forced
    }

    /// A defined subagent's present target -> operation (the "in canonical = yes" rows).
    fn defined_op(
        &mut self,
        agent: &'static str,
        name: &str,
        path: PathBuf,
        managed: bool,
        identical: bool,
    ) -> Operation {
        let forced = !managed && self.forced(agent, name);
        let (action, reason, authorized) = verdict(managed, identical, forced);
        let mut op = new_op(action, agent, name, Some(path), reason);
        op.requires_force = !managed;
        op.authorized = authorized;
        op
    }

    /// A managed target no longer defined -> ORPHAN, or REMOVE with prune.
    fn orphan_op(&self, agent: &'static str, name: &str, path: PathBuf) -> Operation {
        let (action, reason) = if self.auth.prune {
            (
                Action::Remove,
                "managed, no longer defined; removed by --prune",
            )
        } else {
            (Action::Orphan, "managed, no longer defined; kept")
        };
        let mut op = new_op(action, agent, name, Some(path), reason);
        op.requires_prune = true;
        op.authorized = self.auth.prune;
        op
    }

    /// SKIP or ERROR for every definition of an agent that is not ready.
    fn held(
        &mut self,
        agent: &AgentView,
        readiness: &Readiness,
        location: Option<&Location>,
        defined: &[&Definition],
    ) {
        let (action, reason) = match readiness {
            Readiness::Blocked(reason) => (Action::Error, reason.clone()),
            Readiness::Skip(reason) => (Action::Skip, reason.clone()),
            Readiness::Ready => (
                Action::Skip,
                format!("{} has no path in this scope", agent.spec.name),
            ),
        };
        for definition in defined {
            let path = location.map(|l| l.path_for(&definition.name));
            let op = new_op(
                action,
                agent.spec.name,
                &definition.name,
                path.clone(),
                reason.clone(),
            );
            let index = self.push(op);
            if let Some(target) = path {
                self.intent(agent.spec.name, target, None, Change::Keep, vec![index]);
            }
        }
    }

    /// One file per subagent (Markdown, codex TOML): the defined targets, then the orphans.
    fn dedicated(
        &mut self,
        location: &Location,
        folder: &Path,
        defined: &[&Definition],
        snapshot: &Snapshot,
    ) {
        let agent = location.agent;
        for definition in defined {
            let name = definition.name.as_str();
            let path = location.path_for(name);
            if let Some(reason) = super::path_too_long(&path) {
                // Refused here, not at the write: a plan that cannot apply writes nothing.
                self.push(new_op(Action::Error, agent, name, Some(path), reason));
                continue;
            }
            let Some(facts) = snapshot.files.get(&path) else {
                self.push(new_op(Action::Error, agent, name, Some(path), NOT_READ));
                continue;
            };
            let rendered = render::render_file(location.format, agent, definition);
            let (op, change) = match &facts.state {
                FileState::File(bytes) => {
                    let managed = render::is_managed(location.format, name, bytes);
                    // Another tool's file with its exact marker for this name, adopted on request.
                    let adopted = self.auth.adopt.filter(|&tool| {
                        !managed && render::is_adoptable(location.format, tool, name, bytes)
                    });
                    let identical = bytes == rendered.as_bytes();
                    let mut op = self.defined_op(
                        agent,
                        name,
                        path.clone(),
                        managed || adopted.is_some(),
                        identical,
                    );
                    if let Some(tool) = adopted {
                        op.reason = format!(
                            "adopted: generated by {} with the same marker convention; rewritten \
                             with acp-host's marker",
                            tool.tool()
                        );
                    }
                    let change = if op.action == Action::Update {
                        Change::Write(rendered.into_bytes())
                    } else {
                        Change::Keep
                    };
                    (op, change)
                }
                FileState::Missing => (
                    new_op(Action::Create, agent, name, Some(path.clone()), "missing"),
                    Change::Write(rendered.into_bytes()),
                ),
                state => {
                    let reason = unusable(state).unwrap_or_default();
                    let op = new_op(Action::Error, agent, name, Some(path.clone()), reason);
                    (op, Change::Keep)
                }
            };
            let index = self.push(op);
            self.intent(agent, path, Some(facts.clone()), change, vec![index]);
        }
        self.dedicated_orphans(location, folder, defined, snapshot);
    }

    /// Managed files in the agent's folder (`folder`, [`Location::folder`]) whose subagent is no
    /// longer defined for the agent.
    fn dedicated_orphans(
        &mut self,
        location: &Location,
        folder: &Path,
        defined: &[&Definition],
        snapshot: &Snapshot,
    ) {
        let defined: BTreeSet<&str> = defined.iter().map(|d| d.name.as_str()).collect();
        let entries = snapshot.folders.get(folder).map_or(&[][..], Vec::as_slice);
        let names: BTreeSet<String> = entries
            .iter()
            .filter_map(|entry| location.name_of_entry(entry))
            .filter(|name| !defined.contains(name.as_str()))
            .collect();
        for name in names {
            let path = location.path_for(&name);
            let Some(facts) = snapshot.files.get(&path) else {
                continue;
            };
            let FileState::File(bytes) = &facts.state else {
                continue;
            };
            if !render::is_managed(location.format, &name, bytes) {
                // IGNORE (preserve): unmanaged and not defined; not even reported.
                continue;
            }
            let op = self.orphan_op(location.agent, &name, path.clone());
            let change = if op.action == Action::Remove {
                Change::Remove
            } else {
                Change::Keep
            };
            let index = self.push(op);
            self.intent(
                location.agent,
                path,
                Some(facts.clone()),
                change,
                vec![index],
            );
        }
    }

    /// The shared DSH file: every operation folds into one final content.
    fn shared(&mut self, location: &Location, defined: &[&Definition], snapshot: &Snapshot) {
        let agent = location.agent;
        let path = location.path_for("");
        let Some(facts) = snapshot.files.get(&path) else {
            for d in defined {
                self.push(new_op(
                    Action::Error,
                    agent,
                    &d.name,
                    Some(path.clone()),
                    NOT_READ,
                ));
            }
            return;
        };
        let (text, items) = match shared_items(&facts.state) {
            Ok(parsed) => parsed,
            Err(reason) => {
                // Without a list we can neither add nor find orphans; with nothing defined for
                // the agent, the file is not ours to judge and produces no operation.
                let ops: Vec<usize> = defined
                    .iter()
                    .map(|d| {
                        let reason = reason.clone();
                        self.push(new_op(
                            Action::Error,
                            agent,
                            &d.name,
                            Some(path.clone()),
                            reason,
                        ))
                    })
                    .collect();
                if !ops.is_empty() {
                    self.intent(agent, path, Some(facts.clone()), Change::Keep, ops);
                }
                return;
            }
        };
        // Which items claim which subagent, in one pass (a lookup per definition would make the
        // plan quadratic in the number of items).
        let mut claims: BTreeMap<&str, Vec<usize>> = BTreeMap::new();
        for (index, item) in items.iter().enumerate() {
            for name in item.claimed_names() {
                claims.entry(name).or_default().push(index);
            }
        }
        let mut edits = Edits {
            crlf: text.contains("\r\n"),
            ..Edits::default()
        };
        let mut ops: Vec<usize> = defined
            .iter()
            .map(|definition| {
                let claimed = claims
                    .get(definition.name.as_str())
                    .map_or(&[][..], Vec::as_slice);
                let op = self.shared_defined(&path, &text, &items, claimed, definition, &mut edits);
                self.push(op)
            })
            .collect();
        self.shared_orphans(&path, &items, defined, &mut edits, &mut ops);
        if ops.is_empty() {
            return;
        }
        // No edit leaves the text as it is.
        let new = dsh::apply(&text, &items, &edits);
        let change = if new == text {
            Change::Keep
        } else if new.trim().is_empty() && facts.state != FileState::Missing {
            // The last item went: leave no empty file behind (an empty file is not a list).
            Change::Remove
        } else if let Err(reason) = spliced_is_sound(&new) {
            // Fail closed: never write a shared file that no longer parses, or lost an item.
            for &op in &ops {
                let op = &mut self.operations[op];
                op.action = Action::Error;
                op.authorized = false;
                op.reason.clone_from(&reason);
            }
            Change::Keep
        } else {
            Change::Write(new.into_bytes())
        };
        self.intent(agent, path, Some(facts.clone()), change, ops);
    }

    /// Managed items of the shared file whose subagent is no longer defined for dsh: ORPHAN, or
    /// REMOVE (the item's edit) with prune.
    fn shared_orphans(
        &mut self,
        path: &Path,
        items: &[dsh::Item],
        defined: &[&Definition],
        edits: &mut Edits,
        ops: &mut Vec<usize>,
    ) {
        let defined: BTreeSet<&str> = defined.iter().map(|d| d.name.as_str()).collect();
        for (index, item) in items.iter().enumerate() {
            let Some(name) = item.our_name() else {
                continue;
            };
            if defined.contains(name) || !item.managed_for(name) {
                continue;
            }
            let mut op = self.orphan_op("dsh", name, path.to_path_buf());
            op.reason = format!("item at line {}: {}", item.line, op.reason);
            if op.action == Action::Remove {
                edits.items.insert(index, None);
            }
            ops.push(self.push(op));
        }
    }

    /// One defined subagent in the shared file: append, keep, replace in place, or conflict. The
    /// rendering takes the file's line ending.
    fn shared_defined(
        &mut self,
        path: &Path,
        text: &str,
        items: &[dsh::Item],
        claims: &[usize],
        definition: &Definition,
        edits: &mut Edits,
    ) -> Operation {
        let agent = "dsh";
        let name = definition.name.as_str();
        let mut rendered = render::render_dsh_item(definition);
        if edits.crlf {
            // The body's own newlines are LF (definitions are normalized) or escaped.
            rendered = rendered.replace('\n', "\r\n");
        }
        let path = Some(path.to_path_buf());
        match claims {
            [] => {
                edits.appends.push(rendered);
                new_op(
                    Action::Create,
                    agent,
                    name,
                    path,
                    "new item appended to the list",
                )
            }
            &[index] => {
                let item = &items[index];
                let managed = item.managed_for(name);
                let identical = dsh::item_text(text, item) == rendered;
                let mut op = self.defined_op(agent, name, PathBuf::new(), managed, identical);
                op.path = path;
                if !managed {
                    let which = item
                        .id
                        .as_ref()
                        .map_or_else(|| format!("toolName {name}"), |id| format!("id {id}"));
                    let outcome = if op.authorized {
                        "replaced as authorized by --force"
                    } else {
                        "preserved"
                    };
                    op.reason = format!(
                        "item at line {} ({which}) has no acp-host marker (not ours); {outcome}",
                        item.line
                    );
                }
                if op.action == Action::Update {
                    edits.items.insert(index, Some(rendered));
                }
                op
            }
            many => {
                let lines: Vec<String> = many.iter().map(|&i| items[i].line.to_string()).collect();
                let reason = format!(
                    "{} items claim subagent {name} (lines {}); keep one",
                    many.len(),
                    lines.join(", ")
                );
                new_op(Action::Error, agent, name, path, reason)
            }
        }
    }

    /// The plan's three closing jobs: operations in display order, intents folded per physical
    /// file (with collisions), and the forces that matched nothing.
    fn finish(self) -> Plan {
        let Planner {
            auth,
            unwritable,
            operations,
            intents,
            used_forces,
        } = self;
        let (operations, new_index) = display_order(operations);
        let (files, mut errors) = aggregate(intents, &new_index);
        // Refused at plan time, not at the write: a plan that cannot apply writes nothing.
        errors.extend(
            files
                .iter()
                .filter(|f| f.change != Change::Keep)
                .filter_map(|f| unwritable.get(&f.target).cloned()),
        );
        errors.extend(unused_forces(auth, &used_forces, &operations));
        Plan {
            operations,
            files,
            errors,
        }
    }
}

/// Operations sorted by agent (registry order), name and path; and, for each old index, its new
/// one.
fn display_order(operations: Vec<Operation>) -> (Vec<Operation>, Vec<usize>) {
    let agent_rank = |agent: &str| registry::AGENTS.iter().position(|a| a.name == agent);
    let mut order: Vec<usize> = (0..operations.len()).collect();
    order.sort_by(|&a, &b| {
        let (x, y) = (&operations[a], &operations[b]);
        (agent_rank(x.agent), &x.name, &x.path).cmp(&(agent_rank(y.agent), &y.name, &y.path))
    });
    let mut new_index = vec![0; operations.len()];
    for (new, &old) in order.iter().enumerate() {
        new_index[old] = new;
    }
    let mut slots: Vec<Option<Operation>> = operations.into_iter().map(Some).collect();
    let sorted = order.iter().filter_map(|&i| slots[i].take()).collect();
    (sorted, new_index)
}

/// Folds intents per physical file; two different targets on one file are a collision (an
/// error, and the file is kept).
fn aggregate(intents: Vec<Intent>, new_index: &[usize]) -> (Vec<FilePlan>, Vec<String>) {
    let mut errors = Vec::new();
    let mut files: BTreeMap<PathBuf, FilePlan> = BTreeMap::new();
    let mut owners: BTreeMap<PathBuf, (&'static str, PathBuf)> = BTreeMap::new();
    for intent in intents {
        let physical = intent
            .pre_image
            .as_ref()
            .map_or_else(|| intent.target.clone(), |f| f.physical.clone());
        let ops: Vec<usize> = intent.operations.iter().map(|&i| new_index[i]).collect();
        match files.get_mut(&physical) {
            None => {
                owners.insert(physical.clone(), (intent.agent, intent.target.clone()));
                files.insert(
                    physical.clone(),
                    FilePlan {
                        path: physical,
                        target: intent.target,
                        pre_image: intent.pre_image,
                        change: intent.change,
                        operations: ops,
                    },
                );
            }
            Some(existing) => {
                let (agent, target) = &owners[&physical];
                if *agent == intent.agent && *target == intent.target {
                    // Several skipped definitions of one shared file.
                    existing.operations.extend(ops);
                } else {
                    errors.push(format!(
                        "collision: {} is the target of both {agent} ({}) and {} ({}); one file cannot hold two targets — remove the symlink that joins them",
                        physical.display(),
                        target.display(),
                        intent.agent,
                        intent.target.display()
                    ));
                    existing.operations.extend(ops);
                    existing.change = Change::Keep;
                }
            }
        }
    }
    for file in files.values_mut() {
        file.operations.sort_unstable();
    }
    (files.into_values().collect(), errors)
}

/// A plan error for every `--force` that matched no conflict: a force is never silently ignored.
fn unused_forces(
    auth: &Authorization,
    used: &BTreeSet<ForceTarget>,
    operations: &[Operation],
) -> Vec<String> {
    auth.forces
        .difference(used)
        .map(|force| {
            let state = operations
                .iter()
                .find(|op| op.agent == force.agent && op.name == force.name)
                .map_or_else(
                    || "nothing is planned for it".to_owned(),
                    |op| format!("it is {}", op.action.as_str()),
                );
            format!(
                "--force {force} matches no conflict ({state}); drop it — --force only authorizes an existing unmanaged target"
            )
        })
        .collect()
}

#[cfg(test)]
mod tests;
