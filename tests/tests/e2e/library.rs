//! The acp-host library API, driven directly: injected cancellation, observers, and the teardown
//! ladder of the process owner on plain commands. Real processes, no fixed sleeps.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use acp_host::permission::{Decision, DecisionFuture, PermissionHandler};
use acp_host::process::{AgentPipes, AgentProcess, Graces, Rung, SpawnSpec};
use acp_host::run::{self, Cancel, Observer, ObserverError, RunOptions};
use protocol::events::Event;
use protocol::permission::{
    Answer, DecidedBy, OptionKind, Outcome, PermissionPolicy, PermissionRequest, Verdict,
};
use protocol::request::{AgentCommand, StartRequest, Timeouts};
use protocol::result::ErrorKind;
use protocol::status::Status;

use super::common::mock_path;

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

fn request(program: &str, args: &[&str], cwd: &Path) -> StartRequest {
    StartRequest {
        agent: AgentCommand {
            program: PathBuf::from(program),
            args: args.iter().map(|a| (*a).to_owned()).collect(),
            display: program.to_owned(),
            install_hint: None,
        },
        prompt: "hi".into(),
        cwd: cwd.to_path_buf(),
        env: Vec::new(),
        permission: PermissionPolicy::Reject,
        timeouts: Timeouts {
            eof_grace: Duration::from_secs(2),
            term_grace: Duration::from_secs(2),
            ..Timeouts::default()
        },
        max_depth: None,
        wants: protocol::capabilities::Wants::default(),
        resume: None,
        fork: None,
        budget: protocol::usage::Budget::default(),
        on_unreported: protocol::usage::Unreported::default(),
        sandbox: protocol::sandbox::Policy::default(),
    }
}

fn ambient() -> Vec<(OsString, OsString)> {
    std::env::vars_os().collect()
}

/// Records every event; optionally fails or panics on each one.
#[derive(Default)]
struct Recorder {
    events: Mutex<Vec<Event>>,
}

impl Observer for Recorder {
    fn on_event(&self, event: &Event) -> Result<(), ObserverError> {
        self.events.lock().unwrap().push(event.clone());
        Ok(())
    }
}

struct Panicker;

impl Observer for Panicker {
    fn on_event(&self, _event: &Event) -> Result<(), ObserverError> {
        panic!("observer bug");
    }
}

struct Failer;

impl Observer for Failer {
    fn on_event(&self, _event: &Event) -> Result<(), ObserverError> {
        Err("sink is full".into())
    }
}

#[test]
fn a_pre_cancelled_run_spawns_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let sentinel = dir.path().join("spawned");
    let prepared = run::prepare(
        request("touch", &[sentinel.to_str().unwrap()], dir.path()),
        ambient(),
    )
    .unwrap();
    let recorder = Arc::new(Recorder::default());
    let options = RunOptions {
        observers: vec![recorder.clone()],
        ..RunOptions::default()
    };
    let cancel = Cancel::new();
    cancel.cancel();
    let result = runtime().block_on(run::run(prepared, &options, &cancel));
    assert_eq!(result.status, Status::Aborted);
    assert_eq!(result.output, "");
    assert_eq!(result.agent_exit.ended_by, "not-spawned");
    assert!(!sentinel.exists(), "the agent was spawned");
    let events = recorder.events.lock().unwrap();
    assert_eq!(events.len(), 1);
    let Event::End(end) = &events[0] else {
        panic!("expected only the end event: {events:?}");
    };
    assert_eq!(end.status, Status::Aborted);
    assert_eq!(end.last_assistant_message, None);
    assert_eq!(end.run_id, result.run_id);
}

