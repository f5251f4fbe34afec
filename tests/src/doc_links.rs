//! The documents' link check: every relative link in a set of Markdown files names a file or
//! folder that exists, and every `#anchor` (in the same file or another Markdown file) names a
//! heading there, slugged as GitHub and mdBook slug them.
//!
//! A pure reader of text: [`check`] takes the files to read and returns every broken link with
//! its file and line, so a test can print them all at once. Links inside fenced code blocks and
//! code spans are not links; absolute URLs (`https:`, `mailto:`, ...) are not checked (CI reaches
//! only package registries).

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::path::{Component, Path, PathBuf};

/// One link that does not resolve.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Broken {
    /// The file the link is in, as given to [`check`].
    pub file: PathBuf,
    /// Its line, 1-based.
    pub line: usize,
    /// The link's target as written.
    pub target: String,
    /// What is wrong with it.
    pub problem: String,
}

impl fmt::Display for Broken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}:{}: ({}) {}",
            self.file.display(),
            self.line,
            self.target,
            self.problem
        )
    }
}

/// Every broken link in `files` (Markdown), read from the disk; a file that cannot be read is
/// itself a broken entry (line 0).
#[must_use]
pub fn check(files: &[PathBuf]) -> Vec<Broken> {
    let mut anchors: HashMap<PathBuf, HashSet<String>> = HashMap::new();
    let mut broken = Vec::new();
    for file in files {
        let text = match std::fs::read_to_string(file) {
            Ok(text) => text,
            Err(error) => {
                broken.push(Broken {
                    file: file.clone(),
                    line: 0,
                    target: String::new(),
                    problem: format!("cannot read it: {error}"),
                });
                continue;
            }
        };
        for (line, target) in links(&text) {
            if let Some(problem) = resolve(file, &target, &mut anchors) {
                broken.push(Broken {
                    file: file.clone(),
                    line,
                    target,
                    problem,
                });
            }
        }
    }
    broken
}

/// Why `target`, written in `file`, does not resolve; `None` when it does.
fn resolve(
    file: &Path,
    target: &str,
    anchors: &mut HashMap<PathBuf, HashSet<String>>,
) -> Option<String> {
    if target.is_empty() {
        return Some("an empty link".to_owned());
    }
    if is_absolute_url(target) {
        return None;
    }
    let (path, anchor) = match target.split_once('#') {
        Some((path, anchor)) => (path, Some(anchor)),
        None => (target, None),
    };
    let path = path.split_once('?').map_or(path, |(path, _)| path);
    let resolved = if path.is_empty() {
        file.to_path_buf()
    } else {
        normalize(&file.parent().unwrap_or(Path::new("")).join(path))
    };
    if !resolved.exists() {
        return Some(format!("no such file: {}", resolved.display()));
    }
    let anchor = anchor?;
    if resolved
        .extension()
        .is_none_or(|extension| extension != "md")
    {
        return None;
    }
    let known = anchors.entry(resolved.clone()).or_insert_with(|| {
        std::fs::read_to_string(&resolved)
            .map(|text| headings(&text))
            .unwrap_or_default()
    });
    if known.contains(anchor) {
        None
    } else {
        Some(format!("no heading #{anchor} in {}", resolved.display()))
    }
}

/// `https://...`, `mailto:...` and every other scheme.
fn is_absolute_url(target: &str) -> bool {
    target.split_once(':').is_some_and(|(scheme, _)| {
        !scheme.is_empty()
            && scheme
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "+-.".contains(c))
            && !scheme.contains('/')
    })
}

/// `a/./b/../c` as `a/c`, without touching the disk (a `..` above the start is kept).
fn normalize(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for component in path.components() {
        match component {
            Component::CurDir => {}
            Component::ParentDir
                if matches!(out.components().next_back(), Some(Component::Normal(_))) =>
            {
                out.pop();
            }
            other => out.push(other),
        }
    }
    out
}

/// The lines of `text` outside fenced code blocks, with their 1-based numbers.
fn outside_fences(text: &str) -> Vec<(usize, &str)> {
    let mut fence: Option<&str> = None;
    let mut lines = Vec::new();
    for (index, line) in text.lines().enumerate() {
        let trimmed = line.trim_start();
        let first = trimmed.chars().next().filter(|c| *c == '`' || *c == '~');
        let marker = first.map_or("", |first| {
            &trimmed[..trimmed.find(|c| c != first).unwrap_or(trimmed.len())]
        });
        if let Some(open) = fence {
            if marker.len() >= open.len() && marker.starts_with(&open[..1]) {
                fence = None;
            }
        } else if marker.len() >= 3 {
            fence = Some(marker);
        } else {
            lines.push((index + 1, line));
        }
    }
    lines
}

