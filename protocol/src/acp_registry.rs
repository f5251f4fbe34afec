//! The official ACP Registry's format (agentclientprotocol/registry: `registry.json`, one
//! `agent.json` per agent) and every decision about its entries that needs no I/O: which
//! distribution runs an agent on this platform, the command line of an `npx` / `uvx` package,
//! what kind of archive a URL names, which archive entries may be unpacked, and where an agent is
//! cached.
//!
//! Invariants: an id or version that reaches a path has been checked here first ([`Manifest::check`]:
//! the schema's id pattern, a version of path-safe characters), so no registry entry names a
//! folder outside the cache; an archive entry is unpacked only at the relative, `..`-free path
//! [`entry_path`] returns, and a symlink only when [`link_target_ok`] (relative, pointing down),
//! so nothing an archive holds lands outside its folder. Unknown fields are ignored (the format
//! grows), a wrong type or a missing required field is an error naming the agent.

use std::collections::BTreeMap;
use std::path::{Component, Path, PathBuf};

use serde::{Deserialize, Serialize};

/// Where `acp-host agents --refresh` fetches the registry when no other was named.
pub const DEFAULT_URL: &str =
    "https://cdn.agentclientprotocol.com/registry/v1/latest/registry.json";

/// The aggregated registry (`registry.json`); its `extensions` are not agents and are ignored.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
pub struct Registry {
    pub version: String,
    pub agents: Vec<Manifest>,
}

/// One agent's manifest (`agent.json`).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
pub struct Manifest {
    pub id: String,
    pub name: String,
    pub version: String,
    pub description: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub repository: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub license: Option<String>,
    pub distribution: Distribution,
}

/// How an agent is distributed: any of the three, at least one.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, Serialize)]
pub struct Distribution {
    /// Archives per platform (`linux-x86_64`, `darwin-aarch64`, ...).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub binary: BTreeMap<String, BinaryTarget>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub npx: Option<Package>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uvx: Option<Package>,
}

/// One platform's archive and the command inside it.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
pub struct BinaryTarget {
    /// The archive's URL (`.tar.gz`, `.tgz`, `.zip`, or a raw executable).
    pub archive: String,
    /// The archive's SHA-256, hex; optional in the format.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sha256: Option<String>,
    /// The program, relative to the unpacked archive (`./codex-acp`).
    pub cmd: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub args: Vec<String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
}

/// An npm or `PyPI` package run by the person's `npx` / `uvx`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
pub struct Package {
    /// The package, with an optional version (`@google/gemini-cli@0.27.3`).
    pub package: String,
    /// The package's command, when it is not the package's default one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cmd: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub args: Vec<String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
}

/// The registry cannot be read, or one of its agents is unusable.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RegistryError {
    #[error(
        "{source_name} is not an ACP registry ({message}); point --registry at a registry.json"
    )]
    Parse {
        source_name: String,
        message: String,
    },
    #[error(
        "registry agent {id:?} has an invalid id (lowercase letters, digits and hyphens, starting with a letter)"
    )]
    BadId { id: String },
    #[error(
        "registry agent {id} has an invalid version {version:?} (digits, letters, `.`, `-`, `+`, `_`; starting with a digit)"
    )]
    BadVersion { id: String, version: String },
    #[error("registry agent {id} has no distribution (binary, npx or uvx)")]
    NoDistribution { id: String },
    #[error("registry agent {id} is listed twice")]
    Duplicate { id: String },
    #[error(
        "registry agent {id} has an invalid {tool}.{field} {value:?}: {tool} would read it as one of its \
         options (a package or command name is not empty and does not start with `-`)"
    )]
    BadPackage {
        id: String,
        field: &'static str,
        tool: &'static str,
        value: String,
    },
}

impl Registry {
    /// Parses and checks a `registry.json`; `source_name` (a path or URL) names it in errors.
    pub fn parse(text: &[u8], source_name: &str) -> Result<Registry, RegistryError> {
        let registry: Registry =
            serde_json::from_slice(text).map_err(|err| RegistryError::Parse {
                source_name: source_name.to_owned(),
                message: err.to_string(),
            })?;
        let mut seen = std::collections::BTreeSet::new();
        for agent in &registry.agents {
            agent.check()?;
            if !seen.insert(agent.id.as_str()) {
                return Err(RegistryError::Duplicate {
                    id: agent.id.clone(),
                });
            }
        }
        Ok(registry)
    }