#[test]
fn observers_are_isolated_and_see_start_and_end_with_one_run_id() {
    let dir = tempfile::tempdir().unwrap();
    let prepared = run::prepare(request(mock_path(), &["hello"], dir.path()), ambient()).unwrap();
    let recorder = Arc::new(Recorder::default());
    let options = RunOptions {
        // The failing and panicking observers come first: they must not starve the recorder.
        observers: vec![Arc::new(Failer), Arc::new(Panicker), recorder.clone()],
        ..RunOptions::default()
    };
    let result = runtime().block_on(run::run(prepared, &options, &Cancel::new()));
    assert_eq!(result.status, Status::Completed);
    assert_eq!(result.output, "hello from acp child");
    let events = recorder.events.lock().unwrap();
    let Some(Event::Start(start)) = events.first() else {
        panic!("first event is start: {events:?}");
    };
    let Some(Event::End(end)) = events.last() else {
        panic!("last event is end: {events:?}");
    };
    assert_eq!(start.run_id, result.run_id);
    assert_eq!(end.run_id, result.run_id);
    assert_ne!(start.run_id, start.session_id);
    assert_eq!(
        end.last_assistant_message.as_deref().map(String::as_str),
        Some("hello from acp child")
    );
    assert!(events.iter().any(|e| matches!(e, Event::Update { .. })));
}

#[test]
fn a_crash_with_a_failing_observer_still_yields_one_error() {
    let dir = tempfile::tempdir().unwrap();
    let prepared = run::prepare(
        request(mock_path(), &["crash-on-prompt"], dir.path()),
        ambient(),
    )
    .unwrap();
    let recorder = Arc::new(Recorder::default());
    let options = RunOptions {
        observers: vec![Arc::new(Panicker), recorder.clone()],
        ..RunOptions::default()
    };
    let result = runtime().block_on(run::run(prepared, &options, &Cancel::new()));
    assert_eq!(result.status, Status::Error);
    assert_eq!(result.output, "partial output");
    let ends = recorder
        .events
        .lock()
        .unwrap()
        .iter()
        .filter(|e| matches!(e, Event::End(_)))
        .count();
    assert_eq!(ends, 1);
}

/// Answers on another task, later, by option kind (as a parent relaying to its editor would).
struct Relay {
    answer: Answer,
    seen: Mutex<Vec<PermissionRequest>>,
}

impl PermissionHandler for Relay {
    fn decide(&self, request: PermissionRequest) -> DecisionFuture {
        self.seen.lock().unwrap().push(request);
        let (tx, rx) = tokio::sync::oneshot::channel();
        let answer = self.answer;
        tokio::spawn(async move {
            tokio::task::yield_now().await;
            let _ = tx.send(answer);
        });
        Box::pin(async move {
            Decision {
                answer: rx.await.unwrap(),
                decided_by: DecidedBy::User,
            }
        })
    }
}

#[test]
fn an_async_handler_answers_by_option_kind() {
    let dir = tempfile::tempdir().unwrap();
    let prepared = run::prepare(
        request(
            mock_path(),
            &[
                "permission",
                "--options",
                "allow_once,allow_always,reject_once",
            ],
            dir.path(),
        ),
        ambient(),
    )
    .unwrap();
    let relay = Arc::new(Relay {
        answer: Answer::Kind(OptionKind::AllowAlways),
        seen: Mutex::default(),
    });
    let options = RunOptions {
        permissions: Some(relay.clone()),
        ..RunOptions::default()
    };
    let result = runtime().block_on(run::run(prepared, &options, &Cancel::new()));
    assert_eq!(result.status, Status::Completed, "{result:?}");
    assert_eq!(result.output, "selected allow_always");
    let [decision] = &result.permissions[..] else {
        panic!("one decision: {:?}", result.permissions);
    };
    assert_eq!(decision.verdict, Verdict::Allow);
    assert_eq!(decision.decided_by, DecidedBy::User);
    assert_eq!(
        decision.outcome,
        Outcome::Selected {
            option_id: "allow_always".into(),
            kind: OptionKind::AllowAlways
        }
    );
    let seen = relay.seen.lock().unwrap();
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].tool_call_id, decision.tool_call_id);
    let kinds: Vec<_> = seen[0].offered.iter().map(|o| o.kind.known()).collect();
    assert_eq!(
        kinds,
        [
            Some(OptionKind::AllowOnce),
            Some(OptionKind::AllowAlways),
            Some(OptionKind::RejectOnce)
        ]
    );
}

