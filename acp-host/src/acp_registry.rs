//! Agents from the official ACP Registry: fetching `registry.json` when the person asks, keeping
//! it in a cache with its source and time, and installing a binary agent into that cache once
//! (download, SHA-256 check, safe unpack, executable bit), so later runs start offline.
//!
//! Invariants: the network is used only by [`RegistryCache::refresh`] (`acp-host agents
//! --refresh` or `--registry URL`) and by the first [`RegistryCache::install`] of an agent's
//! version; everything else reads the cache. Every decision (which distribution, which entries
//! may be unpacked, where things go) is `protocol::acp_registry`'s; this module only does the
//! I/O, and every write goes through `fs_atomic`. An install is unpacked into a staging folder
//! and renamed into place whole, so a failed or interrupted install leaves no folder a later run
//! would take for installed. Downloads, the registry and unpacked archives are bounded
//! ([`MAX_ARCHIVE_BYTES`], [`MAX_REGISTRY_BYTES`], [`MAX_UNPACKED_BYTES`]).

use std::io::{Read, Write as _};
use std::path::{Path, PathBuf};
use std::time::Duration;

use protocol::acp_registry::{
    self, ArchiveKind, BinaryTarget, Manifest, Registry, RegistryError, UnsafeEntry,
};
use protocol::env_vars;
use serde::{Deserialize, Serialize};
use sha2::Digest as _;

use protocol::acp_registry::Choice;
use protocol::registry::{self, Location};
use protocol::request::AgentCommand;

use crate::agents::{self, HostFacts, ResolveError, ResolvedAgent};
use crate::fs_atomic::{self, FsError};

/// The largest archive downloaded.
pub const MAX_ARCHIVE_BYTES: u64 = 512 * 1024 * 1024;
/// The largest `registry.json` read (the official one is well under 1 MiB).
pub const MAX_REGISTRY_BYTES: u64 = 16 * 1024 * 1024;
/// The most bytes an archive may unpack to.
pub const MAX_UNPACKED_BYTES: u64 = 2 * 1024 * 1024 * 1024;
/// The most entries an archive may hold.
const MAX_ENTRIES: usize = 100_000;
/// How long connecting, or waiting for the next bytes of a response, may take.
const NETWORK_TIMEOUT: Duration = Duration::from_mins(1);
/// The cache's folder under the user's cache directory.
const CACHE_SUBDIR: &str = "acp-host/registry";
/// The cached registry's file inside the cache folder.
const REGISTRY_FILE: &str = "registry.json";

/// Why the registry or an agent from it cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum RegistryCacheError {
    #[error(
        "no cache directory: set HOME or XDG_CACHE_HOME (agents from the ACP Registry are kept there)"
    )]
    NoCacheDir,
    #[error("cannot download {url}: {message}")]
    Download { url: String, message: String },
    #[error("cannot download {url}: the server answered {status}")]
    Status { url: String, status: u16 },
    #[error("{url} is larger than {limit} bytes; refusing it")]
    TooLarge { url: String, limit: u64 },
    #[error("cannot read {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Registry(#[from] RegistryError),
    #[error(
        "the cached registry {path} is unreadable ({message}); fetch it again with `acp-host agents --refresh`"
    )]
    BadCache { path: PathBuf, message: String },
    #[error(
        "checksum mismatch for agent {agent}: {url} has SHA-256 {actual}, the registry says {expected}; nothing was installed"
    )]
    Checksum {
        agent: String,
        url: String,
        expected: String,
        actual: String,
    },
    #[error("agent {agent}: {url}: {source}")]
    Unsupported {
        agent: String,
        url: String,
        #[source]
        source: acp_registry::UnsupportedArchive,
    },
    #[error(
        "agent {agent}: refusing the archive {url}: entry {entry:?} is {why}; nothing was installed"
    )]
    UnsafeArchive {
        agent: String,
        url: String,
        entry: String,
        why: UnsafeEntry,
    },
    #[error("agent {agent}: the archive {url} is not a valid {kind} archive: {message}")]
    BadArchive {
        agent: String,
        url: String,
        kind: &'static str,
        message: String,
    },
    #[error(
        "agent {agent}: the archive {url} unpacks to more than {limit} bytes or {MAX_ENTRIES} entries; refusing it"
    )]
    ArchiveTooLarge {
        agent: String,
        url: String,
        limit: u64,
    },
    #[error("agent {agent}: the archive {url} has no file {cmd} (the registry's cmd)")]
    MissingCmd {
        agent: String,
        url: String,
        cmd: String,
    },
    #[error("agent {agent}: the registry's cmd {cmd:?} is {why}")]
    BadCmd {
        agent: String,
        cmd: String,
        why: UnsafeEntry,
    },
    #[error(
        "the registry cache {} {why}: another user could have put what runs from it there; \
         remove it (or make it yours, not writable by others) and run again",
        path.display()
    )]
    UnsafeCache {
        path: PathBuf,
        #[source]
        why: acp_registry::CacheUnsafe,
    },
    #[error(
        "agent {agent}: the installed program {} is not what was installed (its SHA-256 \
         changed, or the install has no record of it); remove {} to install it again",
        program.display(),
        dir.display()
    )]
    Tampered {
        agent: String,
        program: PathBuf,
        dir: PathBuf,
    },
    #[error("agent {agent}: {source}")]
    AgentDownload {
        agent: String,
        #[source]
        source: Box<RegistryCacheError>,
    },
    #[error(transparent)]
    Fs(#[from] FsError),
}