    /// The agent with this id.
    #[must_use]
    pub fn find(&self, id: &str) -> Option<&Manifest> {
        self.agents.iter().find(|agent| agent.id == id)
    }
}

/// Whether `id` matches the schema's id pattern, `^[a-z][a-z0-9-]*$`.
#[must_use]
pub fn valid_id(id: &str) -> bool {
    let mut chars = id.chars();
    chars.next().is_some_and(|c| c.is_ascii_lowercase())
        && chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
}

impl Manifest {
    /// The checks that make the id and version safe to use as folder names.
    pub fn check(&self) -> Result<(), RegistryError> {
        if !valid_id(&self.id) {
            return Err(RegistryError::BadId {
                id: self.id.clone(),
            });
        }
        let version_ok = self.version.len() <= 64
            && self.version.starts_with(|c: char| c.is_ascii_digit())
            && self
                .version
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '+' | '_'));
        if !version_ok {
            return Err(RegistryError::BadVersion {
                id: self.id.clone(),
                version: self.version.clone(),
            });
        }
        let d = &self.distribution;
        if d.binary.is_empty() && d.npx.is_none() && d.uvx.is_none() {
            return Err(RegistryError::NoDistribution {
                id: self.id.clone(),
            });
        }
        // The package and its command are words of the person's `npx` / `uvx` line, before any
        // `--`: one starting with `-` is an option (`npx --call=...` runs a command).
        let packages = [("npx", &d.npx), ("uvx", &d.uvx)];
        for (tool, package) in packages {
            let Some(package) = package else { continue };
            let words = [
                ("package", Some(&package.package)),
                ("cmd", package.cmd.as_ref()),
            ];
            for (field, value) in words {
                if let Some(value) = value.filter(|v| v.is_empty() || v.starts_with('-')) {
                    return Err(RegistryError::BadPackage {
                        id: self.id.clone(),
                        field,
                        tool,
                        value: value.clone(),
                    });
                }
            }
        }
        Ok(())
    }

    /// How this agent runs on `platform` (see [`platform`]): its binary for the platform when
    /// there is one (pinned, no runtime needed), else its npx package, else its uvx package.
    #[must_use]
    pub fn choose(&self, platform: Option<&str>) -> Option<Choice<'_>> {
        let d = &self.distribution;
        platform
            .and_then(|p| d.binary.get_key_value(p))
            .map(|(platform, target)| Choice::Binary { platform, target })
            .or_else(|| d.npx.as_ref().map(Choice::Npx))
            .or_else(|| d.uvx.as_ref().map(Choice::Uvx))
    }

    /// The platforms with a binary, for messages.
    #[must_use]
    pub fn platforms(&self) -> Vec<&str> {
        self.distribution
            .binary
            .keys()
            .map(String::as_str)
            .collect()
    }
}

/// The distribution that runs an agent here.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Choice<'a> {
    Binary {
        platform: &'a str,
        target: &'a BinaryTarget,
    },
    Npx(&'a Package),
    Uvx(&'a Package),
}

impl Choice<'_> {
    /// The kind, as `acp-host agents` says it.
    #[must_use]
    pub fn kind(&self) -> &'static str {
        match self {
            Choice::Binary { .. } => "binary",
            Choice::Npx(_) => "npx",
            Choice::Uvx(_) => "uvx",
        }
    }

    /// The variables the manifest sets for the agent.
    #[must_use]
    pub fn env(&self) -> &BTreeMap<String, String> {
        match self {
            Choice::Binary { target, .. } => &target.env,
            Choice::Npx(package) | Choice::Uvx(package) => &package.env,
        }
    }

    /// The command line of a package distribution: `npx --yes PACKAGE ARGS` (`npx --yes
    /// --package PACKAGE CMD ARGS` with a `cmd`), `uvx PACKAGE ARGS` (`uvx --from PACKAGE CMD
    /// ARGS`). `--yes` because npx would otherwise ask on stdin, which carries the protocol.
    /// `None` for a binary (its program is in the cache).
    #[must_use]
    pub fn package_command(&self) -> Option<Vec<String>> {
        let (mut words, package, flag) = match self {
            Choice::Binary { .. } => return None,
            Choice::Npx(package) => (
                vec!["npx".to_owned(), "--yes".to_owned()],
                package,
                "--package",
            ),
            Choice::Uvx(package) => (vec!["uvx".to_owned()], package, "--from"),
        };
        match &package.cmd {
            Some(cmd) => words.extend([flag.to_owned(), package.package.clone(), cmd.clone()]),
            None => words.push(package.package.clone()),
        }
        words.extend(package.args.iter().cloned());
        Some(words)
    }
}

