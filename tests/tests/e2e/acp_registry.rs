//! Agents from the ACP Registry, served from 127.0.0.1 (keyless, offline): `acp-host agents
//! --registry URL` reads and caches a registry; `acp-host run --agent ID` downloads the agent's
//! archive once, checks its SHA-256, unpacks it into the cache and runs it; the second run
//! starts with the server gone. A wrong checksum and unsafe archives are refused with the agent
//! and URL named, leaving nothing installed; `npx` packages become the person's `npx` line.

use std::collections::BTreeMap;
use std::io::Write as _;
use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::process::Command;

use acp_tests::file_server::FileServer;
use acp_tests::{bin, code, processes_in, run_to_end, stderr, stdout};
use protocol::env_vars;
use sha2::Digest as _;

use crate::common::mock_path;

/// The registry's name of this machine's platform.
fn platform() -> &'static str {
    protocol::acp_registry::platform(std::env::consts::OS, std::env::consts::ARCH)
        .expect("the suites run on a platform the registry names")
}

/// A person's machine: HOME, cache, a working folder, a PATH of system tools only.
struct Machine {
    root: tempfile::TempDir,
}

impl Machine {
    fn new() -> Self {
        let root = tempfile::tempdir().unwrap();
        for dir in ["home", "cache", "work", "bin"] {
            std::fs::create_dir(root.path().join(dir)).unwrap();
        }
        Machine { root }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.root.path().join(name)
    }

    fn cache(&self) -> PathBuf {
        self.path("cache/acp-host/registry")
    }

    fn host(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new(bin("acp-host"));
        cmd.current_dir(self.path("work"))
            .env_clear()
            .envs(acp_tests::instrumentation_env())
            .env(env_vars::HOME, self.path("home"))
            .env(env_vars::XDG_CACHE_HOME, self.path("cache"))
            .env(env_vars::XDG_STATE_HOME, self.path("home/state"))
            .env(
                env_vars::PATH,
                format!("{}:/usr/bin:/bin", self.path("bin").display()),
            )
            .args(args);
        cmd
    }

    fn run(&self, agent: &str) -> std::process::Output {
        let out = run_to_end(self.host(&["run", "--agent", agent, "hi"]).args([
            "--eof-grace",
            "2",
            "--term-grace",
            "2",
        ]));
        assert!(
            processes_in(&self.path("work")).is_empty(),
            "a process was left behind"
        );
        out
    }

    /// Every file and folder under the cache, relative to it, sorted.
    fn cache_tree(&self) -> Vec<String> {
        let mut found = Vec::new();
        let mut stack = vec![self.cache()];
        while let Some(dir) = stack.pop() {
            let Ok(entries) = std::fs::read_dir(&dir) else {
                continue;
            };
            for entry in entries {
                let path = entry.unwrap().path();
                found.push(
                    path.strip_prefix(self.cache())
                        .unwrap()
                        .display()
                        .to_string(),
                );
                if path.is_dir() && !path.is_symlink() {
                    stack.push(path);
                }
            }
        }
        found.sort();
        found
    }
}

/// The agent's program: a script that runs the mock agent answering with a text that names the
/// manifest's variable, so a run shows the variable reached the agent.
fn agent_script() -> Vec<u8> {
    format!(
        "#!/bin/sh\nexec '{}' text --text \"hello from the registry, $GREETING\"\n",
        mock_path()
    )
    .into_bytes()
}

/// A .tar.gz of `entries` (name, bytes, mode), written with raw header names (the tar crate's
/// own path setter refuses `..`, which is what the unsafe archives need).
fn tar_gz(entries: &[(&str, &[u8], u32)], links: &[(&str, &str)]) -> Vec<u8> {
    let mut builder = tar::Builder::new(flate2::write::GzEncoder::new(
        Vec::new(),
        flate2::Compression::fast(),
    ));
    for (name, bytes, mode) in entries {
        let mut header = tar::Header::new_gnu();
        raw_name(&mut header, name);
        header.set_size(bytes.len() as u64);
        header.set_mode(*mode);
        header.set_entry_type(tar::EntryType::Regular);
        header.set_cksum();
        builder.append(&header, *bytes).unwrap();
    }
    for (name, target) in links {
        let mut header = tar::Header::new_gnu();
        raw_name(&mut header, name);
        header.set_size(0);
        header.set_entry_type(tar::EntryType::Symlink);
        header.set_link_name(target).unwrap();
        header.set_cksum();
        builder.append(&header, &[][..]).unwrap();
    }
    builder.into_inner().unwrap().finish().unwrap()
}

