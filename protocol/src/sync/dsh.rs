//! The DSH shared file (`.dsh/cordis.patch.yml`): locating its top-level items with a real YAML
//! parser's positions, and splicing new, replaced or removed items into the original bytes.
//!
//! Invariants:
//! - One pass of `saphyr-parser` events over the file finds every item (linear in the file size).
//! - An item spans from the line of its `-` indicator to the end of the line holding its last
//!   content; comments and blank lines between items belong to no item, so they survive edits of
//!   their neighbours byte-for-byte, and so does every item we do not edit.
//! - An item is *managed* for subagent `n` only when its `id` is `acp-host-subagent-<n>` and the
//!   marker comment for `n` is the first line after the `id` entry. A comment is only ever seen
//!   between parser events, so a persona quoting the marker (or containing `id:` lines) cannot make
//!   an item look managed or hide it.
//! - Anything but a single block list at column 0 (a mapping, a scalar, a flow list, an empty or
//!   comment-only file, several documents) is an error: we never guess where to append.

use std::collections::BTreeMap;

use saphyr_parser::{Event, Marker, Parser, Span};

use super::render::{DSH_ID_PREFIX, DSH_PLUGIN, marker};

/// Why the shared file cannot be edited safely.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DshError {
    #[error("is not UTF-8 text")]
    NotUtf8,
    #[error(
        "uses bare CR line endings or a byte-order mark; save it as UTF-8 with LF line endings"
    )]
    Encoding,
    #[error("is not valid YAML (line {line}: {message}); fix it or move it away")]
    Yaml { line: usize, message: String },
    #[error(
        "is empty or holds only comments; it must be a YAML list: delete the file or add an item"
    )]
    Empty,
    #[error("is not a YAML list (its top level is {found}); acp-host only appends items to a list")]
    NotAList { found: &'static str },
    #[error("is a flow-style list (`[...]`); rewrite it as a block list (`- item` lines)")]
    FlowList,
    #[error("its top-level list is indented; start its `-` items at column 0")]
    Indented,
    #[error("holds several YAML documents; keep one list in it")]
    MultipleDocuments,
    #[error("has an item at line {line} whose layout acp-host cannot locate; fix its indentation")]
    Layout { line: usize },
    #[error(
        "has a YAML document marker or directive at line {line} (`...` or `%`); remove that line so items can be added at the end"
    )]
    DocumentMarker { line: usize },
}

/// One top-level item of the list.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Item {
    /// Byte range `start..end` in the file: from the start of the `-` line to after the newline
    /// ending the item's last content line (or the end of the file).
    pub start: usize,
    pub end: usize,
    /// 1-based line of the `-` indicator, for messages.
    pub line: usize,
    /// The item's `id`, when it is a mapping with a scalar `id`.
    pub id: Option<String>,
    /// The item's `name` is the DSH subagent plugin.
    pub plugin: bool,
    /// `config.toolName`, when present.
    pub tool_name: Option<String>,
    /// The marker for the subagent named by our id sits right after the `id` entry.
    pub managed: bool,
}

impl Item {
    /// The subagent our id names (`acp-host-subagent-<n>` -> `n`).
    #[must_use]
    pub fn our_name(&self) -> Option<&str> {
        self.id.as_deref()?.strip_prefix(DSH_ID_PREFIX)
    }

    /// Whether the item stands for subagent `name`: our id, or the subagent plugin with that
    /// `toolName` (an item the user wrote by hand for the same tool).
    #[must_use]
    pub fn claims(&self, name: &str) -> bool {
        self.claimed_names().contains(&name)
    }

    /// Every subagent the item stands for (at most two: by id, by plugin toolName).
    #[must_use]
    pub fn claimed_names(&self) -> Vec<&str> {
        let by_id = self.our_name();
        let by_tool = self.tool_name.as_deref().filter(|_| self.plugin);
        let mut names: Vec<&str> = by_id.into_iter().chain(by_tool).collect();
        names.dedup();
        names
    }

