//! Finding, and reaping, every process an agent left behind, not only its process group.
//!
//! A process that calls `setsid()` (or `setpgid()`) leaves the agent's group, so the group sweep
//! cannot see it. On Linux the parent links in `/proc/<pid>/stat` still lead from it to the agent
//! (or, once its parent died, to the nearest subreaper: the watchdog, or the host after
//! [`crate::process::harden_host`]), so the tree below a pid is found by walking `/proc`: from
//! each pid down through its threads' `children` lists (a few reads for a small tree), or, on a
//! kernel without those lists, by reading every process's `stat`.
//!
//! Invariants: reading `/proc` is best effort (a process may exit mid-walk; an unreadable entry
//! is skipped); zombies count as gone (they run no code); a pid is reaped only when it was named
//! explicitly, never with `waitpid(-1)`, which would steal the exit status of a child tokio (or
//! the library's user) waits for. Elsewhere than Linux the walk finds nothing.

/// `(state, ppid, pgrp)` from a `/proc/<pid>/stat` line; the command name may contain spaces
/// and ')'.
#[cfg(target_os = "linux")]
pub(crate) fn parse_stat(stat: &str) -> Option<(char, i32, i32)> {
    let after_name = &stat[stat.rfind(')')? + 1..];
    let mut fields = after_name.split_whitespace();
    let state = fields.next()?.chars().next()?;
    let ppid = fields.next()?.parse().ok()?;
    let pgrp = fields.next()?.parse().ok()?;
    Some((state, ppid, pgrp))
}

/// One live (non-zombie) process: `(pid, ppid, pgrp)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Entry {
    pub pid: i32,
    pub ppid: i32,
    pub pgrp: i32,
}

/// Every live process this user can see. Empty where there is no `/proc`.
pub(crate) fn processes() -> Vec<Entry> {
    #[cfg(target_os = "linux")]
    {
        let Ok(entries) = std::fs::read_dir("/proc") else {
            return Vec::new();
        };
        entries
            .filter_map(|entry| entry.ok()?.file_name().to_str()?.parse::<i32>().ok())
            .filter_map(|pid| {
                let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
                let (state, ppid, pgrp) = parse_stat(&stat)?;
                (state != 'Z' && state != 'X').then_some(Entry { pid, ppid, pgrp })
            })
            .collect()
    }
    #[cfg(not(target_os = "linux"))]
    Vec::new()
}

/// The live processes below any of `roots` (children, their children, ...), roots excluded.
pub(crate) fn descendants(roots: &[i32]) -> Vec<i32> {
    #[cfg(target_os = "linux")]
    if let Some(found) = walk_children(roots) {
        return found;
    }
    below(&processes(), roots)
}

/// [`descendants`] through the `children` lists; `None` when the kernel has none.
#[cfg(target_os = "linux")]
fn walk_children(roots: &[i32]) -> Option<Vec<i32>> {
    let mut found: Vec<i32> = Vec::new();
    let mut frontier: Vec<i32> = roots.to_vec();
    while let Some(parent) = frontier.pop() {
        // A pid that exited meanwhile has no task directory: nothing below it to find.
        let Ok(tasks) = std::fs::read_dir(format!("/proc/{parent}/task")) else {
            continue;
        };
        for task in tasks.filter_map(Result::ok) {
            let mut path = task.path();
            path.push("children");
            let list = match std::fs::read_to_string(&path) {
                Ok(list) => list,
                Err(err) if err.kind() == std::io::ErrorKind::NotFound && task_exists(&task) => {
                    return None;
                }
                Err(_) => continue,
            };
            for pid in list
                .split_whitespace()
                .filter_map(|p| p.parse::<i32>().ok())
            {
                // A zombie runs nothing and has no children left (they re-parented).
                if !found.contains(&pid) && !roots.contains(&pid) && alive(pid) {
                    found.push(pid);
                    frontier.push(pid);
                }
            }
        }
    }
    found.sort_unstable();
    Some(found)
}

/// Whether the task directory is still there (a `children` file missing from a live task means
/// the kernel does not provide the lists).
#[cfg(target_os = "linux")]
fn task_exists(task: &std::fs::DirEntry) -> bool {
    task.path().join("stat").exists()
}

/// [`descendants`] over a process table already read (pure).
pub(crate) fn below(table: &[Entry], roots: &[i32]) -> Vec<i32> {
    let mut found: Vec<i32> = Vec::new();
    let mut frontier: Vec<i32> = roots.to_vec();
    while let Some(parent) = frontier.pop() {
        for entry in table.iter().filter(|e| e.ppid == parent) {
            if !found.contains(&entry.pid) && !roots.contains(&entry.pid) {
                found.push(entry.pid);
                frontier.push(entry.pid);
            }
        }
    }
    found.sort_unstable();
    found
}

/// Whether `pid` runs (exists and is not a zombie).
pub(crate) fn alive(pid: i32) -> bool {
    #[cfg(target_os = "linux")]
    {
        std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .ok()
            .and_then(|stat| parse_stat(&stat))
            .is_some_and(|(state, ..)| state != 'Z' && state != 'X')
    }
    #[cfg(not(target_os = "linux"))]
    {
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None).is_ok()
    }
}

/// Reaps `pid` if it is our exited child (a re-parented orphan): no zombie is left in a
/// long-lived host. Any other answer (still running, not our child) is fine.
pub(crate) fn reap(pid: i32) {
    use nix::sys::wait::{WaitPidFlag, waitpid};
    let _ = waitpid(nix::unistd::Pid::from_raw(pid), Some(WaitPidFlag::WNOHANG));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[cfg(target_os = "linux")]
    #[test]
    fn parses_stat_with_odd_names() {
        assert_eq!(parse_stat("42 (a b) c) S 7 42 42 0 -1"), Some(('S', 7, 42)));
        assert_eq!(parse_stat("42 (x"), None);
    }

    #[test]
    fn below_follows_parent_links_through_generations_and_skips_others() {
        let entry = |pid, ppid| Entry {
            pid,
            ppid,
            pgrp: pid,
        };
        let table = [
            entry(10, 1),
            entry(11, 10),
            entry(12, 11),
            entry(13, 12),
            entry(20, 1),
            entry(21, 20),
        ];
        assert_eq!(below(&table, &[10]), [11, 12, 13]);
        assert_eq!(below(&table, &[12, 20]), [13, 21]);
        assert!(below(&table, &[99]).is_empty());
    }
}
