//! End-to-end: docs/batch.md's cluster recipes, run as written. Each recipe is the code block
//! after a `<!-- recipe: NAME -->` marker in the docs, read from the file and run with `sh` in a
//! folder of its own, with this build's binaries first on PATH: a change to a recipe is a change
//! to what the test runs.
//!
//! - Slurm: a real single-node Slurm (Debian's `slurm-wlm` and `munge`, started and stopped by
//!   `scripts/slurm-single-node`, as root), the array submitted, one task cancelled mid-run and
//!   resubmitted alone, the results merged: one completed record per line. Waits poll `squeue`
//!   with a deadline. Without root or the packages it says so on stderr and passes without running
//!   (CI installs them: `.ci/run`).
//! - GNU parallel: the documented lines (`--sshlogin`, `--basefile`, `--line-buffer`, the resume,
//!   the merge) with `ssh` replaced by a local stand-in (`PARALLEL_SSH`) that runs each "machine"
//!   in a folder of its own: a real ssh session starts in the user's home, which a test must not
//!   write. rsync (`--basefile`'s copy), the sharding and the resume are real. Without `parallel`
//!   or `rsync` it says so and passes without running.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

use acp_tests::{bin, code, processes_in, run_to_end, stderr, wait_until};
use protocol::env_vars;
use protocol::shard::shard_of;
use serde_json::Value;

use super::common::{mock, temp};

/// How long Slurm may take to schedule, run or end a job (polling `squeue`).
const SLURM_DEADLINE: Duration = Duration::from_secs(90);

/// The code block after `<!-- recipe: NAME -->` in docs/batch.md.
fn recipe(name: &str) -> String {
    let docs =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/batch.md"))
            .expect("docs/batch.md");
    let marker = format!("<!-- recipe: {name} -->");
    let after = &docs[docs
        .find(&marker)
        .unwrap_or_else(|| panic!("no {marker} in docs/batch.md"))..];
    let mut block = String::new();
    for line in after
        .lines()
        .skip_while(|line| !line.starts_with("```"))
        .skip(1)
        .take_while(|line| !line.starts_with("```"))
    {
        block.push_str(line);
        block.push('\n');
    }
    assert!(!block.is_empty(), "{marker} has no code block");
    block
}

/// `sh -c SCRIPT` in `dir`, with this build's binaries first on PATH and `env` set.
fn sh(dir: &Path, script: &str, env: &[(&str, &str)]) -> Output {
    let bin_dir = bin("acp-host").parent().unwrap().to_path_buf();
    let path = std::env::join_paths(std::iter::once(bin_dir).chain(std::env::split_paths(
        &std::env::var_os(env_vars::PATH).unwrap_or_default(),
    )))
    .unwrap();
    let mut cmd = Command::new("sh");
    cmd.args(["-c", script])
        .current_dir(dir)
        .env(env_vars::PATH, path)
        .env_remove("ACP_HOST_LOG")
        .env_remove(env_vars::ACP_HOST_DEPTH)
        .env_remove(env_vars::ACP_HOST_MAX_DEPTH);
    for (name, value) in env {
        cmd.env(name, value);
    }
    run_to_end(&mut cmd)
}

fn which(program: &str) -> bool {
    std::env::var_os(env_vars::PATH)
        .is_some_and(|path| std::env::split_paths(&path).any(|dir| dir.join(program).is_file()))
}

#[expect(clippy::print_stderr, reason = "a skipped test says why, once")]
fn skip(what: &str, why: &str) {
    eprintln!("skipped: the {what} recipe test: {why}");
}

/// An executable shell script at `path`.
fn script(path: &Path, text: &str) {
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::write(path, text).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).unwrap();
}

/// Every record of a results file.
fn read_records(path: &Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .unwrap_or_else(|err| panic!("{}: {err}", path.display()))
        .lines()
        .map(|line| serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line:?}")))
        .collect()
}

/// How many `completed` records each id has, over `records`.
fn completed_per_id(records: &[Value]) -> BTreeMap<String, usize> {
    let mut counts = BTreeMap::new();
    for record in records {
        if record["status"] == "completed" {
            *counts
                .entry(record["id"].as_str().unwrap().to_owned())
                .or_insert(0) += 1;
        }
    }
    counts
}