fn raw_name(header: &mut tar::Header, name: &str) {
    let field = &mut header.as_old_mut().name;
    field.fill(0);
    field[..name.len()].copy_from_slice(name.as_bytes());
}

fn zip_archive(name: &str, bytes: &[u8]) -> Vec<u8> {
    let mut writer = zip::ZipWriter::new(std::io::Cursor::new(Vec::new()));
    let options = zip::write::SimpleFileOptions::default()
        .compression_method(zip::CompressionMethod::Deflated)
        .unix_permissions(0o644);
    writer.start_file(name, options).unwrap();
    writer.write_all(bytes).unwrap();
    writer.finish().unwrap().into_inner()
}

fn sha256(bytes: &[u8]) -> String {
    protocol::acp_registry::hex(&sha2::Sha256::digest(bytes))
}

/// A manifest with a binary for this platform.
fn binary_agent(id: &str, archive: &str, sha256: Option<&str>, cmd: &str) -> serde_json::Value {
    let mut target = serde_json::json!({
        "archive": archive,
        "cmd": cmd,
        "env": {"GREETING": "with its env"},
    });
    if let Some(sha256) = sha256 {
        target["sha256"] = sha256.into();
    }
    serde_json::json!({
        "id": id,
        "name": format!("Test agent {id}"),
        "version": "1.0.0",
        "description": "served from loopback",
        "license": "MIT",
        "distribution": {"binary": {platform(): target}},
    })
}

fn registry(agents: &[serde_json::Value]) -> Vec<u8> {
    serde_json::to_vec(&serde_json::json!({"version": "1.0.0", "agents": agents, "extensions": []}))
        .unwrap()
}

fn serve(files: &[(&str, Vec<u8>)]) -> FileServer {
    FileServer::start(
        files
            .iter()
            .map(|(path, bytes)| ((*path).to_owned(), bytes.clone()))
            .collect::<BTreeMap<_, _>>(),
    )
}

/// Reads the registry from the server into the machine's cache.
fn cache_registry(machine: &Machine, server: &FileServer) {
    let out =
        run_to_end(&mut machine.host(&["agents", "--registry", &server.url("/registry.json")]));
    assert_eq!(code(&out), 0, "{}", stderr(&out));
}

/// The registry's part of an `acp-host agents` listing, whole (our own agents above it depend on
/// the machine's PATH): its source as [REGISTRY], the time it was fetched as [TIME].
fn registry_part(listing: &str, source: &str) -> String {
    let header = format!("\nACP Registry ({source}, fetched ");
    let part = &listing[listing.find(&header).unwrap_or_else(|| panic!("{listing}")) + 1..];
    let fetched = part.find(", fetched ").unwrap() + ", fetched ".len();
    let time_end = fetched + part[fetched..].find(')').unwrap();
    format!("{}[TIME]{}", &part[..fetched], &part[time_end..]).replace(source, "[REGISTRY]")
}