    /// Whether we own the item as subagent `name`'s block.
    #[must_use]
    pub fn managed_for(&self, name: &str) -> bool {
        self.managed && self.our_name() == Some(name)
    }
}

/// Converts parser markers (line, column in characters) to byte offsets.
struct Offsets<'a> {
    text: &'a str,
    line_starts: Vec<usize>,
}

impl<'a> Offsets<'a> {
    fn new(text: &'a str) -> Self {
        let mut line_starts = vec![0];
        line_starts.extend(text.match_indices('\n').map(|(i, _)| i + 1));
        Offsets { text, line_starts }
    }

    /// The parser marks no line past the last one; such a marker would count from its start.
    fn byte(&self, mark: Marker) -> usize {
        let last = self.line_starts.len() - 1;
        let start = self.line_starts[mark.line().saturating_sub(1).min(last)];
        let line = &self.text[start..];
        let col = line
            .char_indices()
            .nth(mark.col())
            .map_or(line.len(), |(i, _)| i);
        start + col
    }

    /// The 1-based line holding `byte` (binary search: the locator stays linear).
    fn line_number(&self, byte: usize) -> usize {
        self.line_starts.partition_point(|&start| start <= byte)
    }

    fn line_start(&self, byte: usize) -> usize {
        self.text[..byte].rfind('\n').map_or(0, |i| i + 1)
    }

    /// The end of the line holding `byte` (after its newline, or the end of the text).
    fn line_end(&self, byte: usize) -> usize {
        self.text[byte..]
            .find('\n')
            .map_or(self.text.len(), |i| byte + i + 1)
    }
}

/// Which key of which mapping a node is the value of.
enum Frame {
    Seq,
    Map {
        expect_key: bool,
        key: Option<String>,
    },
}

/// An item being read.
#[derive(Default)]
struct Draft {
    first: usize,
    content_end: usize,
    id: Option<String>,
    id_end: Option<usize>,
    after_id: Option<usize>,
    plugin: bool,
    tool_name: Option<String>,
}

/// Locates every top-level item of the shared file in one pass.
pub fn locate(bytes: &[u8]) -> Result<Vec<Item>, DshError> {
    let text = std::str::from_utf8(bytes).map_err(|_| DshError::NotUtf8)?;
    if text.starts_with('\u{FEFF}') || text.replace("\r\n", "").contains('\r') {
        return Err(DshError::Encoding);
    }
    // Appending after a `...` document end, or below directives, would make a second document.
    if let Some(line) = text
        .split('\n')
        .position(|l| l.trim_end() == "..." || l.starts_with('%'))
    {
        return Err(DshError::DocumentMarker { line: line + 1 });
    }
    let offsets = Offsets::new(text);
    let mut parser = Parser::new_from_str(text);
    let mut stack: Vec<Frame> = Vec::new();
    let mut drafts: Vec<Draft> = Vec::new();
    let mut documents = 0;
    let mut root_seen = false;
    while let Some(next) = parser.next_event() {
        let (event, span) = next.map_err(|e| DshError::Yaml {
            line: e.marker().line(),
            message: e.info().to_owned(),
        })?;
        let start = offsets.byte(span.start);
        // The first event after an item's `id` value closes the gap that may hold the marker.
        if let Some(draft) = drafts.last_mut()
            && draft.id_end.is_some()
            && draft.after_id.is_none()
        {
            draft.after_id = Some(start);
        }
        match event {
            Event::StreamStart | Event::StreamEnd | Event::Nothing | Event::DocumentEnd => {}
            Event::DocumentStart(_) => {
                documents += 1;
                if documents > 1 {
                    return Err(DshError::MultipleDocuments);
                }
            }
            Event::SequenceStart(..) | Event::MappingStart(..) if stack.is_empty() => {
                root_seen = true;
                check_root(&event, span, text, start)?;
                stack.push(Frame::Seq);
            }
            Event::Scalar(..) | Event::Alias(_) if stack.is_empty() => {
                return Err(DshError::NotAList { found: "a scalar" });
            }
            Event::SequenceEnd | Event::MappingEnd => {
                stack.pop();
                if let Some(draft) = drafts.last_mut().filter(|_| !stack.is_empty())
                    && !span.is_empty()
                {
                    draft.content_end = draft.content_end.max(offsets.byte(span.end));
                }
                value_done(&mut stack);
            }
            // Only node events reach `note_node` (the match is exhaustive, with no catch-all).
            event @ (Event::Scalar(..)
            | Event::Alias(_)
            | Event::SequenceStart(..)
            | Event::MappingStart(..)) => {
                if stack.len() == 1 {
                    drafts.push(Draft {
                        first: start,
                        ..Draft::default()
                    });
                }
                let draft = drafts.last_mut().expect("an item is open below the root");
                if !span.is_empty() {
                    draft.content_end = draft.content_end.max(offsets.byte(span.end));
                }
                note_node(&event, span, &offsets, &mut stack, draft);
            }
        }
    }
    if !root_seen {
        return Err(DshError::Empty);
    }
    let mut items = Vec::with_capacity(drafts.len());
    let mut previous_end = 0;
    for draft in drafts {
        let item = finish(draft, text, &offsets, previous_end)?;
        previous_end = item.end;
        items.push(item);
    }
    Ok(items)
}