/// The registry as cached: where it came from, when, and what it said.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CachedRegistry {
    /// The path or URL it was read from.
    pub source: String,
    /// When it was read (RFC 3339).
    pub fetched_at: String,
    pub registry: Registry,
}

/// The folder agents from the registry are cached in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RegistryCache {
    root: PathBuf,
}

impl RegistryCache {
    /// The cache at `root`.
    #[must_use]
    pub fn at(root: PathBuf) -> Self {
        RegistryCache { root }
    }

    /// `$XDG_CACHE_HOME/acp-host/registry`, default `~/.cache/acp-host/registry`.
    pub fn from_env() -> Result<Self, RegistryCacheError> {
        let home = std::env::var_os(env_vars::HOME).map(PathBuf::from);
        let xdg = std::env::var_os(env_vars::XDG_CACHE_HOME).map(PathBuf::from);
        env_vars::cache_home(home.as_deref(), xdg.as_deref())
            .map(|dir| RegistryCache::at(dir.join(CACHE_SUBDIR)))
            .ok_or(RegistryCacheError::NoCacheDir)
    }

    /// The cache folder.
    #[must_use]
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The cached registry, if one was fetched.
    pub fn load(&self) -> Result<Option<CachedRegistry>, RegistryCacheError> {
        let path = self.root.join(REGISTRY_FILE);
        // Its agents become programs that run: a cache someone else could write is refused.
        for entry in [
            self.root.parent(),
            Some(self.root.as_path()),
            Some(path.as_path()),
        ]
        .into_iter()
        .flatten()
        {
            check_owned(entry, true)?;
        }
        let bytes = match std::fs::read(&path) {
            Ok(bytes) => bytes,
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(source) => return Err(RegistryCacheError::Read { path, source }),
        };
        let cached: CachedRegistry =
            serde_json::from_slice(&bytes).map_err(|err| RegistryCacheError::BadCache {
                path: path.clone(),
                message: err.to_string(),
            })?;
        // Checked again: the file is ours, but its ids become folder names.
        for agent in &cached.registry.agents {
            agent.check().map_err(|err| RegistryCacheError::BadCache {
                path: path.clone(),
                message: err.to_string(),
            })?;
        }
        Ok(Some(cached))
    }

    /// Reads the registry from `source` (a path, or an `http://` / `https://` URL), checks it,
    /// and caches it with its source and the time; the cache is replaced only by a registry
    /// that parsed.
    pub fn refresh(&self, source: &str) -> Result<CachedRegistry, RegistryCacheError> {
        let bytes = if is_url(source) {
            let mut bytes = Vec::new();
            get(source, MAX_REGISTRY_BYTES, &mut |chunk| {
                bytes.extend_from_slice(chunk);
                Ok(())
            })?;
            bytes
        } else {
            read_bounded(Path::new(source), MAX_REGISTRY_BYTES)?
        };
        let registry = Registry::parse(&bytes, source)?;
        let cached = CachedRegistry {
            source: source.to_owned(),
            fetched_at: jiff::Timestamp::now().to_string(),
            registry,
        };
        let mut text =
            serde_json::to_vec_pretty(&cached).map_err(|err| RegistryCacheError::BadCache {
                path: self.root.join(REGISTRY_FILE),
                message: err.to_string(),
            })?;
        text.push(b'\n');
        fs_atomic::write_atomic(&self.root.join(REGISTRY_FILE), &text)?;
        Ok(cached)
    }