#[test]
fn a_binary_agent_is_downloaded_once_checked_unpacked_and_run_offline_after() {
    let machine = Machine::new();
    let tar = tar_gz(
        &[("./agent/run-agent", &agent_script(), 0o644)],
        &[("agent/link", "run-agent")],
    );
    let zip = zip_archive("bin/zipped-agent", &agent_script());
    // The server's address is only known once it runs: the registry is served by a second one.
    let archives = serve(&[("/a.tar.gz", tar.clone()), ("/z.zip", zip.clone())]);
    let agents = [
        binary_agent(
            "tar-agent",
            &archives.url("/a.tar.gz"),
            Some(&sha256(&tar).to_uppercase()),
            "./agent/run-agent",
        ),
        binary_agent(
            "zip-agent",
            &archives.url("/z.zip"),
            None,
            "bin/zipped-agent",
        ),
    ];
    let index = serve(&[("/registry.json", registry(&agents))]);
    let out =
        run_to_end(&mut machine.host(&["agents", "--registry", &index.url("/registry.json")]));
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    insta::assert_snapshot!(
        "registry_listing",
        registry_part(&stdout(&out), &index.url("/registry.json"))
    );
    assert!(archives.requests().is_empty(), "listing downloads nothing");

    for agent in ["tar-agent", "zip-agent"] {
        let out = machine.run(agent);
        assert_eq!(code(&out), 0, "{agent}: {}", stderr(&out));
        assert_eq!(
            stdout(&out),
            "hello from the registry, with its env",
            "{agent}"
        );
    }
    assert_eq!(archives.requests(), ["/a.tar.gz", "/z.zip"]);
    let install = format!("agents/tar-agent/1.0.0-{}", platform());
    let program = machine.cache().join(&install).join("agent/run-agent");
    assert_eq!(
        std::fs::metadata(&program).unwrap().permissions().mode() & 0o777,
        0o755,
        "made executable"
    );
    assert_eq!(std::fs::read(&program).unwrap(), agent_script());
    assert_eq!(
        std::fs::read_link(machine.cache().join(&install).join("agent/link")).unwrap(),
        Path::new("run-agent")
    );
    // Nothing but the registry, the two installs (each with the record of its program's
    // SHA-256) and the (empty) downloads folder.
    let zip_install = format!("agents/zip-agent/1.0.0-{}", platform());
    assert_eq!(
        machine.cache_tree(),
        [
            "agents".to_owned(),
            "agents/tar-agent".to_owned(),
            install.clone(),
            format!("{install}/.acp-host-sha256"),
            format!("{install}/agent"),
            format!("{install}/agent/link"),
            format!("{install}/agent/run-agent"),
            "agents/zip-agent".to_owned(),
            zip_install.clone(),
            format!("{zip_install}/.acp-host-sha256"),
            format!("{zip_install}/bin"),
            format!("{zip_install}/bin/zipped-agent"),
            "downloads".to_owned(),
            "registry.json".to_owned(),
        ]
    );

    // The network goes away: the cache is enough.
    drop(archives);
    drop(index);
    for agent in ["tar-agent", "zip-agent"] {
        let out = machine.run(agent);
        assert_eq!(code(&out), 0, "{agent} offline: {}", stderr(&out));
        assert_eq!(stdout(&out), "hello from the registry, with its env");
    }
    let out = run_to_end(&mut machine.host(&["agents", "--json"]));
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let json: serde_json::Value = serde_json::from_str(&stdout(&out)).unwrap();
    protocol::schema::check_keys(&protocol::schema::output("agents.json").unwrap(), &json).unwrap();
    let rows = json["registry"]["agents"].as_array().unwrap();
    assert_eq!(rows[0]["id"], "tar-agent");
    assert_eq!(rows[0]["distribution"], "binary");
    assert_eq!(rows[0]["cached"], true);
    assert_eq!(rows[1]["command"], serde_json::json!(["bin/zipped-agent"]));
}

#[test]
fn a_checksum_mismatch_is_refused_naming_the_agent_and_url_and_installs_nothing() {
    let machine = Machine::new();
    let tar = tar_gz(&[("agent/run-agent", &agent_script(), 0o755)], &[]);
    let archives = serve(&[("/a.tar.gz", tar.clone())]);
    let wrong = sha256(b"something else");
    let agents = [binary_agent(
        "sum-agent",
        &archives.url("/a.tar.gz"),
        Some(&wrong),
        "agent/run-agent",
    )];
    let index = serve(&[("/registry.json", registry(&agents))]);
    cache_registry(&machine, &index);
    let out = machine.run("sum-agent");
    assert_eq!(code(&out), 2, "{}", stderr(&out));
    assert_eq!(
        stderr(&out),
        format!(
            "acp-host: error: checksum mismatch for agent sum-agent: {} has SHA-256 {}, the registry says {wrong}; nothing was installed\n",
            archives.url("/a.tar.gz"),
            sha256(&tar)
        )
    );
    assert_eq!(stdout(&out), "");
    assert_eq!(machine.cache_tree(), ["downloads", "registry.json"]);
}