/// Never answers; cancels the run instead, as a parent whose own turn was cancelled would.
struct CancelsInstead(Cancel);

impl PermissionHandler for CancelsInstead {
    fn decide(&self, _request: PermissionRequest) -> DecisionFuture {
        self.0.cancel();
        Box::pin(std::future::pending())
    }
}

#[test]
fn a_pending_question_is_answered_cancelled_when_the_run_is_cancelled() {
    let dir = tempfile::tempdir().unwrap();
    let prepared =
        run::prepare(request(mock_path(), &["permission"], dir.path()), ambient()).unwrap();
    let cancel = Cancel::new();
    let options = RunOptions {
        permissions: Some(Arc::new(CancelsInstead(cancel.clone()))),
        ..RunOptions::default()
    };
    let result = runtime().block_on(run::run(prepared, &options, &cancel));
    assert_eq!(result.status, Status::Aborted, "{result:?}");
    let [decision] = &result.permissions[..] else {
        panic!("one decision: {:?}", result.permissions);
    };
    assert_eq!(decision.decided_by, DecidedBy::Cancel);
    assert_eq!(decision.verdict, Verdict::Cancelled);
    assert_eq!(decision.outcome, Outcome::Cancelled);
}

#[test]
fn the_agents_stderr_reaches_observers_as_lines_and_never_our_stderr() {
    use std::io::Read as _;
    let dir = tempfile::tempdir().unwrap();
    let prepared = run::prepare(
        request(
            mock_path(),
            &["crash-on-prompt", "--stderr", "mock: starting"],
            dir.path(),
        ),
        ambient(),
    )
    .unwrap();
    let recorder = Arc::new(Recorder::default());
    let options = RunOptions {
        observers: vec![recorder.clone()],
        ..RunOptions::default()
    };
    // Our own stderr goes to a file for the run: a library embedded in an agent must leave the
    // agent's log channel alone.
    let mut captured = tempfile::tempfile().unwrap();
    let saved = nix::unistd::dup(std::io::stderr()).unwrap();
    nix::unistd::dup2_stderr(&captured).unwrap();
    let result = runtime().block_on(run::run(prepared, &options, &Cancel::new()));
    nix::unistd::dup2_stderr(&saved).unwrap();
    let mut ours = String::new();
    captured.read_to_string(&mut ours).unwrap();
    // Other tests of this binary may panic in observers on worker threads meanwhile (their panic
    // messages go to fd 2), so look for the agent's lines only.
    assert!(
        !ours.contains("mock:"),
        "the library echoed the agent's stderr: {ours}"
    );

    assert_eq!(result.status, Status::Error);
    let lines: Vec<_> = recorder
        .events
        .lock()
        .unwrap()
        .iter()
        .filter_map(|e| match e {
            Event::Stderr { run_id, line } => {
                assert_eq!(run_id, &result.run_id);
                Some(line.clone())
            }
            _ => None,
        })
        .collect();
    assert_eq!(lines, ["mock: starting", "mock: fatal error"]);
    assert!(result.stderr_tail.contains("mock: fatal error"));
}

#[test]
fn an_oversized_frame_is_a_protocol_error() {
    let dir = tempfile::tempdir().unwrap();
    let prepared = run::prepare(
        request(mock_path(), &["huge", "--bytes", "100000"], dir.path()),
        ambient(),
    )
    .unwrap();
    let options = RunOptions {
        max_frame_bytes: Some(10_000),
        ..RunOptions::default()
    };
    let result = runtime().block_on(run::run(prepared, &options, &Cancel::new()));
    assert_eq!(result.status, Status::Error);
    assert_eq!(result.error_kind, Some(ErrorKind::Protocol), "{result:?}");
}