    /// The program of `manifest`'s binary for `platform` when it is already installed here.
    #[must_use]
    pub fn installed(
        &self,
        manifest: &Manifest,
        platform: &str,
        target: &BinaryTarget,
    ) -> Option<PathBuf> {
        let cmd = acp_registry::entry_path(&target.cmd).ok()?;
        let program = self
            .root
            .join(acp_registry::install_dir(manifest, platform))
            .join(cmd);
        crate::installed::is_executable(&program).then_some(program)
    }

    /// Installs `manifest`'s binary for `platform` unless it is installed already, and returns
    /// its program: download (bounded), SHA-256 check when the manifest has one, unpack into a
    /// staging folder (entries checked by `protocol::acp_registry`), the program made
    /// executable, then the folder renamed into place.
    pub fn install(
        &self,
        manifest: &Manifest,
        platform: &str,
        target: &BinaryTarget,
    ) -> Result<PathBuf, RegistryCacheError> {
        let final_dir = self
            .root
            .join(acp_registry::install_dir(manifest, platform));
        if let Some(program) = self.installed(manifest, platform, target) {
            self.verify(&manifest.id, &final_dir, &program)?;
            return Ok(program);
        }
        let agent = &manifest.id;
        let url = &target.archive;
        let cmd =
            acp_registry::entry_path(&target.cmd).map_err(|why| RegistryCacheError::BadCmd {
                agent: agent.clone(),
                cmd: target.cmd.clone(),
                why,
            })?;
        let kind =
            ArchiveKind::from_url(url).map_err(|source| RegistryCacheError::Unsupported {
                agent: agent.clone(),
                url: url.clone(),
                source,
            })?;
        let mut download = fs_atomic::temp_file_in(&self.root.join("downloads"))?;
        let mut hasher = sha2::Sha256::new();
        {
            let file = download.as_file_mut();
            let path = PathBuf::from(url);
            let mut sink = |chunk: &[u8]| {
                hasher.update(chunk);
                file.write_all(chunk)
                    .map_err(|source| RegistryCacheError::Read {
                        path: path.clone(),
                        source,
                    })
            };
            let fetched = if is_url(url) {
                get(url, MAX_ARCHIVE_BYTES, &mut sink)
            } else {
                // A registry read from a file may name archives by path (offline mirrors, tests
                // of a manifest before it is published).
                read_bounded(Path::new(url), MAX_ARCHIVE_BYTES).and_then(|bytes| sink(&bytes))
            };
            fetched.map_err(|err| RegistryCacheError::AgentDownload {
                agent: agent.clone(),
                source: Box::new(err),
            })?;
        }
        let digest = hasher.finalize();
        if let Some(expected) = &target.sha256
            && !acp_registry::sha256_matches(expected, &digest)
        {
            return Err(RegistryCacheError::Checksum {
                agent: agent.clone(),
                url: url.clone(),
                expected: expected.clone(),
                actual: acp_registry::hex(&digest),
            });
        }
        let parent = final_dir.parent().unwrap_or(&self.root);
        let staging = fs_atomic::staging_folder(parent)?;
        // What it unpacks into must be ours alone too (folders made under any umask).
        self.check_chain(parent)?;
        let archive = Unpack {
            agent,
            url,
            dir: staging.path(),
            written: 0,
            entries: 0,
        };
        let file = download
            .reopen()
            .map_err(|source| RegistryCacheError::Read {
                path: download.path().to_path_buf(),
                source,
            })?;
        match kind {
            ArchiveKind::TarGz => archive.tar_gz(file)?,
            ArchiveKind::Zip => archive.zip(file)?,
            ArchiveKind::Raw => archive.raw(file, &cmd)?,
        }
        let program = staging.path().join(&cmd);
        // Followed if a link: links point down, inside the staging folder.
        let is_file = std::fs::metadata(&program).is_ok_and(|m| m.is_file());
        if !is_file {
            return Err(RegistryCacheError::MissingCmd {
                agent: agent.clone(),
                url: url.clone(),
                cmd: target.cmd.clone(),
            });
        }
        fs_atomic::set_mode(&program, 0o755)?;
        // What every start checks the program against, inside the folder that moves whole.
        let record = staging.path().join(acp_registry::INSTALL_RECORD);
        let mut file = fs_atomic::create_new_file(&record, 0o644)?;
        file.write_all(program_digest(&program)?.as_bytes())
            .map_err(|source| RegistryCacheError::Read {
                path: record.clone(),
                source,
            })?;
        drop(file);
        // Another acp-host may have installed the same version meanwhile: either copy will do.
        fs_atomic::rename_folder(staging.path(), &final_dir)?;
        drop(staging);
        let program = final_dir.join(cmd);
        self.verify(agent, &final_dir, &program)?;
        Ok(program)
    }