/// `count` lines `{prefix}1`.. answered by the mock, and one more, the first id of shard `flaky`
/// of `shards`, whose agent is `flaky_agent`; returns every id and the flaky one.
fn jobs(
    dir: &Path,
    prefix: &str,
    count: usize,
    shards: u64,
    flaky_shard: u64,
    flaky_agent: &Path,
) -> (Vec<String>, String) {
    let ids: Vec<String> = (1..=count).map(|n| format!("{prefix}{n}")).collect();
    let flaky = ids
        .iter()
        .find(|id| shard_of(id, shards) == flaky_shard)
        .expect("some id of that shard")
        .clone();
    let echo = mock(&["echo-prompt"]);
    let lines: Vec<String> = ids
        .iter()
        .map(|id| {
            let agent = if *id == flaky {
                flaky_agent.display().to_string()
            } else {
                echo.clone()
            };
            serde_json::json!({"id": id, "prompt": format!("review {id}"), "agent": agent})
                .to_string()
        })
        .collect();
    std::fs::write(dir.join("jobs.ndjson"), lines.join("\n") + "\n").unwrap();
    (ids, flaky)
}

/// A single-node Slurm in a folder of its own, stopped (its jobs cancelled first) when dropped.
struct Slurm {
    folder: tempfile::TempDir,
    conf: String,
}

impl Slurm {
    fn script() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/slurm-single-node")
    }

    /// Starts it; `None` (with the reason printed) where this machine cannot run one.
    fn start() -> Option<Slurm> {
        if !nix::unistd::Uid::effective().is_root() {
            skip("Slurm", "it runs slurmctld and slurmd, which need root");
            return None;
        }
        if let Some(missing) = [
            "munged",
            "slurmctld",
            "slurmd",
            "sbatch",
            "squeue",
            "scancel",
        ]
        .into_iter()
        .find(|program| !which(program) && !Path::new("/usr/sbin").join(program).is_file())
        {
            skip(
                "Slurm",
                &format!("{missing} is not installed (`apt-get install slurm-wlm munge`)"),
            );
            return None;
        }
        let folder = tempfile::tempdir().unwrap();
        let port = || {
            std::net::TcpListener::bind("127.0.0.1:0")
                .unwrap()
                .local_addr()
                .unwrap()
                .port()
                .to_string()
        };
        let out = run_to_end(
            Command::new(Self::script())
                .arg("start")
                .arg(folder.path().join("node"))
                .args([port(), port()])
                .env(env_vars::PATH, "/usr/sbin:/usr/bin:/sbin:/bin"),
        );
        let conf = folder.path().join("node/slurm.conf").display().to_string();
        let slurm = Slurm { folder, conf };
        assert_eq!(
            code(&out),
            0,
            "the single-node Slurm did not start: {}",
            stderr(&out)
        );
        Some(slurm)
    }

    /// A Slurm command (`squeue`, `scontrol`, ...) of this cluster.
    fn command(&self, program: &str) -> Command {
        let mut cmd = Command::new(program);
        cmd.env("SLURM_CONF", &self.conf);
        cmd
    }

    /// The tasks of `job` still in the queue, as `ID STATE` (`12_2 RUNNING`).
    fn queued(&self, job: &str) -> Vec<String> {
        let out = run_to_end(
            self.command("squeue")
                .args(["-h", "-r", "-j", job, "-o", "%i %T"]),
        );
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(str::to_owned)
            .collect()
    }

    /// Waits until `job` is out of the queue.
    fn wait_done(&self, job: &str) {
        assert!(
            wait_until(SLURM_DEADLINE, || self.queued(job).is_empty()),
            "job {job} is still queued: {:?}",
            self.queued(job)
        );
    }

    /// `JobState` of one task (`JOB_TASK`), as `scontrol` says.
    fn state(&self, task: &str) -> String {
        let out = run_to_end(self.command("scontrol").args(["-o", "show", "job", task]));
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        text.split_whitespace()
            .find_map(|field| field.strip_prefix("JobState="))
            .unwrap_or_else(|| panic!("no JobState for {task}: {text}"))
            .to_owned()
    }
}