/// The lines of `text` outside fenced code blocks, with their 1-based numbers and code spans
/// blanked out.
fn prose_lines(text: &str) -> Vec<(usize, String)> {
    outside_fences(text)
        .into_iter()
        .map(|(number, line)| (number, blank_code_spans(line)))
        .collect()
}

/// `line` with the text of its code spans (`` `like this` ``) replaced by spaces.
fn blank_code_spans(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut rest = line;
    while let Some(start) = rest.find('`') {
        let ticks = rest[start..].chars().take_while(|c| *c == '`').count();
        let opener = &rest[start..start + ticks];
        let after = &rest[start + ticks..];
        let Some(end) = after.find(opener) else {
            break;
        };
        out.push_str(&rest[..start]);
        out.push_str(&" ".repeat(ticks + after[..end].chars().count() + ticks));
        rest = &after[end + ticks..];
    }
    out.push_str(rest);
    out
}

/// Every link target of `text` with its line: inline links and images (`[text](target)`) and
/// reference definitions (`[label]: target`).
fn links(text: &str) -> Vec<(usize, String)> {
    let mut found = Vec::new();
    for (number, line) in prose_lines(text) {
        let trimmed = line.trim_start();
        if trimmed.starts_with('[')
            && let Some(close) = trimmed.find("]:")
            && !trimmed[..close].contains("](")
        {
            let target = trimmed[close + 2..].split_whitespace().next().unwrap_or("");
            found.push((number, unangle(target).to_owned()));
            continue;
        }
        let mut rest = line.as_str();
        while let Some(at) = rest.find("](") {
            let after = &rest[at + 2..];
            let end = target_end(after);
            let target = match after.strip_prefix('<') {
                Some(angled) => angled.split('>').next().unwrap_or(""),
                None => after[..end].split_whitespace().next().unwrap_or(""),
            };
            found.push((number, target.to_owned()));
            rest = &after[end..];
        }
    }
    found
}

/// Where an inline link's target (and its optional title) ends: its closing `)`, balanced.
fn target_end(after: &str) -> usize {
    let mut depth = 0usize;
    for (index, c) in after.char_indices() {
        match c {
            '(' => depth += 1,
            ')' if depth == 0 => return index,
            ')' => depth -= 1,
            _ => {}
        }
    }
    after.len()
}

/// `<target>` as `target`.
fn unangle(target: &str) -> &str {
    target
        .strip_prefix('<')
        .and_then(|target| target.strip_suffix('>'))
        .unwrap_or(target)
}

/// The anchors of `text`: each ATX heading's slug (a repeated one gets `-1`, `-2`, ... as on
/// GitHub and in mdBook), and every HTML `id="..."` / `name="..."`.
#[must_use]
pub fn headings(text: &str) -> HashSet<String> {
    let mut anchors = HashSet::new();
    let mut seen: HashMap<String, usize> = HashMap::new();
    for (_, line) in outside_fences(text) {
        let trimmed = line.trim_start();
        for attribute in ["id=\"", "name=\""] {
            let mut rest = line;
            while let Some(at) = rest.find(attribute) {
                let value = &rest[at + attribute.len()..];
                let end = value.find('"').unwrap_or(value.len());
                anchors.insert(value[..end].to_owned());
                rest = &value[end..];
            }
        }
        let level = trimmed.chars().take_while(|c| *c == '#').count();
        if !(1..=6).contains(&level) || !trimmed[level..].starts_with(' ') {
            continue;
        }
        let base = slug(trimmed[level..].trim().trim_end_matches('#').trim());
        let count = seen.entry(base.clone()).or_insert(0);
        let anchor = if *count == 0 {
            base.clone()
        } else {
            format!("{base}-{count}")
        };
        *count += 1;
        anchors.insert(anchor);
    }
    anchors
}