#[test]
fn unsafe_archives_are_refused_and_nothing_lands_outside_the_cache() {
    let machine = Machine::new();
    let script = agent_script();
    // An absolute path a write would reach: the machine's own folder, outside the cache.
    let absolute = machine.path("escaped-absolute");
    let absolute = absolute.to_str().unwrap();
    let cases: [(&str, Vec<u8>, &str, &str); 4] = [
        (
            "dotdot-agent",
            tar_gz(
                &[
                    ("agent/run-agent", &script, 0o755),
                    ("agent/../../../../escaped", b"x", 0o644),
                ],
                &[],
            ),
            "agent/../../../../escaped",
            "a `..` component",
        ),
        (
            "absolute-agent",
            tar_gz(&[(absolute, b"x", 0o644)], &[]),
            absolute,
            "an absolute path",
        ),
        (
            "link-agent",
            tar_gz(
                &[("agent/run-agent", &script, 0o755)],
                &[("agent/etc", "/etc")],
            ),
            "agent/etc",
            "a symlink pointing outside its folder (absolute, or with `..`)",
        ),
        (
            "uplink-agent",
            tar_gz(
                &[("agent/run-agent", &script, 0o755)],
                &[("agent/up", "../../..")],
            ),
            "agent/up",
            "a symlink pointing outside its folder (absolute, or with `..`)",
        ),
    ];
    let files: Vec<(String, Vec<u8>)> = cases
        .iter()
        .map(|(id, bytes, ..)| (format!("/{id}.tar.gz"), bytes.clone()))
        .collect();
    let archives = FileServer::start(files.into_iter().collect());
    let agents: Vec<_> = cases
        .iter()
        .map(|(id, ..)| {
            binary_agent(
                id,
                &archives.url(&format!("/{id}.tar.gz")),
                None,
                "agent/run-agent",
            )
        })
        .collect();
    let index = serve(&[("/registry.json", registry(&agents))]);
    cache_registry(&machine, &index);
    for (id, _, entry, why) in &cases {
        let out = machine.run(id);
        assert_eq!(code(&out), 2, "{id}: {}", stderr(&out));
        assert_eq!(
            stderr(&out),
            format!(
                "acp-host: error: agent {id}: refusing the archive {}: entry {entry:?} is {why}; nothing was installed\n",
                archives.url(&format!("/{id}.tar.gz"))
            ),
            "{id}"
        );
        assert!(
            !machine
                .cache()
                .join(format!("agents/{id}/1.0.0-{}", platform()))
                .exists()
        );
    }
    assert!(!Path::new(absolute).exists());
    assert!(!machine.path("escaped").exists() && !machine.cache().join("escaped").exists());
    let tree = machine.cache_tree();
    assert!(
        tree.iter()
            .all(|p| !p.contains("staging") && !p.contains("download-") && !p.contains("escaped")),
        "{tree:?}"
    );
}

#[test]
fn a_download_failure_names_the_agent_and_url() {
    let machine = Machine::new();
    let archives = serve(&[]);
    let agents = [binary_agent(
        "gone-agent",
        &archives.url("/missing.tar.gz"),
        None,
        "agent/run-agent",
    )];
    let index = serve(&[("/registry.json", registry(&agents))]);
    cache_registry(&machine, &index);
    let out = machine.run("gone-agent");
    assert_eq!(code(&out), 2, "{}", stderr(&out));
    assert_eq!(
        stderr(&out),
        format!(
            "acp-host: error: agent gone-agent: cannot download {}: the server answered 404\n",
            archives.url("/missing.tar.gz")
        )
    );
    // A registry that cannot be fetched leaves the cached one in place.
    let url = archives.url("/registry.json");
    let out = run_to_end(&mut machine.host(&["agents", "--registry", &url]));
    assert_eq!(code(&out), 1);
    assert_eq!(
        stderr(&out),
        format!("acp-host: error: cannot download {url}: the server answered 404\n")
    );
    let out = run_to_end(&mut machine.host(&["agents"]));
    assert!(stdout(&out).contains("gone-agent"), "{}", stdout(&out));
}