impl Drop for Slurm {
    fn drop(&mut self) {
        let user = nix::unistd::User::from_uid(nix::unistd::Uid::effective())
            .ok()
            .flatten()
            .map_or_else(|| "root".to_owned(), |user| user.name);
        let _ = run_to_end(self.command("scancel").args(["-u", &user]));
        let out = run_to_end(
            Command::new(Self::script())
                .arg("stop")
                .arg(self.folder.path().join("node")),
        );
        assert!(
            std::thread::panicking() || code(&out) == 0,
            "{}",
            stderr(&out)
        );
    }
}

/// The job id in sbatch's `Submitted batch job 12`.
fn job_id(out: &Output) -> String {
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    text.trim()
        .strip_prefix("Submitted batch job ")
        .unwrap_or_else(|| panic!("sbatch said {text:?}: {}", stderr(out)))
        .to_owned()
}

#[test]
fn the_slurm_recipe_runs_as_written_and_a_cancelled_task_resubmitted_alone_resumes() {
    let Some(slurm) = Slurm::start() else {
        return;
    };
    let dir = temp();
    let work = dir.path();
    // Hangs in its turn until `ok` exists, then answers.
    let blocker = work.join("blocker.sh");
    script(
        &blocker,
        &format!(
            "#!/bin/sh\n[ -e {ok} ] && exec {echo}\nexec {hang}\n",
            ok = work.join("ok").display(),
            echo = mock(&["echo-prompt"]),
            hang = mock(&[
                "hang",
                "--ready",
                &work.join("blocked").display().to_string()
            ]),
        ),
    );
    let (ids, blocked_id) = jobs(work, "s", 24, 4, 2, &blocker);
    std::fs::write(work.join("review-batch.sbatch"), recipe("slurm-script")).unwrap();
    let conf = [("SLURM_CONF", slurm.conf.as_str())];
    let submitted = sh(work, &recipe("slurm-submit"), &conf);
    assert_eq!(code(&submitted), 0, "{}", stderr(&submitted));
    let job = job_id(&submitted);
    // Tasks 0, 1 and 3 end; task 2 hangs on its blocker's turn.
    let task2 = format!("{job}_2");
    assert!(
        wait_until(SLURM_DEADLINE, || work.join("blocked").exists()
            && slurm.queued(&job) == [format!("{task2} RUNNING")]),
        "tasks 0, 1 and 3 did not end with task 2 running: {:?}",
        slurm.queued(&job)
    );
    let cancel = run_to_end(slurm.command("scancel").arg(&task2));
    assert_eq!(code(&cancel), 0, "{}", stderr(&cancel));
    slurm.wait_done(&job);
    assert_eq!(slurm.state(&task2), "CANCELLED");
    for task in [0, 1, 3] {
        assert_eq!(
            slurm.state(&format!("{job}_{task}")),
            "COMPLETED",
            "task {task}"
        );
        assert!(
            work.join(format!("logs/{job}_{task}.err")).is_file(),
            "task {task}'s log"
        );
    }
    // The cancelled task left its blocker's line without a completed record.
    let shard2 = read_records(&work.join("results/results-2.ndjson"));
    assert!(
        !completed_per_id(&shard2).contains_key(&blocked_id),
        "{shard2:?}"
    );

    std::fs::write(work.join("ok"), "").unwrap();
    let rerun = sh(work, &recipe("slurm-rerun"), &conf);
    assert_eq!(code(&rerun), 0, "{}", stderr(&rerun));
    let again = job_id(&rerun);
    slurm.wait_done(&again);
    assert_eq!(slurm.state(&format!("{again}_2")), "COMPLETED");
    let log = std::fs::read_to_string(work.join(format!("logs/{again}_2.err"))).unwrap();
    assert!(
        log.contains("already completed in results/results-2.ndjson"),
        "{log}"
    );

    // Every line has exactly one completed record over the four files, and the merge has each
    // id once, completed.
    let all: Vec<Value> = (0..4)
        .flat_map(|task| read_records(&work.join(format!("results/results-{task}.ndjson"))))
        .collect();
    let once: BTreeMap<String, usize> = ids.iter().map(|id| (id.clone(), 1)).collect();
    assert_eq!(completed_per_id(&all), once);
    let gathered = sh(work, &recipe("slurm-gather"), &conf);
    assert_eq!(code(&gathered), 0, "{}", stderr(&gathered));
    let merged = read_records(&work.join("results.ndjson"));
    assert_eq!(merged.len(), ids.len(), "{merged:?}");
    assert_eq!(completed_per_id(&merged), once);
    assert!(
        wait_until(acp_tests::HANG_GUARD, || processes_in(work).is_empty()),
        "left running: {:?}",
        processes_in(work)
    );
}