#[test]
fn a_relative_cwd_is_refused_by_the_library() {
    let err = run::prepare(request("true", &[], Path::new("relative")), ambient()).unwrap_err();
    assert_eq!(
        err.to_string(),
        "working directory must be absolute: relative (resolve it first, e.g. with resolve_cwd)"
    );
}

/// Spawns a plain command; the pipes are returned so stdin stays open until teardown closes it.
fn spawn(args: &[&str]) -> (AgentProcess, AgentPipes) {
    let spec = SpawnSpec {
        program: PathBuf::from(args[0]),
        args: args[1..].iter().map(|a| (*a).to_owned()).collect(),
        cwd: std::env::temp_dir(),
        env: std::env::vars_os().collect::<BTreeMap<_, _>>(),
        stderr_tail_bytes: 1024,
        stderr_lines: None,
        sandbox: None,
    };
    AgentProcess::spawn(&spec).unwrap()
}

const SHORT: Graces = Graces {
    eof: Duration::from_secs(5),
    term: Duration::from_millis(300),
};

#[test]
fn ladder_eof_rung_for_a_process_that_exits_on_eof() {
    runtime().block_on(async {
        let (mut process, _pipes) = spawn(&["sh", "-c", "read line; exit 0"]);
        let outcome = process.shutdown(SHORT).await;
        assert_eq!(outcome.rung, Rung::Eof);
        assert_eq!(outcome.code, Some(0));
        assert_eq!(outcome.signal, None);
        // Idempotent: a second shutdown reports the same outcome.
        assert_eq!(process.shutdown(SHORT).await, outcome);
    });
}

#[test]
fn each_agent_has_its_own_watchdog_holding_no_other_agents_pipes() {
    runtime().block_on(async {
        // The first agent's stdin is open in the host when the second watchdog is forked: were
        // that fork to keep it, the first agent would never see EOF and would need SIGTERM.
        let (mut first, _first_pipes) = spawn(&["sh", "-c", "read line; exit 0"]);
        let (mut second, _second_pipes) = spawn(&["sleep", "60"]);
        for process in [&first, &second] {
            let stat = std::fs::read_to_string(format!("/proc/{}/stat", process.pid())).unwrap();
            let (_, rest) = stat.rsplit_once(')').unwrap();
            let direct: u32 = rest.split_whitespace().nth(1).unwrap().parse().unwrap();
            assert!(acp_tests::is_watchdog(direct), "agent {}", process.pid());
            let parent = acp_tests::logical_parent(process.pid());
            assert_eq!(parent, Some(std::process::id()), "agent {}", process.pid());
        }
        let outcome = first.shutdown(SHORT).await;
        assert_eq!(outcome.rung, Rung::Eof, "{outcome:?}");
        assert_eq!(outcome.code, Some(0));
        let pid = second.pid();
        let outcome = second
            .shutdown(Graces {
                eof: Duration::from_millis(100),
                term: Duration::from_secs(5),
            })
            .await;
        assert_eq!(outcome.rung, Rung::Term, "{outcome:?}");
        assert!(!acp_tests::process_alive(pid));
    });
}

#[test]
fn an_fd_opened_without_close_on_exec_does_not_reach_the_agent() {
    use std::os::fd::AsRawFd;
    let dir = tempfile::tempdir().unwrap();
    let marker = std::fs::File::open(mock_path()).unwrap();
    // As a C library in the embedding program might leave it: the watchdog starts the agent
    // before it closes what it inherited, so it must make such an fd close-on-exec first.
    let fd = marker.as_raw_fd();
    nix::fcntl::fcntl(
        &marker,
        nix::fcntl::FcntlArg::F_SETFD(nix::fcntl::FdFlag::empty()),
    )
    .unwrap();
    let verdict = dir.path().join("verdict");
    let script = format!(
        "if [ -e /proc/self/fd/{fd} ]; then echo leaked; else echo clean; fi > '{}'; exit 0",
        verdict.display()
    );
    runtime().block_on(async {
        let (mut process, _pipes) = spawn(&["sh", "-c", &script]);
        let outcome = process.shutdown(SHORT).await;
        assert_eq!(outcome.code, Some(0), "{outcome:?}");
    });
    drop(marker);
    assert_eq!(std::fs::read_to_string(&verdict).unwrap(), "clean\n");
}