/// An npx package runs as the person's `npx --yes PACKAGE ARGS`; a uvx one as `uvx --from
/// PACKAGE CMD ARGS`. Fake `npx` / `uvx` on PATH run the mock agent and say what they were given.
#[test]
fn package_distributions_become_the_persons_npx_and_uvx_lines() {
    let machine = Machine::new();
    for tool in ["npx", "uvx"] {
        let path = machine.path("bin").join(tool);
        std::fs::write(
            &path,
            format!(
                "#!/bin/sh\nexec '{}' text --text \"{tool} $*\"\n",
                mock_path()
            ),
        )
        .unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    let agents = [
        serde_json::json!({"id": "node-agent", "name": "Node agent", "version": "2.0.0", "description": "d",
            "distribution": {"npx": {"package": "@scope/node-agent@2.0.0", "args": ["--acp"]}}}),
        serde_json::json!({"id": "py-agent", "name": "Py agent", "version": "0.3.0", "description": "d",
            "distribution": {"uvx": {"package": "py-agent==0.3.0", "cmd": "py-agent-acp"}}}),
    ];
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("registry.json");
    std::fs::write(&file, registry(&agents)).unwrap();
    let out = run_to_end(&mut machine.host(&["agents", "--registry", file.to_str().unwrap()]));
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    insta::assert_snapshot!(registry_part(&stdout(&out), file.to_str().unwrap()));
    let out = machine.run("node-agent");
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert_eq!(stdout(&out), "npx --yes @scope/node-agent@2.0.0 --acp");
    let out = machine.run("py-agent");
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert_eq!(stdout(&out), "uvx --from py-agent==0.3.0 py-agent-acp");
    // A name neither our table, PATH nor the registry knows is still "not found" by the spawn.
    let out = machine.run("nobody-knows-me");
    assert_ne!(code(&out), 0);
    assert!(stderr(&out).contains("nobody-knows-me"), "{}", stderr(&out));
}

#[test]
fn a_registry_that_is_not_one_is_refused_and_the_cache_kept() {
    let machine = Machine::new();
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad.json");
    std::fs::write(&bad, br#"{"version": "1.0.0", "agents": [{"id": "../evil", "name": "n", "version": "1.0.0", "description": "d", "distribution": {"npx": {"package": "p"}}}]}"#).unwrap();
    let out = run_to_end(&mut machine.host(&["agents", "--registry", bad.to_str().unwrap()]));
    assert_eq!(code(&out), 1);
    assert_eq!(
        stderr(&out),
        "acp-host: error: registry agent \"../evil\" has an invalid id (lowercase letters, digits and hyphens, starting with a letter)\n"
    );
    assert!(!machine.cache().join("registry.json").exists());
    let out = run_to_end(&mut machine.host(&["agents"]));
    assert_eq!(code(&out), 0);
    assert!(
        stdout(&out).ends_with("\nNo ACP Registry cached: `acp-host agents --refresh` fetches it (--registry FILE|URL reads another).\n"),
        "{}",
        stdout(&out)
    );
}

/// Our `codex` is linked to the registry's `codex-acp`: with no codex-acp installed here,
/// `--agent codex` starts the cached registry's binary (and `claude` its npx package); a
/// codex-acp on PATH would win.
#[test]
fn our_agents_fall_back_to_their_registry_ids_when_not_installed() {
    let machine = Machine::new();
    let tar = tar_gz(&[("codex-acp", &agent_script(), 0o755)], &[]);
    let archives = serve(&[("/codex.tar.gz", tar.clone())]);
    let agents = [binary_agent(
        "codex-acp",
        &archives.url("/codex.tar.gz"),
        Some(&sha256(&tar)),
        "./codex-acp",
    )];
    let index = serve(&[("/registry.json", registry(&agents))]);
    let out =
        run_to_end(&mut machine.host(&["agents", "--registry", &index.url("/registry.json")]));
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert!(
        stdout(&out).contains(
            "codex-acp  1.0.0  Test agent codex-acp  binary ./codex-acp (downloaded on first run) \
             [--agent codex runs this when its own command is not installed]\n"
        ),
        "{}",
        stdout(&out)
    );
    let out = machine.run("codex");
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert_eq!(stdout(&out), "hello from the registry, with its env");
    assert_eq!(archives.requests(), ["/codex.tar.gz"]);
    // Installed by the person, their codex-acp is what runs.
    let own = machine.path("bin/codex-acp");
    std::fs::write(
        &own,
        format!("#!/bin/sh\nexec '{}' text --text mine\n", mock_path()),
    )
    .unwrap();
    std::fs::set_permissions(&own, std::fs::Permissions::from_mode(0o755)).unwrap();
    let out = machine.run("codex");
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert_eq!(stdout(&out), "mine");
}

/// A raw executable is the program itself; `.tar.bz2` (listed by the format, not unpacked here)
/// is refused by name before anything is downloaded.
#[test]
fn raw_executables_run_and_unsupported_archives_are_named() {
    let machine = Machine::new();
    let archives = serve(&[
        ("/raw-agent", agent_script()),
        ("/b.tar.bz2", b"BZh".to_vec()),
    ]);
    let agents = [
        binary_agent(
            "raw-agent",
            &archives.url("/raw-agent"),
            Some(&sha256(&agent_script())),
            "./raw-agent",
        ),
        binary_agent("bz-agent", &archives.url("/b.tar.bz2"), None, "agent"),
    ];
    let index = serve(&[("/registry.json", registry(&agents))]);
    cache_registry(&machine, &index);
    let out = machine.run("raw-agent");
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert_eq!(stdout(&out), "hello from the registry, with its env");
    let program = machine
        .cache()
        .join(format!("agents/raw-agent/1.0.0-{}/raw-agent", platform()));
    assert_eq!(
        std::fs::metadata(&program).unwrap().permissions().mode() & 0o777,
        0o755
    );
    let out = machine.run("bz-agent");
    assert_eq!(code(&out), 2);
    assert_eq!(
        stderr(&out),
        format!(
            "acp-host: error: agent bz-agent: {}: .tar.bz2 archives are not supported (supported: .tar.gz, .tgz, .zip, a raw executable)\n",
            archives.url("/b.tar.bz2")
        )
    );
    assert_eq!(archives.requests(), ["/raw-agent"]);
}

/// `--refresh` reads the registry again from where it was last read, and replaces the cache.
#[test]
fn refresh_reads_the_registry_again_from_its_source() {
    let machine = Machine::new();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("registry.json");
    let agent = |id: &str| {
        serde_json::json!({"id": id, "name": id, "version": "1.0.0", "description": "d",
            "distribution": {"npx": {"package": id}}})
    };
    std::fs::write(&file, registry(&[agent("first-agent")])).unwrap();
    let source = file.to_str().unwrap();
    let out = run_to_end(&mut machine.host(&["agents", "--registry", source]));
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    insta::assert_snapshot!(registry_part(&stdout(&out), source));
    std::fs::write(
        &file,
        registry(&[agent("first-agent"), agent("second-agent")]),
    )
    .unwrap();
    // Without --refresh the cache is what is listed.
    let out = run_to_end(&mut machine.host(&["agents"]));
    assert!(!stdout(&out).contains("second-agent"), "{}", stdout(&out));
    let out = run_to_end(&mut machine.host(&["agents", "--refresh", "--json"]));
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let json: serde_json::Value = serde_json::from_str(&stdout(&out)).unwrap();
    assert_eq!(json["registry"]["source"], source);
    let ids: Vec<&str> = json["registry"]["agents"]
        .as_array()
        .unwrap()
        .iter()
        .map(|row| row["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["first-agent", "second-agent"]);
    let cached: serde_json::Value =
        serde_json::from_slice(&std::fs::read(machine.cache().join("registry.json")).unwrap())
            .unwrap();
    assert_eq!(cached["source"], source);
    assert!(
        cached["fetchedAt"].as_str().unwrap().ends_with('Z'),
        "{cached}"
    );
}

/// A manifest's package that starts with `-` would be an option of the person's `npx` (`--call`
/// runs a command): the registry is refused, nothing is cached, and no npx runs.
#[test]
fn a_package_that_is_an_npx_option_is_refused_and_never_reaches_npx() {
    let machine = Machine::new();
    let npx = machine.path("bin").join("npx");
    let ran = machine.path("npx-ran");
    std::fs::write(&npx, format!("#!/bin/sh\ntouch '{}'\n", ran.display())).unwrap();
    std::fs::set_permissions(&npx, std::fs::Permissions::from_mode(0o755)).unwrap();
    let agents = [
        serde_json::json!({"id": "evil", "name": "Evil", "version": "1.0.0",
        "description": "d", "distribution": {"npx": {"package": "--call=touch PWNED"}}}),
    ];
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("registry.json");
    std::fs::write(&file, registry(&agents)).unwrap();
    let out = run_to_end(&mut machine.host(&["agents", "--registry", file.to_str().unwrap()]));
    assert_eq!(code(&out), 1);
    assert_eq!(
        stderr(&out),
        "acp-host: error: registry agent evil has an invalid npx.package \"--call=touch PWNED\": \
         npx would read it as one of its options (a package or command name is not empty and \
         does not start with `-`)\n"
    );
    assert!(!machine.cache().join("registry.json").exists());
    let out = machine.run("evil");
    assert_ne!(code(&out), 0);
    assert!(!ran.exists(), "npx ran");
}

/// The cache is what runs: an install is made under any umask without folders or files others
/// can write; a program changed after its install, or one in a folder others can write (where
/// another user could have planted it), does not start.
#[test]
fn a_tampered_or_exposed_install_does_not_start_and_umask_000_exposes_nothing() {
    let machine = Machine::new();
    let tar = tar_gz(&[("agent/run-agent", &agent_script(), 0o777)], &[]);
    let archives = serve(&[("/a.tar.gz", tar.clone())]);
    let agents = [binary_agent(
        "tar-agent",
        &archives.url("/a.tar.gz"),
        Some(&sha256(&tar)),
        "agent/run-agent",
    )];
    let index = serve(&[("/registry.json", registry(&agents))]);
    cache_registry(&machine, &index);
    // The first run installs under umask 000 (the shell sets it, then execs acp-host).
    let mut first = Command::new("sh");
    first
        .args(["-c", "umask 000 && exec \"$0\" \"$@\""])
        .arg(bin("acp-host"))
        .args(["run", "--agent", "tar-agent", "hi"]);
    let host = machine.host(&[]);
    first.current_dir(machine.path("work")).env_clear();
    for (name, value) in host.get_envs() {
        if let Some(value) = value {
            first.env(name, value);
        }
    }
    let out = run_to_end(&mut first);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let install = machine
        .cache()
        .join(format!("agents/tar-agent/1.0.0-{}", platform()));
    for path in [
        machine.cache(),
        machine.cache().join("agents"),
        machine.cache().join("agents/tar-agent"),
        install.clone(),
        install.join("agent"),
        install.join("agent/run-agent"),
    ] {
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o022, 0, "{} is {mode:o}", path.display());
    }
    // Someone else could write the folder: what is in it may be theirs.
    let agents_dir = machine.cache().join("agents/tar-agent");
    std::fs::set_permissions(&agents_dir, std::fs::Permissions::from_mode(0o777)).unwrap();
    let out = machine.run("tar-agent");
    assert_eq!(code(&out), 2, "{}", stderr(&out));
    assert_eq!(
        stderr(&out),
        format!(
            "acp-host: error: the registry cache {} can be written by other users (mode 777): \
             another user could have put what runs from it there; remove it (or make it yours, \
             not writable by others) and run again\n",
            agents_dir.display()
        )
    );
    std::fs::set_permissions(&agents_dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    assert_eq!(code(&machine.run("tar-agent")), 0);
    // A folder another user owns (only root can make one here: elsewhere this part is skipped).
    if nix::unistd::geteuid().is_root() {
        let nobody = nix::unistd::Uid::from_raw(65534);
        nix::unistd::chown(&agents_dir, Some(nobody), None).unwrap();
        let out = machine.run("tar-agent");
        assert_eq!(code(&out), 2, "{}", stderr(&out));
        assert!(
            stderr(&out).contains(&format!(
                "the registry cache {} is owned by uid 65534, not by this user (uid 0)",
                agents_dir.display()
            )),
            "{}",
            stderr(&out)
        );
        nix::unistd::chown(&agents_dir, Some(nix::unistd::geteuid()), None).unwrap();
    }
    // The program changed after its install: it is not the one checked.
    let program = install.join("agent/run-agent");
    let planted = machine.path("work/PLANTED");
    std::fs::write(
        &program,
        format!("#!/bin/sh\ntouch '{}'\n", planted.display()),
    )
    .unwrap();
    let out = machine.run("tar-agent");
    assert_eq!(code(&out), 2, "{}", stderr(&out));
    assert_eq!(
        stderr(&out),
        format!(
            "acp-host: error: agent tar-agent: the installed program {} is not what was \
             installed (its SHA-256 changed, or the install has no record of it); remove {} to \
             install it again\n",
            program.display(),
            install.display()
        )
    );
    assert!(!planted.exists(), "the planted program ran");
    assert_eq!(archives.requests(), ["/a.tar.gz"]);
}