    /// An installed program may start: every folder from the cache's parent down to it, and the
    /// program, are this user's and nobody else can write them, and the program is the one
    /// installed (its SHA-256 against the install's record).
    fn verify(&self, agent: &str, dir: &Path, program: &Path) -> Result<(), RegistryCacheError> {
        self.check_chain(program.parent().unwrap_or(dir))?;
        check_owned(program, false)?;
        let tampered = || RegistryCacheError::Tampered {
            agent: agent.to_owned(),
            program: program.to_path_buf(),
            dir: dir.to_path_buf(),
        };
        let record =
            read_bounded(&dir.join(acp_registry::INSTALL_RECORD), 128).map_err(|_| tampered())?;
        if record.trim_ascii() != program_digest(program)?.as_bytes() {
            return Err(tampered());
        }
        Ok(())
    }

    /// Every folder from the cache folder's parent down to `dir` (inside the cache) is ours.
    fn check_chain(&self, dir: &Path) -> Result<(), RegistryCacheError> {
        if let Some(parent) = self.root.parent() {
            check_owned(parent, true)?;
        }
        let mut path = self.root.clone();
        check_owned(&path, false)?;
        for part in dir.strip_prefix(&self.root).unwrap_or(Path::new("")) {
            path.push(part);
            check_owned(&path, false)?;
        }
        Ok(())
    }
}

/// `path` is this user's and nobody else may write it (`protocol::acp_registry::
/// check_cache_entry`); a missing one passes when `may_be_missing`.
fn check_owned(path: &Path, may_be_missing: bool) -> Result<(), RegistryCacheError> {
    use std::os::unix::fs::MetadataExt as _;
    let meta = match std::fs::metadata(path) {
        Ok(meta) => meta,
        Err(err) if may_be_missing && err.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(source) => {
            return Err(RegistryCacheError::Read {
                path: path.to_path_buf(),
                source,
            });
        }
    };
    acp_registry::check_cache_entry(meta.uid(), nix::unistd::geteuid().as_raw(), meta.mode())
        .map_err(|why| RegistryCacheError::UnsafeCache {
            path: path.to_path_buf(),
            why,
        })
}

/// The SHA-256 of the file at `path`, lowercase hex.
fn program_digest(path: &Path) -> Result<String, RegistryCacheError> {
    let read = |source| RegistryCacheError::Read {
        path: path.to_path_buf(),
        source,
    };
    let mut file = std::fs::File::open(path).map_err(read)?;
    let mut hasher = sha2::Sha256::new();
    std::io::copy(&mut file, &mut hasher).map_err(read)?;
    Ok(acp_registry::hex(&hasher.finalize()))
}

fn is_url(source: &str) -> bool {
    source.starts_with("http://") || source.starts_with("https://")
}

fn read_bounded(path: &Path, limit: u64) -> Result<Vec<u8>, RegistryCacheError> {
    let read_error = |source| RegistryCacheError::Read {
        path: path.to_path_buf(),
        source,
    };
    let file = std::fs::File::open(path).map_err(read_error)?;
    let mut bytes = Vec::new();
    file.take(limit + 1)
        .read_to_end(&mut bytes)
        .map_err(read_error)?;
    if bytes.len() as u64 > limit {
        return Err(RegistryCacheError::TooLarge {
            url: path.display().to_string(),
            limit,
        });
    }
    Ok(bytes)
}