#[test]
fn ladder_term_rung_for_sleep() {
    runtime().block_on(async {
        let (mut process, _pipes) = spawn(&["sleep", "60"]);
        let outcome = process
            .shutdown(Graces {
                eof: Duration::from_millis(100),
                term: Duration::from_secs(5),
            })
            .await;
        assert_eq!(outcome.rung, Rung::Term);
        assert_eq!(outcome.signal, Some(15));
    });
}

#[test]
fn ladder_kill_rung_for_a_process_trapping_term() {
    runtime().block_on(async {
        let dir = tempfile::tempdir().unwrap();
        let ready = dir.path().join("trapped");
        let script = format!("trap '' TERM; touch {}; sleep 60", ready.display());
        let (mut process, _pipes) = spawn(&["sh", "-c", &script]);
        assert!(acp_tests::wait_for_file(&ready, Duration::from_secs(10)));
        let pid = process.pid();
        let outcome = process
            .shutdown(Graces {
                eof: Duration::from_millis(100),
                term: Duration::from_millis(300),
            })
            .await;
        assert_eq!(outcome.rung, Rung::Kill);
        assert_eq!(outcome.signal, Some(9));
        assert!(outcome.survivors.is_empty());
        assert!(!acp_tests::process_alive(pid));
    });
}

#[test]
fn leftover_group_members_are_terminated_after_the_leader_exits() {
    runtime().block_on(async {
        let dir = tempfile::tempdir().unwrap();
        let pid_file = dir.path().join("grandchild");
        // The leader exits on EOF but leaves a background sleeper in its group.
        let script = format!(
            "sleep 60 & echo $! > {}; read line; exit 0",
            pid_file.display()
        );
        let (mut process, _pipes) = spawn(&["sh", "-c", &script]);
        assert!(acp_tests::wait_for_file(&pid_file, Duration::from_secs(10)));
        assert!(acp_tests::wait_until(Duration::from_secs(10), || {
            acp_tests::read_pid(&pid_file).is_some()
        }));
        let grandchild = acp_tests::read_pid(&pid_file).unwrap();
        let outcome = process.shutdown(SHORT).await;
        assert_eq!(outcome.rung, Rung::Eof);
        assert_eq!(outcome.leftovers, 1);
        assert!(acp_tests::wait_until_dead(
            grandchild,
            Duration::from_secs(10)
        ));
    });
}

#[test]
fn dropping_a_process_kills_its_group() {
    let rt = runtime();
    let pid = rt.block_on(async {
        let (process, _pipes) = spawn(&["sh", "-c", "trap '' TERM; sleep 60"]);
        let pid = process.pid();
        drop(process);
        pid
    });
    assert!(acp_tests::wait_until_dead(pid, Duration::from_secs(10)));
}

/// The agent's pid, from the start event.
fn agent_pid(recorder: &Recorder) -> u32 {
    let events = recorder.events.lock().unwrap();
    events
        .iter()
        .find_map(|event| match event {
            Event::Start(start) => start.pid,
            _ => None,
        })
        .expect("a start event with the agent's pid")
}