/// The registry's name of a platform (`std::env::consts::{OS, ARCH}`), when it has one.
#[must_use]
pub fn platform(os: &str, arch: &str) -> Option<&'static str> {
    Some(match (os, arch) {
        ("linux", "x86_64") => "linux-x86_64",
        ("linux", "aarch64") => "linux-aarch64",
        ("macos", "x86_64") => "darwin-x86_64",
        ("macos", "aarch64") => "darwin-aarch64",
        ("windows", "x86_64") => "windows-x86_64",
        ("windows", "aarch64") => "windows-aarch64",
        _ => return None,
    })
}

/// What an archive URL holds, from its name (query and fragment ignored).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ArchiveKind {
    TarGz,
    Zip,
    /// The executable itself.
    Raw,
}

/// Why an archive cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{kind} archives are not supported (supported: .tar.gz, .tgz, .zip, a raw executable)")]
pub struct UnsupportedArchive {
    pub kind: String,
}

impl ArchiveKind {
    pub fn from_url(url: &str) -> Result<ArchiveKind, UnsupportedArchive> {
        /// Name endings, lowercase, and what they hold (`None`: a format not supported).
        const ENDINGS: &[(&str, Option<ArchiveKind>)] = &[
            (".tar.gz", Some(ArchiveKind::TarGz)),
            (".tgz", Some(ArchiveKind::TarGz)),
            (".zip", Some(ArchiveKind::Zip)),
            (".tar.bz2", None),
            (".tbz2", None),
            (".tar.xz", None),
            (".txz", None),
            (".tar.zst", None),
            (".tar", None),
            (".gz", None),
            (".dmg", None),
            (".pkg", None),
            (".deb", None),
            (".rpm", None),
            (".msi", None),
            (".appimage", None),
        ];
        let path = url.split(['?', '#']).next().unwrap_or(url);
        let name = path.rsplit('/').next().unwrap_or(path).to_ascii_lowercase();
        match ENDINGS.iter().find(|(ending, _)| name.ends_with(ending)) {
            Some((_, Some(kind))) => Ok(*kind),
            Some((ending, None)) => Err(UnsupportedArchive {
                kind: (*ending).to_owned(),
            }),
            None => Ok(ArchiveKind::Raw),
        }
    }
}

/// Why an archive entry is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum UnsafeEntry {
    #[error("an absolute path")]
    Absolute,
    #[error("a `..` component")]
    ParentDir,
    #[error("an empty path")]
    Empty,
    #[error("a name that is not UTF-8 or holds a NUL or backslash")]
    BadName,
    #[error("a symlink pointing outside its folder (absolute, or with `..`)")]
    LinkEscapes,
    #[error("a hard link, device or FIFO (only files, folders and symlinks are unpacked)")]
    Kind,
}

/// The relative path an archive entry is unpacked at, inside the archive's folder: `./` parts
/// dropped; absolute paths, `..` anywhere, backslashes (a Windows separator) and NULs refused.
pub fn entry_path(name: &str) -> Result<PathBuf, UnsafeEntry> {
    if name.contains(['\0', '\\']) {
        return Err(UnsafeEntry::BadName);
    }
    let mut path = PathBuf::new();
    for component in Path::new(name).components() {
        match component {
            Component::Normal(part) => path.push(part),
            Component::CurDir => {}
            Component::ParentDir => return Err(UnsafeEntry::ParentDir),
            Component::RootDir | Component::Prefix(_) => return Err(UnsafeEntry::Absolute),
        }
    }
    if path.as_os_str().is_empty() {
        return Err(UnsafeEntry::Empty);
    }
    Ok(path)
}