/// GETs `url`, handing its body to `sink` chunk by chunk, at most `limit` bytes. Runs on a
/// thread of its own with its own runtime, so it may be called from any thread (a CLI's main
/// thread, or beside a runtime that must not block).
fn get(
    url: &str,
    limit: u64,
    sink: &mut (dyn FnMut(&[u8]) -> Result<(), RegistryCacheError> + Send),
) -> Result<(), RegistryCacheError> {
    let download = |message: String| RegistryCacheError::Download {
        url: url.to_owned(),
        message,
    };
    std::thread::scope(|scope| {
        scope
            .spawn(|| {
                let runtime = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .map_err(|err| download(format!("cannot start a runtime: {err}")))?;
                runtime.block_on(async {
                    // reqwest is built without a default crypto provider (the workspace
                    // manifest); installing it twice is harmless.
                    let _ = rustls::crypto::ring::default_provider().install_default();
                    let client = reqwest::Client::builder()
                        .connect_timeout(NETWORK_TIMEOUT)
                        .read_timeout(NETWORK_TIMEOUT)
                        .user_agent(concat!("acp-host/", env!("CARGO_PKG_VERSION")))
                        .build()
                        .map_err(|err| download(report(&err)))?;
                    let mut response = client
                        .get(url)
                        .send()
                        .await
                        .map_err(|err| download(report(&err)))?;
                    let status = response.status();
                    if !status.is_success() {
                        return Err(RegistryCacheError::Status {
                            url: url.to_owned(),
                            status: status.as_u16(),
                        });
                    }
                    let too_large = || RegistryCacheError::TooLarge {
                        url: url.to_owned(),
                        limit,
                    };
                    if response.content_length().is_some_and(|len| len > limit) {
                        return Err(too_large());
                    }
                    let mut received: u64 = 0;
                    while let Some(chunk) = response
                        .chunk()
                        .await
                        .map_err(|err| download(report(&err)))?
                    {
                        received += chunk.len() as u64;
                        if received > limit {
                            return Err(too_large());
                        }
                        sink(&chunk)?;
                    }
                    Ok(())
                })
            })
            .join()
            .unwrap_or_else(|_| Err(download("the download thread panicked".to_owned())))
    })
}

/// An error and its causes, one line (reqwest's own message hides the cause: "error sending
/// request").
fn report(err: &dyn std::error::Error) -> String {
    let mut text = err.to_string();
    let mut source = err.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

/// One archive being unpacked into a staging folder, with its budget.
struct Unpack<'a> {
    agent: &'a str,
    url: &'a str,
    dir: &'a Path,
    written: u64,
    entries: usize,
}