/// A kept session on the echo mock: the caller's ends of it, and the run itself.
fn kept_session(
    rt: &tokio::runtime::Runtime,
    dir: &Path,
    recorder: &Arc<Recorder>,
    idle_timeout: Option<Duration>,
    cancel: &Cancel,
    overall: Option<Duration>,
) -> (
    tokio::sync::oneshot::Receiver<protocol::result::RunResult>,
    tokio::sync::mpsc::Sender<run::FollowUp>,
    tokio::task::JoinHandle<protocol::result::RunResult>,
) {
    let mut request = request(mock_path(), &["echo-prompt"], dir);
    request.timeouts.overall = overall;
    let prepared = run::prepare(request, ambient()).unwrap();
    let options = RunOptions {
        observers: vec![recorder.clone()],
        ..RunOptions::default()
    };
    let (first, first_rx) = tokio::sync::oneshot::channel();
    let (follow_ups, follow_ups_rx) = tokio::sync::mpsc::channel(1);
    let session = run::Session {
        first,
        follow_ups: follow_ups_rx,
        idle_timeout,
    };
    let cancel = cancel.clone();
    let running =
        rt.spawn(async move { run::run_session(prepared, &options, &cancel, session).await });
    (first_rx, follow_ups, running)
}

async fn follow_up(
    follow_ups: &tokio::sync::mpsc::Sender<run::FollowUp>,
    prompt: &str,
) -> protocol::result::RunResult {
    let (reply, answer) = tokio::sync::oneshot::channel();
    follow_ups
        .send(run::FollowUp {
            prompt: prompt.into(),
            reply,
        })
        .await
        .expect("the session takes a follow-up");
    tokio::time::timeout(Duration::from_secs(20), answer)
        .await
        .expect("the follow-up is answered in time")
        .expect("the follow-up gets a result")
}

#[test]
fn a_kept_session_answers_each_prompt_in_the_same_process_then_tears_down() {
    let dir = tempfile::tempdir().unwrap();
    let rt = runtime();
    let recorder = Arc::new(Recorder::default());
    let (first, follow_ups, running) =
        kept_session(&rt, dir.path(), &recorder, None, &Cancel::new(), None);
    rt.block_on(async {
        let first = first.await.expect("the first turn's result");
        assert_eq!(first.status, Status::Completed);
        assert_eq!(first.output, "hi");
        assert_eq!(first.agent_exit.ended_by, "alive");
        let pid = agent_pid(&recorder);
        assert!(
            acp_tests::process_alive(pid),
            "the agent stays alive between turns"
        );

        let second = follow_up(&follow_ups, "second prompt").await;
        assert_eq!(second.status, Status::Completed);
        assert_eq!(second.output, "second prompt", "the turn's own output only");
        assert_eq!(second.session_id, first.session_id);
        assert_eq!(second.run_id, first.run_id);
        let third = follow_up(&follow_ups, "third").await;
        assert_eq!(third.output, "third");
        assert_eq!(agent_pid(&recorder), pid);

        drop(follow_ups);
        let last = running.await.unwrap();
        assert_eq!(last.status, Status::Completed);
        assert_eq!(last.agent_exit.ended_by, "eof");
        assert!(!acp_tests::process_alive(pid), "the agent was torn down");
    });
    let events = recorder.events.lock().unwrap();
    let starts = events
        .iter()
        .filter(|e| matches!(e, Event::Start(_)))
        .count();
    let ends = events.iter().filter(|e| matches!(e, Event::End(_))).count();
    assert_eq!((starts, ends), (1, 1), "one run: {events:?}");
}

#[test]
fn a_kept_session_ends_after_its_idle_timeout() {
    let dir = tempfile::tempdir().unwrap();
    let rt = runtime();
    let recorder = Arc::new(Recorder::default());
    let (first, follow_ups, running) = kept_session(
        &rt,
        dir.path(),
        &recorder,
        Some(Duration::from_millis(300)),
        &Cancel::new(),
        None,
    );
    rt.block_on(async {
        assert_eq!(first.await.unwrap().output, "hi");
        let pid = agent_pid(&recorder);
        // The sender is still held: only the idle timeout can end the session.
        let last = tokio::time::timeout(Duration::from_secs(20), running)
            .await
            .expect("the idle session ends")
            .unwrap();
        assert_eq!(last.status, Status::Completed);
        assert_eq!(last.agent_exit.ended_by, "eof");
        assert!(!acp_tests::process_alive(pid));
        assert!(follow_ups.is_closed(), "no further prompt is taken");
    });
}