/// Whether a symlink in an archive may be created: its target is relative and has no `..`, so
/// it points at or below its own folder. Links are created after every file and folder, so no
/// entry is ever written through one; with every link pointing down, none leads out.
#[must_use]
pub fn link_target_ok(target: &str) -> bool {
    !target.is_empty()
        && !target.contains('\0')
        && Path::new(target)
            .components()
            .all(|c| matches!(c, Component::Normal(_) | Component::CurDir))
}

/// Whether a downloaded file's SHA-256 (`actual`, raw bytes) is the manifest's (`expected`,
/// hex, either case).
#[must_use]
pub fn sha256_matches(expected: &str, actual: &[u8]) -> bool {
    expected.eq_ignore_ascii_case(&hex(actual))
}

/// The file, inside an install's folder, that records the SHA-256 of its program as installed:
/// every start checks the program against it.
pub const INSTALL_RECORD: &str = ".acp-host-sha256";

/// Why a folder or file of the registry cache may not be run from: someone other than this user
/// could have put or changed what is there.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CacheUnsafe {
    #[error("is owned by uid {owner}, not by this user (uid {me})")]
    Owner { owner: u32, me: u32 },
    #[error("can be written by other users (mode {mode:o})")]
    Writable { mode: u32 },
}

/// Whether a cache entry owned by `owner` with permission bits `mode` may be trusted by the user
/// `me`: it is theirs, and neither its group nor others may write it.
pub fn check_cache_entry(owner: u32, me: u32, mode: u32) -> Result<(), CacheUnsafe> {
    if owner != me {
        return Err(CacheUnsafe::Owner { owner, me });
    }
    if mode & 0o022 != 0 {
        return Err(CacheUnsafe::Writable {
            mode: mode & 0o7777,
        });
    }
    Ok(())
}

/// Lowercase hex of `bytes`.
#[must_use]
pub fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write as _;
    bytes.iter().fold(String::new(), |mut text, b| {
        let _ = write!(text, "{b:02x}");
        text
    })
}