impl Unpack<'_> {
    fn unsafe_entry(&self, entry: &str, why: UnsafeEntry) -> RegistryCacheError {
        RegistryCacheError::UnsafeArchive {
            agent: self.agent.to_owned(),
            url: self.url.to_owned(),
            entry: entry.to_owned(),
            why,
        }
    }

    fn bad(&self, kind: &'static str, err: &dyn std::error::Error) -> RegistryCacheError {
        RegistryCacheError::BadArchive {
            agent: self.agent.to_owned(),
            url: self.url.to_owned(),
            kind,
            message: report(err),
        }
    }

    fn too_large(&self) -> RegistryCacheError {
        RegistryCacheError::ArchiveTooLarge {
            agent: self.agent.to_owned(),
            url: self.url.to_owned(),
            limit: MAX_UNPACKED_BYTES,
        }
    }

    /// Counts one more entry against the budget.
    fn count(&mut self) -> Result<(), RegistryCacheError> {
        self.entries += 1;
        if self.entries > MAX_ENTRIES {
            return Err(self.too_large());
        }
        Ok(())
    }

    /// Writes one regular file at the checked relative `path`, streaming from `from`, keeping
    /// only the permission bits of `mode` (no setuid, setgid or sticky bit).
    fn file(
        &mut self,
        path: &Path,
        mode: u32,
        from: &mut dyn Read,
    ) -> Result<(), RegistryCacheError> {
        let target = self.dir.join(path);
        if let Some(parent) = target.parent() {
            fs_atomic::create_folder(parent)?;
        }
        // Never writable by others, whatever the archive or the umask says.
        let mut file = fs_atomic::create_new_file(&target, (mode & 0o755) | 0o600)?;
        let budget = MAX_UNPACKED_BYTES - self.written;
        let copied = std::io::copy(&mut from.take(budget + 1), &mut file).map_err(|source| {
            RegistryCacheError::Read {
                path: PathBuf::from(self.url),
                source,
            }
        })?;
        if copied > budget {
            return Err(self.too_large());
        }
        self.written += copied;
        Ok(())
    }

    fn tar_gz(mut self, file: std::fs::File) -> Result<(), RegistryCacheError> {
        let mut archive = tar::Archive::new(flate2::read::GzDecoder::new(file));
        // Links are made last, so no entry is ever written through one.
        let mut links = Vec::new();
        let entries = archive.entries().map_err(|err| self.bad("tar.gz", &err))?;
        for entry in entries {
            let mut entry = entry.map_err(|err| self.bad("tar.gz", &err))?;
            self.count()?;
            let raw = entry.path_bytes();
            let name = std::str::from_utf8(&raw)
                .map_err(|_| {
                    self.unsafe_entry(&String::from_utf8_lossy(&raw), UnsafeEntry::BadName)
                })?
                .to_owned();
            let kind = entry.header().entry_type();
            if kind.is_pax_global_extensions() || kind.is_pax_local_extensions() {
                continue;
            }
            let path = acp_registry::entry_path(&name).map_err(|why| self.unsafe_entry(&name, why));
            // A folder entry `./` is the archive's own root.
            if kind.is_dir() {
                match path {
                    Ok(path) => fs_atomic::create_folder(&self.dir.join(path))?,
                    Err(RegistryCacheError::UnsafeArchive {
                        why: UnsafeEntry::Empty,
                        ..
                    }) => {}
                    Err(err) => return Err(err),
                }
                continue;
            }
            let path = path?;
            if kind.is_file() || kind == tar::EntryType::Continuous {
                let mode = entry
                    .header()
                    .mode()
                    .map_err(|err| self.bad("tar.gz", &err))?;
                self.file(&path, mode, &mut entry)?;
            } else if kind.is_symlink() {
                let target = entry
                    .link_name_bytes()
                    .and_then(|t| std::str::from_utf8(&t).ok().map(str::to_owned))
                    .filter(|t| acp_registry::link_target_ok(t))
                    .ok_or_else(|| self.unsafe_entry(&name, UnsafeEntry::LinkEscapes))?;
                links.push((path, target));
            } else {
                return Err(self.unsafe_entry(&name, UnsafeEntry::Kind));
            }
        }
        self.links(links)
    }

    fn zip(mut self, file: std::fs::File) -> Result<(), RegistryCacheError> {
        let mut archive = zip::ZipArchive::new(file).map_err(|err| self.bad("zip", &err))?;
        let mut links = Vec::new();
        for index in 0..archive.len() {
            self.count()?;
            let mut entry = archive
                .by_index(index)
                .map_err(|err| self.bad("zip", &err))?;
            let name = match entry.name() {
                Ok(name) => name.into_owned(),
                Err(_) => return Err(self.unsafe_entry("(not UTF-8)", UnsafeEntry::BadName)),
            };
            if entry.is_dir() {
                match acp_registry::entry_path(&name) {
                    Ok(path) => fs_atomic::create_folder(&self.dir.join(path))?,
                    Err(UnsafeEntry::Empty) => {}
                    Err(why) => return Err(self.unsafe_entry(&name, why)),
                }
                continue;
            }
            let path =
                acp_registry::entry_path(&name).map_err(|why| self.unsafe_entry(&name, why))?;
            if entry.is_symlink() {
                let mut target = String::new();
                (&mut entry)
                    .take(4096)
                    .read_to_string(&mut target)
                    .map_err(|err| self.bad("zip", &err))?;
                if !acp_registry::link_target_ok(&target) {
                    return Err(self.unsafe_entry(&name, UnsafeEntry::LinkEscapes));
                }
                links.push((path, target));
                continue;
            }
            let mode = entry.unix_mode().unwrap_or(0o644);
            self.file(&path, mode, &mut entry)?;
        }
        self.links(links)
    }

    /// A raw executable: the download is the program itself, at `cmd`.
    fn raw(mut self, mut file: std::fs::File, cmd: &Path) -> Result<(), RegistryCacheError> {
        self.file(cmd, 0o755, &mut file)
    }

    fn links(self, links: Vec<(PathBuf, String)>) -> Result<(), RegistryCacheError> {
        for (path, target) in links {
            let link = self.dir.join(path);
            if let Some(parent) = link.parent() {
                fs_atomic::create_folder(parent)?;
            }
            fs_atomic::create_symlink(Path::new(&target), &link)?;
        }
        Ok(())
    }
}