fn check_root(event: &Event<'_>, span: Span, text: &str, start: usize) -> Result<(), DshError> {
    match event {
        Event::MappingStart(..) => Err(DshError::NotAList { found: "a mapping" }),
        _ if text[start..].starts_with('[') => Err(DshError::FlowList),
        _ if span.start.col() != 0 => Err(DshError::Indented),
        _ => Ok(()),
    }
}

/// A value finished: the enclosing mapping expects a key again.
fn value_done(stack: &mut [Frame]) {
    if let Some(Frame::Map { expect_key, key }) = stack.last_mut() {
        if *expect_key {
            // A complex (collection) key finished; its value follows.
            *expect_key = false;
            *key = None;
        } else {
            *expect_key = true;
            *key = None;
        }
    }
}

/// Records what a node (scalar, alias, collection start) tells about the current item.
fn note_node(
    event: &Event<'_>,
    span: Span,
    offsets: &Offsets<'_>,
    stack: &mut Vec<Frame>,
    draft: &mut Draft,
) {
    let depth = stack.len();
    // The key of the item-level mapping whose value we are inside (`config` for toolName).
    let item_key = match stack.get(1) {
        Some(Frame::Map { key, .. }) if depth == 3 => key.clone(),
        _ => None,
    };
    let role_key = match stack.last() {
        Some(Frame::Map {
            expect_key: false,
            key,
        }) => Some(key.clone()),
        _ => None,
    };
    match event {
        Event::Scalar(value, ..) => {
            if let Some(Frame::Map { expect_key, key }) = stack.last_mut()
                && *expect_key
            {
                *key = Some(value.to_string());
                *expect_key = false;
                return;
            }
            match (depth, role_key.flatten().as_deref(), item_key.as_deref()) {
                (2, Some("id"), _) => {
                    draft.id = Some(value.to_string());
                    draft.id_end = Some(offsets.byte(span.end));
                }
                (2, Some("name"), _) => draft.plugin = value == DSH_PLUGIN,
                (3, Some("toolName"), Some("config")) => draft.tool_name = Some(value.to_string()),
                _ => {}
            }
            value_done(stack);
        }
        Event::Alias(_) => {
            if let Some(Frame::Map { expect_key, key }) = stack.last_mut()
                && *expect_key
            {
                *key = None;
                *expect_key = false;
                return;
            }
            value_done(stack);
        }
        Event::MappingStart(..) => stack.push(Frame::Map {
            expect_key: true,
            key: None,
        }),
        // A sequence start: `locate` passes node events only.
        _ => stack.push(Frame::Seq),
    }
}