#[test]
fn cancelling_an_idle_kept_session_tears_it_down() {
    let dir = tempfile::tempdir().unwrap();
    let rt = runtime();
    let recorder = Arc::new(Recorder::default());
    let cancel = Cancel::new();
    let (first, _follow_ups, running) =
        kept_session(&rt, dir.path(), &recorder, None, &cancel, None);
    rt.block_on(async {
        assert_eq!(first.await.unwrap().status, Status::Completed);
        let pid = agent_pid(&recorder);
        cancel.cancel();
        let last = tokio::time::timeout(Duration::from_secs(20), running)
            .await
            .expect("the cancelled session ends")
            .unwrap();
        assert_eq!(last.status, Status::Aborted);
        assert!(!acp_tests::process_alive(pid));
    });
}

#[test]
fn the_overall_timeout_counts_per_turn_and_not_while_idle() {
    let dir = tempfile::tempdir().unwrap();
    let rt = runtime();
    let recorder = Arc::new(Recorder::default());
    let limit = Duration::from_millis(1500);
    let (first, follow_ups, mut running) = kept_session(
        &rt,
        dir.path(),
        &recorder,
        None,
        &Cancel::new(),
        Some(limit),
    );
    rt.block_on(async {
        assert_eq!(first.await.unwrap().status, Status::Completed);
        // Idle for longer than the limit: a deadline counted over the whole session would end it
        // now, or time the next turn out at once. The idle time is what this test is about, so
        // it passes for real, watching the session meanwhile: no event marks "the limit has
        // passed", and a paused tokio clock would need tokio's `test-util` feature in every
        // crate of the suites' build (and a current-thread runtime) to save these 3 s.
        let idle = tokio::time::timeout(limit * 2, &mut running).await;
        assert!(idle.is_err(), "the idle session ended: {idle:?}");
        let second = follow_up(&follow_ups, "still here").await;
        assert_eq!(second.status, Status::Completed);
        assert_eq!(second.output, "still here");
        drop(follow_ups);
        assert_eq!(running.await.unwrap().status, Status::Completed);
    });
}

#[test]
fn a_fork_start_is_refused_before_anything_runs_when_it_is_also_a_resume_or_not_advertised() {
    let dir = tempfile::tempdir().unwrap();
    let both = StartRequest {
        resume: Some("sess-a".into()),
        fork: Some("sess-b".into()),
        ..request(mock_path(), &["hello"], dir.path())
    };
    let error = run::prepare(both, ambient()).unwrap_err();
    assert_eq!(
        error.to_string(),
        "cannot both resume session sess-a and fork session sess-b: a run continues a session \
         (--resume) or starts from a copy of one (--fork); pass one"
    );
    // The mock agent does not advertise `sessionCapabilities.fork`: refused, nothing prompted.
    let log = dir.path().join("log");
    let fork = StartRequest {
        fork: Some("sess-b".into()),
        ..request(
            mock_path(),
            &["hello", "--log", log.to_str().unwrap()],
            dir.path(),
        )
    };
    let prepared = run::prepare(fork, ambient()).unwrap();
    let result = runtime().block_on(run::run(prepared, &RunOptions::default(), &Cancel::new()));
    assert_eq!(result.status, Status::Error);
    assert_eq!(result.error_kind, Some(ErrorKind::Capability));
    assert_eq!(result.forked_from, None);
    assert_eq!(result.session_id, None);
    assert_eq!(std::fs::read_to_string(&log).unwrap(), "initialize\neof\n");
}