/// Where a binary agent is unpacked, below the cache folder: `agents/<id>/<version>-<platform>`
/// (both checked by [`Manifest::check`], the platform one of [`platform`]'s names).
#[must_use]
pub fn install_dir(manifest: &Manifest, platform: &str) -> PathBuf {
    Path::new("agents")
        .join(&manifest.id)
        .join(format!("{}-{platform}", manifest.version))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_platform_this_host_may_be_has_its_registry_name() {
        for (os, arch, name) in [
            ("linux", "x86_64", "linux-x86_64"),
            ("linux", "aarch64", "linux-aarch64"),
            ("macos", "x86_64", "darwin-x86_64"),
            ("macos", "aarch64", "darwin-aarch64"),
            ("windows", "x86_64", "windows-x86_64"),
            ("windows", "aarch64", "windows-aarch64"),
        ] {
            assert_eq!(platform(os, arch), Some(name));
        }
        assert_eq!(platform("freebsd", "x86_64"), None);
        assert_eq!(platform("linux", "riscv64"), None);
    }

    #[test]
    fn a_choice_has_its_kind_variables_and_command() {
        let env = BTreeMap::from([("MODE".to_owned(), "acp".to_owned())]);
        let target = BinaryTarget {
            archive: "https://x/a.tar.gz".into(),
            sha256: None,
            cmd: "./a".into(),
            args: Vec::new(),
            env: env.clone(),
        };
        let binary = Choice::Binary {
            platform: "linux-x86_64",
            target: &target,
        };
        assert_eq!(binary.kind(), "binary");
        assert_eq!(binary.env(), &env);
        assert_eq!(
            binary.package_command(),
            None,
            "its program is in the cache"
        );
        let package = Package {
            package: "p".into(),
            cmd: None,
            args: Vec::new(),
            env: BTreeMap::new(),
        };
        assert_eq!(Choice::Uvx(&package).kind(), "uvx");
        assert!(Choice::Npx(&package).env().is_empty());
    }

    fn registry(agents: &str) -> Result<Registry, RegistryError> {
        Registry::parse(
            format!(r#"{{"version": "1.0.0", "agents": [{agents}], "extensions": []}}"#).as_bytes(),
            "test.json",
        )
    }

    const CODEX: &str = r#"{"id": "codex-acp", "name": "Codex CLI", "version": "0.9.2",
        "description": "d", "license": "Apache-2.0", "future-field": 1,
        "distribution": {"binary": {
            "linux-x86_64": {"archive": "https://x/codex.tar.gz", "cmd": "./codex-acp", "sha256": "AB"},
            "darwin-aarch64": {"archive": "https://x/codex-mac.tar.gz", "cmd": "./codex-acp", "args": ["acp"]}},
          "npx": {"package": "@zed-industries/codex-acp@0.9.2"}}}"#;

    #[test]
    fn a_binary_for_this_platform_wins_then_npx_then_uvx() {
        let registry = registry(CODEX).unwrap();
        let codex = registry.find("codex-acp").unwrap();
        let binary = &codex.distribution.binary["linux-x86_64"];
        assert_eq!(
            codex.choose(Some("linux-x86_64")),
            Some(Choice::Binary {
                platform: "linux-x86_64",
                target: binary
            })
        );
        assert_eq!(binary.cmd, "./codex-acp");
        let npx = codex.choose(Some("linux-aarch64")).unwrap();
        assert_eq!(
            npx.package_command().unwrap(),
            ["npx", "--yes", "@zed-industries/codex-acp@0.9.2"]
        );
        assert_eq!(codex.choose(None).unwrap().kind(), "npx");
        let uvx = Package {
            package: "kimi-cli".into(),
            cmd: Some("kimi".into()),
            args: vec!["acp".into()],
            env: BTreeMap::new(),
        };
        assert_eq!(
            Choice::Uvx(&uvx).package_command().unwrap(),
            ["uvx", "--from", "kimi-cli", "kimi", "acp"]
        );
        let npx = Package {
            cmd: None,
            ..uvx.clone()
        };
        assert_eq!(
            Choice::Npx(&npx).package_command().unwrap(),
            ["npx", "--yes", "kimi-cli", "acp"]
        );
    }

    #[test]
    fn ids_and_versions_that_would_leave_the_cache_are_refused() {
        let agent = |id: &str, version: &str| {
            format!(
                r#"{{"id": "{id}", "name": "n", "version": "{version}", "description": "d",
                "distribution": {{"npx": {{"package": "p"}}}}}}"#
            )
        };
        assert!(registry(&agent("ok-1", "1.2.3-beta+4")).is_ok());
        for id in ["../x", "X", "1a", "", "a/b", "a.b"] {
            let refused = registry(&agent(id, "1.0.0"));
            assert!(matches!(refused, Err(RegistryError::BadId { .. })), "{id}");
        }
        for version in ["../1", "1/2", ".1", "", "1 2"] {
            let refused = registry(&agent("a", version));
            assert!(
                matches!(refused, Err(RegistryError::BadVersion { .. })),
                "{version}"
            );
        }
        let twice = format!("{},{}", agent("a", "1.0.0"), agent("a", "1.0.1"));
        assert_eq!(
            registry(&twice).unwrap_err().to_string(),
            "registry agent a is listed twice"
        );
        let package = |distribution: &str| {
            format!(
                r#"{{"id": "a", "name": "n", "version": "1.0.0", "description": "d",
                "distribution": {distribution}}}"#
            )
        };
        assert_eq!(
            registry(&package(r#"{"npx": {"package": "--call=touch PWNED"}}"#))
                .unwrap_err()
                .to_string(),
            "registry agent a has an invalid npx.package \"--call=touch PWNED\": npx would read \
             it as one of its options (a package or command name is not empty and does not start \
             with `-`)"
        );
        for distribution in [
            r#"{"npx": {"package": ""}}"#,
            r#"{"npx": {"package": "p", "cmd": "-x"}}"#,
            r#"{"uvx": {"package": "-p"}}"#,
            r#"{"npx": {"package": "p"}, "uvx": {"package": "p", "cmd": "--from=x"}}"#,
        ] {
            let refused = matches!(
                registry(&package(distribution)),
                Err(RegistryError::BadPackage { .. })
            );
            assert!(refused, "{distribution}");
        }
        assert!(registry(&package(r#"{"uvx": {"package": "p", "cmd": "c"}}"#)).is_ok());
        let none = r#"{"id": "a", "name": "n", "version": "1.0.0", "description": "d", "distribution": {}}"#;
        assert!(matches!(
            registry(none),
            Err(RegistryError::NoDistribution { .. })
        ));
        let err = Registry::parse(b"[]", "https://r/registry.json").unwrap_err();
        assert!(
            err.to_string()
                .starts_with("https://r/registry.json is not an ACP registry (")
        );
    }

    #[test]
    fn archive_kinds_come_from_the_name() {
        assert_eq!(
            ArchiveKind::from_url("https://x/a-1.tar.gz"),
            Ok(ArchiveKind::TarGz)
        );
        assert_eq!(
            ArchiveKind::from_url("https://x/a.TGZ?sig=1"),
            Ok(ArchiveKind::TarGz)
        );
        assert_eq!(
            ArchiveKind::from_url("https://x/a.zip#f"),
            Ok(ArchiveKind::Zip)
        );
        assert_eq!(
            ArchiveKind::from_url("https://x/omp-linux-x64"),
            Ok(ArchiveKind::Raw)
        );
        assert_eq!(
            ArchiveKind::from_url("https://x/a.tar.bz2")
                .unwrap_err()
                .to_string(),
            ".tar.bz2 archives are not supported (supported: .tar.gz, .tgz, .zip, a raw executable)"
        );
        assert!(ArchiveKind::from_url("https://x/a.dmg").is_err());
    }

    #[test]
    fn entries_stay_inside_their_folder() {
        assert_eq!(entry_path("./bin/agent"), Ok(PathBuf::from("bin/agent")));
        assert_eq!(entry_path("agent"), Ok(PathBuf::from("agent")));
        assert_eq!(entry_path("/etc/passwd"), Err(UnsafeEntry::Absolute));
        assert_eq!(entry_path("a/../../x"), Err(UnsafeEntry::ParentDir));
        assert_eq!(entry_path("../x"), Err(UnsafeEntry::ParentDir));
        assert_eq!(entry_path("./"), Err(UnsafeEntry::Empty));
        assert_eq!(entry_path("a\\..\\x"), Err(UnsafeEntry::BadName));
        assert!(link_target_ok("lib/real"));
        assert!(link_target_ok("./real"));
        for target in ["/etc", "..", "a/../../b", "a/..", ""] {
            assert!(!link_target_ok(target), "{target}");
        }
    }

    #[test]
    fn checksums_compare_as_hex_in_either_case() {
        let digest = [0xab, 0x01];
        assert_eq!(hex(&digest), "ab01");
        assert!(sha256_matches("AB01", &digest));
        assert!(!sha256_matches("ab02", &digest));
    }

    #[test]
    fn platforms_and_install_folders() {
        assert_eq!(platform("linux", "x86_64"), Some("linux-x86_64"));
        assert_eq!(platform("macos", "aarch64"), Some("darwin-aarch64"));
        assert_eq!(platform("freebsd", "x86_64"), None);
        let registry = registry(CODEX).unwrap();
        let codex = registry.find("codex-acp").unwrap();
        assert_eq!(
            install_dir(codex, "linux-x86_64"),
            PathBuf::from("agents/codex-acp/0.9.2-linux-x86_64")
        );
        assert_eq!(codex.platforms(), ["darwin-aarch64", "linux-x86_64"]);
    }

    #[test]
    fn a_cache_entry_is_trusted_only_when_it_is_ours_and_nobody_else_writes_it() {
        assert_eq!(check_cache_entry(1000, 1000, 0o40755), Ok(()));
        assert_eq!(check_cache_entry(1000, 1000, 0o100_700), Ok(()));
        assert_eq!(
            check_cache_entry(0, 1000, 0o755),
            Err(CacheUnsafe::Owner { owner: 0, me: 1000 })
        );
        for mode in [0o40777, 0o40775, 0o100_757] {
            assert!(matches!(
                check_cache_entry(1000, 1000, mode),
                Err(CacheUnsafe::Writable { .. })
            ));
        }
        assert_eq!(
            CacheUnsafe::Writable { mode: 0o777 }.to_string(),
            "can be written by other users (mode 777)"
        );
        assert_eq!(
            CacheUnsafe::Owner { owner: 0, me: 1 }.to_string(),
            "is owned by uid 0, not by this user (uid 1)"
        );
    }
}