fn finish(
    draft: Draft,
    text: &str,
    offsets: &Offsets<'_>,
    previous_end: usize,
) -> Result<Item, DshError> {
    // The `-` indicator: on the line of the item's first node, or alone on an earlier line.
    // No layout the parser accepts under a column-0 root (`check_root`) lacks it; should one,
    // the item is refused (fail closed) rather than cut in the wrong place.
    let mut line_start = offsets.line_start(draft.first);
    while !text[line_start..].starts_with('-') && line_start > previous_end && line_start > 0 {
        line_start = offsets.line_start(line_start - 1);
    }
    let layout = DshError::Layout {
        line: offsets.line_number(draft.first),
    };
    text[line_start..]
        .starts_with('-')
        .then_some(())
        .ok_or(layout)?;
    // The end: the last non-blank byte of the content, then the end of that line.
    let content_end = draft.content_end.max(draft.first);
    let last = text[..content_end].trim_end().len().max(line_start + 1);
    let end = offsets.line_end(last - 1);
    let managed = match (draft.our_name(), draft.id_end) {
        (Some(name), Some(id_end)) => {
            let gap_end = draft.after_id.unwrap_or(end).min(end).max(id_end);
            let expected = format!("# {}", marker(name));
            text[id_end..gap_end]
                .split('\n')
                .skip(1)
                .map(str::trim)
                .find(|line| !line.is_empty())
                == Some(expected.as_str())
        }
        _ => false,
    };
    Ok(Item {
        start: line_start,
        end,
        line: offsets.line_number(line_start),
        id: draft.id,
        plugin: draft.plugin,
        tool_name: draft.tool_name,
        managed,
    })
}

impl Draft {
    fn our_name(&self) -> Option<&str> {
        self.id.as_deref()?.strip_prefix(DSH_ID_PREFIX)
    }
}

/// What to do to the file: replace or remove located items (by index), append new items.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Edits {
    /// Item index -> new text (`Some`) or removal (`None`).
    pub items: BTreeMap<usize, Option<String>>,
    /// Appended after the last byte of the file, in order.
    pub appends: Vec<String>,
    /// The file ends its lines with CRLF: a newline the splice adds is CRLF too.
    pub crlf: bool,
}

/// Splices `edits` into `text` in one pass; bytes outside edited items are copied unchanged.
#[must_use]
pub fn apply(text: &str, items: &[Item], edits: &Edits) -> String {
    let mut out =
        String::with_capacity(text.len() + edits.appends.iter().map(String::len).sum::<usize>());
    let mut cursor = 0;
    for (&index, replacement) in &edits.items {
        let item = &items[index];
        out.push_str(&text[cursor..item.start]);
        if let Some(new) = replacement {
            out.push_str(new);
        }
        cursor = item.end;
    }
    out.push_str(&text[cursor..]);
    if !edits.appends.is_empty() && !out.is_empty() && !out.ends_with('\n') {
        out.push_str(if edits.crlf { "\r\n" } else { "\n" });
    }
    for new in &edits.appends {
        out.push_str(new);
    }
    out
}