/// An agent that cannot be resolved, or whose ACP Registry install failed.
#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    #[error(transparent)]
    Resolve(#[from] ResolveError),
    #[error(transparent)]
    Registry(#[from] RegistryCacheError),
    #[error(
        "registry agent {agent} has no distribution for {platform} (binaries for: {binaries}) and no npx or uvx package"
    )]
    NoDistribution {
        agent: String,
        platform: String,
        binaries: String,
    },
}

/// [`agents::resolve`], then the ACP Registry cached in `cache`: a name that is neither one of our
/// table's agents nor a program found here, but an id of the cached registry, runs as the
/// registry says; so does one of our agents whose ACP command is not installed here and whose
/// registry id (`protocol::registry::REGISTRY_IDS`) the cached registry has (its binary for this platform, installed into the cache on first use, else
/// `npx` / `uvx`). Without a cached registry, or for an id it does not know, the answer is
/// [`agents::resolve`]'s (the spawn then says "not found").
pub fn resolve(
    agent: &str,
    facts: &HostFacts,
    cache: Option<&RegistryCache>,
) -> Result<ResolvedAgent, AgentError> {
    let resolved = agents::resolve(agent, facts)?;
    if resolved.location.is_found() {
        return Ok(resolved);
    }
    // Our agent whose command is not installed falls back to its registry id, when it has one;
    // any other name is looked up as an id itself.
    let id = match resolved.spec {
        Some(spec) => match registry::registry_id(spec.name) {
            Some(id) => id,
            None => return Ok(resolved),
        },
        None if acp_registry::valid_id(agent) => agent,
        None => return Ok(resolved),
    };
    let Some(cache) = cache else {
        return Ok(resolved);
    };
    let Some(cached) = cache.load()? else {
        return Ok(resolved);
    };
    let Some(manifest) = cached.registry.find(id) else {
        return Ok(resolved);
    };
    let platform = acp_registry::platform(std::env::consts::OS, std::env::consts::ARCH);
    let choice = manifest
        .choose(platform)
        .ok_or_else(|| AgentError::NoDistribution {
            agent: agent.to_owned(),
            platform: platform.unwrap_or(std::env::consts::OS).to_owned(),
            binaries: manifest.platforms().join(", "),
        })?;
    let env = choice
        .env()
        .iter()
        .map(|(name, value)| (name.clone(), value.clone()))
        .collect();
    let (command, location) = match choice {
        Choice::Binary { platform, target } => {
            let program = cache.install(manifest, platform, target)?;
            let command = AgentCommand {
                program: program.clone(),
                args: target.args.clone(),
                display: agent.to_owned(),
                install_hint: None,
            };
            (command, Location::Given(program))
        }
        Choice::Npx(_) | Choice::Uvx(_) => {
            let mut words = choice.package_command().unwrap_or_default().into_iter();
            let program = words.next().unwrap_or_default();
            let hint = if program == "npx" {
                "install Node.js, which provides npx"
            } else {
                "install uv, which provides uvx: https://docs.astral.sh/uv/"
            };
            let location = facts.locate(&program);
            let command = AgentCommand {
                program: PathBuf::from(&program),
                args: words.collect(),
                display: agent.to_owned(),
                install_hint: Some(hint.to_owned()),
            };
            (command, location)
        }
    };
    Ok(ResolvedAgent {
        command,
        location,
        spec: resolved.spec,
        env,
    })
}