#[test]
fn the_gnu_parallel_recipe_runs_as_written_and_resumes() {
    if let Some(missing) = ["parallel", "rsync"]
        .into_iter()
        .find(|program| !which(program))
    {
        skip(
            "GNU parallel",
            &format!("{missing} is not installed (`apt-get install parallel rsync`)"),
        );
        return;
    }
    let dir = temp();
    let local = dir.path().join("local");
    let boxes = dir.path().join("boxes");
    std::fs::create_dir_all(&local).unwrap();
    for host in ["box1", "box2", "box3", "box4"] {
        std::fs::create_dir_all(boxes.join(host)).unwrap();
    }
    // `ssh [OPTIONS] HOST [--] COMMAND...`: COMMAND in the host's folder, as sshd would run it
    // in the user's home.
    let ssh = dir.path().join("ssh");
    script(
        &ssh,
        &format!(
            "#!/bin/sh\nwhile [ $# -gt 0 ]; do case $1 in -l|-p|-o|-i|-F) shift 2;; --) shift; \
             break;; -*) shift;; *) break;; esac; done\nhost=$1; shift\n[ \"${{1-}}\" = -- ] && \
             shift\ncd {}/\"$host\" || exit 255\nexec sh -c \"$*\"\n",
            boxes.display()
        ),
    );
    let flaky = dir.path().join("flaky.sh");
    script(
        &flaky,
        &format!(
            "#!/bin/sh\n[ -e {ok} ] && exec {echo}\nexec {crash}\n",
            ok = dir.path().join("ok").display(),
            echo = mock(&["echo-prompt"]),
            crash = mock(&["crash-on-prompt"]),
        ),
    );
    let (ids, flaky_id) = jobs(&local, "g", 16, 4, 1, &flaky);
    let ssh_path = ssh.display().to_string();
    // GNU parallel keeps its own state in PARALLEL_HOME (default ~/.parallel): here, not there.
    let home = dir.path().join("parallel-home").display().to_string();
    // GNU parallel runs nothing on other machines, and exits 0, when `SHELL` is unset (as on some
    // CI machines): docs/batch.md says to set it, and so does the test.
    let env = &[
        ("PARALLEL_SSH", ssh_path.as_str()),
        ("PARALLEL_HOME", home.as_str()),
        ("SHELL", "/bin/sh"),
    ];
    // The first run: shard 1 fails its flaky line, so one of the four jobs fails.
    let first = sh(&local, &recipe("parallel-run"), env);
    assert_eq!(code(&first), 1, "{}", stderr(&first));
    let results = local.join("results.ndjson");
    let records = read_records(&results);
    assert_eq!(records.len(), ids.len(), "{records:?}");
    assert!(!completed_per_id(&records).contains_key(&flaky_id));
    for host in ["box1", "box2", "box3", "box4"] {
        assert!(
            boxes.join(host).join("jobs.ndjson").is_file(),
            "{host} got the input"
        );
    }
    std::fs::write(dir.path().join("ok"), "").unwrap();
    let resumed = sh(&local, &recipe("parallel-resume"), env);
    assert_eq!(code(&resumed), 0, "{}", stderr(&resumed));
    let records = read_records(&results);
    assert_eq!(
        records.len(),
        ids.len() + 1,
        "only the flaky line ran again: {records:?}"
    );
    let once: BTreeMap<String, usize> = ids.iter().map(|id| (id.clone(), 1)).collect();
    assert_eq!(completed_per_id(&records), once);
    let gathered = sh(&local, &recipe("parallel-gather"), env);
    assert_eq!(code(&gathered), 0, "{}", stderr(&gathered));
    let merged = read_records(&local.join("merged.ndjson"));
    assert_eq!(merged.len(), ids.len());
    assert!(
        merged.iter().all(|record| record["status"] == "completed"),
        "{merged:?}"
    );
    assert!(
        wait_until(acp_tests::HANG_GUARD, || processes_in(dir.path())
            .is_empty()),
        "left running: {:?}",
        processes_in(dir.path())
    );
}