/// The item's bytes, with the newline that ends it (an item at the end of a file without a final
/// newline compares equal to its rendering).
#[must_use]
pub fn item_text(text: &str, item: &Item) -> String {
    let mut s = text[item.start..item.end].to_owned();
    if !s.ends_with('\n') {
        s.push('\n');
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn collection_and_alias_keys_do_not_hide_the_id() {
        let complex = "- ? [a, b]\n  : c\n  id: x\n- id: y\n";
        let items = locate(complex.as_bytes()).unwrap();
        assert_eq!(
            items.iter().map(|i| i.id.as_deref()).collect::<Vec<_>>(),
            [Some("x"), Some("y")]
        );
        assert_eq!(
            &complex[items[0].start..items[0].end],
            "- ? [a, b]\n  : c\n  id: x\n"
        );
        let aliased = "- k: &k id\n  *k : v\n  id: x\n";
        let items = locate(aliased.as_bytes()).unwrap();
        assert_eq!(items[0].id.as_deref(), Some("x"), "an alias key is no `id`");
        assert_eq!((items[0].start, items[0].end), (0, aliased.len()));
    }

    const SAMPLE: &str = "# leading\n- id: custom-manual\n  persona: Keep me intact\n# between\n- id: acp-host-subagent-review\n  # generated by acp-host from subagents/review.md - edits will be overwritten\n  name: '@deepseek-ai/dsh-tool-subagent'\n  config:\n    toolName: review\n    persona: |-\n      id: fake\n      name: fake\n\n  # trailing comment\n-\n  id: x\n  n: [a,\n    b]\n";

    #[test]
    fn locates_items_and_their_extents() {
        let items = locate(SAMPLE.as_bytes()).unwrap();
        assert_eq!(items.len(), 3);
        assert_eq!(
            &SAMPLE[items[0].start..items[0].end],
            "- id: custom-manual\n  persona: Keep me intact\n"
        );
        assert_eq!(items[0].id.as_deref(), Some("custom-manual"));
        assert!(!items[0].managed);
        let review = &SAMPLE[items[1].start..items[1].end];
        assert!(review.starts_with("- id: acp-host-subagent-review\n"));
        assert!(review.ends_with("      name: fake\n"), "{review:?}");
        assert!(items[1].managed && items[1].plugin);
        assert_eq!(items[1].tool_name.as_deref(), Some("review"));
        assert!(items[1].claims("review") && items[1].managed_for("review"));
        assert_eq!(
            &SAMPLE[items[2].start..items[2].end],
            "-\n  id: x\n  n: [a,\n    b]\n"
        );
        assert_eq!(items[2].line, 15);
    }

    #[test]
    fn marker_in_a_persona_does_not_manage() {
        let text = "- id: acp-host-subagent-a\n  name: x\n  persona: |-\n    # generated by acp-host from subagents/a.md - edits will be overwritten\n";
        let items = locate(text.as_bytes()).unwrap();
        assert!(!items[0].managed);
        let marker_for_other = "- id: acp-host-subagent-a\n  # generated by acp-host from subagents/b.md - edits will be overwritten\n  name: x\n";
        assert!(!locate(marker_for_other.as_bytes()).unwrap()[0].managed);
    }

    #[test]
    fn refuses_what_is_not_a_block_list() {
        let cases: [(&str, DshError); 8] = [
            ("", DshError::Empty),
            ("# only a comment\n\n", DshError::Empty),
            ("key: value\n", DshError::NotAList { found: "a mapping" }),
            ("just text\n", DshError::NotAList { found: "a scalar" }),
            ("[a, b]\n", DshError::FlowList),
            ("  - a\n  - b\n", DshError::Indented),
            ("- a\n---\n- b\n", DshError::MultipleDocuments),
            ("- a\r- b\n", DshError::Encoding),
        ];
        for (text, expected) in cases {
            assert_eq!(locate(text.as_bytes()).unwrap_err(), expected, "{text:?}");
        }
        assert!(matches!(locate(b"- [a\n"), Err(DshError::Yaml { .. })));
    }

    #[test]
    fn apply_keeps_everything_else() {
        let items = locate(SAMPLE.as_bytes()).unwrap();
        let mut edits = Edits::default();
        edits.items.insert(1, Some("- id: new\n".into()));
        edits.appends.push("- id: appended\n".into());
        let out = apply(SAMPLE, &items, &edits);
        assert_eq!(
            out,
            SAMPLE.replace(&SAMPLE[items[1].start..items[1].end], "- id: new\n")
                + "- id: appended\n"
        );
        assert!(out.contains("\n  # trailing comment\n-\n  id: x"));
        let mut removal = Edits::default();
        removal.items.insert(0, None);
        let out = apply(SAMPLE, &items, &removal);
        assert!(out.starts_with("# leading\n# between\n- id: acp-host"));
    }
}