/// A heading's anchor: its text without Markdown (code ticks, link targets, emphasis marks),
/// lowercased, letters, digits, `-` and `_` kept, spaces made `-`, everything else dropped.
#[must_use]
pub fn slug(heading: &str) -> String {
    let mut text = String::with_capacity(heading.len());
    let mut rest = heading;
    // A link's text stays, its target goes: `[text](url)` reads `text`.
    while let Some(at) = rest.find("](") {
        text.push_str(&rest[..at]);
        let after = &rest[at + 2..];
        rest = &after[(target_end(after) + 1).min(after.len())..];
    }
    text.push_str(rest);
    text.chars()
        .filter_map(|c| {
            if c == ' ' {
                Some('-')
            } else if c.is_alphanumeric() || c == '-' || c == '_' {
                Some(c)
            } else {
                None
            }
        })
        .flat_map(char::to_lowercase)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slugs_are_githubs() {
        assert_eq!(slug("`acp-host run`"), "acp-host-run");
        assert_eq!(
            slug("A remote agent over HTTP/WebSocket: `acp-host serve`"),
            "a-remote-agent-over-httpwebsocket-acp-host-serve"
        );
        assert_eq!(slug("Gathering: `--merge`"), "gathering---merge");
        assert_eq!(
            slug("Start-time capabilities: persona, model, tools"),
            "start-time-capabilities-persona-model-tools"
        );
        assert_eq!(
            slug("The `acp-host/start` extension"),
            "the-acp-hoststart-extension"
        );
        assert_eq!(slug("See [the guide](guide.md) here"), "see-the-guide-here");
        assert_eq!(slug("snake_case and Ünïcode"), "snake_case-and-ünïcode");
    }

    #[test]
    fn repeated_headings_and_html_ids_are_anchors_and_code_is_not() {
        let text = "# Title\n## Notes\n## Notes\n<a id=\"here\"></a>\n```sh\n# not a heading\n```\n\
                    `~` is not a fence\n## After\n";
        let anchors = headings(text);
        for anchor in ["title", "notes", "notes-1", "here", "after"] {
            assert!(anchors.contains(anchor), "{anchor}: {anchors:?}");
        }
        assert!(!anchors.contains("not-a-heading"));
    }

    #[test]
    fn links_are_found_outside_code_only() {
        let text = "See [a](a.md#x) and [`b`](b/) (or [c](<c d.md> \"title\")).\n\
                    `[no](code.md)` and\n```\n[no](fence.md)\n```\n[ref]: r.md#y\n\
                    ![img](i.png) [web](https://example.com/(x))\n";
        let found: Vec<(usize, String)> = links(text);
        let targets: Vec<&str> = found.iter().map(|(_, target)| target.as_str()).collect();
        assert_eq!(
            targets,
            [
                "a.md#x",
                "b/",
                "c d.md",
                "r.md#y",
                "i.png",
                "https://example.com/(x)"
            ]
        );
        assert_eq!(found[3].0, 6);
    }

    #[test]
    fn a_broken_link_is_reported_with_its_file_line_and_target() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("docs")).unwrap();
        std::fs::write(dir.path().join("schemas.json"), "{}").unwrap();
        let readme = dir.path().join("README.md");
        std::fs::write(
            &readme,
            "# Top\n\n## Part one\n\n[ok](docs/page.md#kept) [ok](#part-one) [ok](schemas.json)\n\
             [ok](https://nowhere.invalid/x#y) [ok](./docs/../README.md#top)\n\
             [bad](docs/gone.md) [bad](#part-two)\n\
             [bad](docs/page.md#lost)\n",
        )
        .unwrap();
        let page = dir.path().join("docs/page.md");
        std::fs::write(
            &page,
            "# Page\n\n## Kept\n\n[up](../README.md#part-one) [bad](../README#top)\n",
        )
        .unwrap();
        let broken = check(&[readme.clone(), page.clone()]);
        let found: Vec<(PathBuf, usize, &str)> = broken
            .iter()
            .map(|broken| (broken.file.clone(), broken.line, broken.target.as_str()))
            .collect();
        assert_eq!(
            found,
            [
                (readme.clone(), 7, "docs/gone.md"),
                (readme.clone(), 7, "#part-two"),
                (readme.clone(), 8, "docs/page.md#lost"),
                (page.clone(), 5, "../README#top"),
            ]
        );
        assert!(
            broken[2]
                .to_string()
                .contains("README.md:8: (docs/page.md#lost) no heading #lost in "),
            "{}",
            broken[2]
        );
        assert!(
            check(&[dir.path().join("missing.md")])[0]
                .problem
                .starts_with("cannot read it")
        );
    }
}
