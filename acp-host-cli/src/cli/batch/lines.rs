//! What a batch holds of its input once it is read, in memory that does not grow with the input:
//!
//! - [`Pending`]: the lines, kept as their text (each is parsed again as it starts), in memory up
//!   to [`SPOOL_IN_MEMORY`] bytes, then in an unnamed temporary file;
//! - [`Ids`]: a 12-byte key of each line's id, to refuse a repeated one before anything starts,
//!   in a table of up to [`IDS_IN_MEMORY`] keys, then as sorted runs in another unnamed temporary
//!   file, merged once the whole input is read;
//! - [`Done`]: the keys of the ids `--skip-done`'s results file has completed, sorted in one
//!   array (12 bytes a record: a hash set of them took two to three times as much, and more while
//!   it grew) with a directory of where each 16-bit prefix starts, so a look-up is one or two
//!   cache misses (the keys are SHA-256 prefixes, spread evenly), not a binary search's twenty.
//!
//! Both tables hash their keys with [`KeyHasher`]: a key is already a digest, so its first 8
//! bytes are the hash (the default `SipHash` was a tenth of a large batch's reading).
//!
//! What grows with the input is disk: about its bytes for the lines, 20 bytes a line for the keys
//! beyond the first [`IDS_IN_MEMORY`]. The temporary files are made in `TMPDIR` (by `tempfile`:
//! created unlinked, readable only by their owner) and are gone with the process, however it ends.

use std::collections::{BinaryHeap, HashMap};
use std::fs::File;
use std::hash::{BuildHasherDefault, Hasher};
use std::io::{self, BufRead, BufReader, BufWriter, Seek, Write};
use std::os::unix::fs::FileExt;

use protocol::batch::{self, BatchLine};
use tempfile::SpooledTempFile;

/// The lines' bytes a batch keeps in memory before it moves them to a temporary file: short
/// inputs never touch the disk.
pub(super) const SPOOL_IN_MEMORY: usize = 1 << 20;

/// The ids' keys a batch keeps in a table before it writes them out as a sorted run (about
/// 2.5 MiB of table at most). A repeated id within one table's lines is found as it is read; one
/// across two is found once the whole input is read.
pub(super) const IDS_IN_MEMORY: usize = 1 << 16;

/// The key a line's id is remembered by: the first 12 bytes of its SHA-256 digest, whatever the
/// id's length. Two different ids share one with a probability of about n^2 / 2^97: nil for any
/// input that fits on a disk.
pub(super) type IdKey = [u8; 12];

pub(super) fn id_key(id: &str) -> IdKey {
    use sha2::Digest as _;
    let digest = sha2::Sha256::digest(id.as_bytes());
    let mut key = [0; 12];
    key.copy_from_slice(&digest[..12]);
    key
}

/// The hasher of tables keyed by an [`IdKey`]: the key's first 8 bytes (a digest's, so evenly
/// spread already).
#[derive(Debug, Default, Clone, Copy)]
pub(super) struct KeyHasher(u64);

impl Hasher for KeyHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        // An array hashes its length first (`write_usize`), then its bytes: only those count.
        for &byte in bytes.iter().take(8) {
            self.0 = (self.0 << 8) | u64::from(byte);
        }
    }

    fn write_usize(&mut self, _length: usize) {}
}

/// A table keyed by [`IdKey`]s.
type KeyMap<V> = HashMap<IdKey, V, BuildHasherDefault<KeyHasher>>;

/// Bits of a key's prefix [`Done`]'s directory is indexed by, at most.
const DIRECTORY_BITS: u32 = 16;

/// The keys of the completed ids of a results file, sorted: a line is done when its key is
/// among them. `starts[p]` is the index of the first key whose top `bits` bits are `p` or more
/// (one entry more than prefixes: the end), so a look-up searches only its prefix's few keys.
#[derive(Debug, Default)]
pub(super) struct Done {
    keys: Vec<IdKey>,
    starts: Vec<usize>,
    bits: u32,
}

impl Done {
    /// The set of `keys` (in any order, repeats allowed: a resumed batch's file may complete an
    /// id twice).
    pub(super) fn new(mut keys: Vec<IdKey>) -> Self {
        keys.sort_unstable();
        keys.dedup();
        keys.shrink_to_fit();
        // About 8 keys a prefix: the directory stays well below the keys' own size.
        let bits = (usize::BITS - (keys.len() / 8).leading_zeros()).min(DIRECTORY_BITS);
        let mut starts = Vec::with_capacity((1 << bits) + 1);
        let mut at = 0;
        for prefix in 0..=(1_usize << bits) {
            while at < keys.len() && Self::prefix(&keys[at], bits) < prefix {
                at += 1;
            }
            starts.push(at);
        }
        Done { keys, starts, bits }
    }

    fn prefix(key: &IdKey, bits: u32) -> usize {
        usize::from(u16::from_be_bytes([key[0], key[1]])) >> (DIRECTORY_BITS - bits)
    }

    pub(super) fn contains(&self, key: &IdKey) -> bool {
        let prefix = Self::prefix(key, self.bits);
        let (Some(&from), Some(&to)) = (self.starts.get(prefix), self.starts.get(prefix + 1))
        else {
            return false;
        };
        self.keys[from..to].binary_search(key).is_ok()
    }
}

/// The input's lines, as their text. Each kept line is one spool line: `r<number>\t<text>` for a
/// line this batch runs, `s<number>\t<id as JSON>` for one it skips (another worker's shard, or
/// already done): the id is all an error may need of it.
pub(super) struct Pending {
    spool: BufWriter<SpooledTempFile>,
    /// How many lines this batch runs.
    runs: usize,
}

impl Pending {
    pub(super) fn new(in_memory: usize) -> Self {
        Pending {
            spool: BufWriter::new(SpooledTempFile::new(in_memory)),
            runs: 0,
        }
    }

    /// Keeps line `number` (its text, trimmed) to run it.
    pub(super) fn push(&mut self, number: usize, text: &str) -> io::Result<()> {
        writeln!(self.spool, "r{number}\t{}", text.trim())?;
        self.runs += 1;
        Ok(())
    }

    /// Keeps only the id of line `number`, which this batch does not run.
    pub(super) fn skip(&mut self, number: usize, id: &str) -> io::Result<()> {
        let id = serde_json::to_string(id).map_err(io::Error::other)?;
        writeln!(self.spool, "s{number}\t{id}")
    }

    /// How many lines this batch runs.
    pub(super) fn len(&self) -> usize {
        self.runs
    }

    /// The spool, read from its start.
    fn into_reader(self) -> io::Result<BufReader<SpooledTempFile>> {
        let mut spool = self
            .spool
            .into_inner()
            .map_err(io::IntoInnerError::into_error)?;
        spool.rewind()?;
        Ok(BufReader::new(spool))
    }

    /// The lines to run, parsed again, in input order. Each was parsed and checked when it was
    /// read, so an error here is that line's `not-started` record. Reading the spool back can
    /// only fail if the temporary file's disk does: that ends the lines with one error without an
    /// id, for the lines left cannot be named.
    pub(super) fn lines(self) -> Lines {
        Lines {
            reader: self.into_reader().map_err(|err| Some(read_back(&err))),
            line: String::new(),
        }
    }

    /// The id of line `number`, for the error naming a repeated one.
    pub(super) fn id_of(self, number: u64) -> Option<String> {
        let reader = self.into_reader().ok()?;
        reader.lines().map_while(Result::ok).find_map(|line| {
            let (kind, rest) = line.split_at_checked(1)?;
            let (n, text) = rest.split_once('\t')?;
            if n.parse::<u64>().ok()? != number {
                return None;
            }
            match kind {
                "r" => Some(
                    batch::parse_line(usize::try_from(number).ok()?, text)?
                        .ok()?
                        .id,
                ),
                _ => serde_json::from_str(text).ok(),
            }
        })
    }
}

fn read_back(err: &io::Error) -> String {
    format!("cannot read the batch's lines back from its temporary file: {err}")
}

/// [`Pending::lines`]: each line to run, or `(id, error)` for its `not-started` record.
pub(super) struct Lines {
    /// `Err(Some(..))`: the error to give once; `Err(None)`: given, the lines are over.
    reader: Result<BufReader<SpooledTempFile>, Option<String>>,
    line: String,
}

impl Iterator for Lines {
    type Item = Result<BatchLine, (String, String)>;

    fn next(&mut self) -> Option<Self::Item> {
        loop {
            let reader = match &mut self.reader {
                Ok(reader) => reader,
                Err(error) => return error.take().map(|error| Err((String::new(), error))),
            };
            self.line.clear();
            match reader.read_line(&mut self.line) {
                Ok(0) => {
                    self.reader = Err(None);
                    return None;
                }
                Ok(_) => {}
                Err(err) => {
                    self.reader = Err(Some(read_back(&err)));
                    continue;
                }
            }
            let Some(rest) = self.line.strip_prefix('r') else {
                continue;
            };
            let (number, text) = rest.trim_end().split_once('\t').unwrap_or((rest, ""));
            let parsed = number
                .parse()
                .ok()
                .and_then(|number| batch::parse_line(number, text));
            return Some(match parsed {
                Some(Ok(line)) => Ok(line),
                Some(Err(err)) => Err((number.to_owned(), err.to_string())),
                None => Err((number.to_owned(), format!("line {number} is blank"))),
            });
        }
    }
}

/// A line whose id an earlier line already has.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Repeat {
    /// The first line with the id.
    pub(super) first: u64,
    /// The line repeating it.
    pub(super) line: u64,
}

/// Every line's id key, to refuse a repeated id.
pub(super) struct Ids {
    /// The keys of the lines read since the last run was written, each with its line's number.
    recent: KeyMap<u64>,
    /// How many keys `recent` holds at most.
    in_memory: usize,
    /// The sorted runs, one after another, each `(offset, keys)`, once `recent` filled once.
    runs: Vec<(u64, u64)>,
    file: Option<File>,
}

/// A key and its line's number, as a run holds them.
const RECORD: usize = 12 + 8;

/// Records read at once from each run while the runs are merged.
const MERGE_BUFFER: usize = 128;

impl Ids {
    pub(super) fn new(in_memory: usize) -> Self {
        Ids {
            recent: KeyMap::default(),
            in_memory: in_memory.max(1),
            runs: Vec::new(),
            file: None,
        }
    }

    /// Remembers line `number`'s id. A repeat of a line read since the last run was written is
    /// found here; one of an earlier line, by [`Ids::finish`].
    pub(super) fn insert(&mut self, key: IdKey, number: u64) -> io::Result<Option<Repeat>> {
        if let Some(&first) = self.recent.get(&key) {
            return Ok(Some(Repeat {
                first,
                line: number,
            }));
        }
        if self.recent.len() == self.in_memory {
            self.write_run()?;
        }
        self.recent.insert(key, number);
        Ok(None)
    }

    /// Writes `recent` out, sorted, as one more run.
    fn write_run(&mut self) -> io::Result<()> {
        let mut keys: Vec<(IdKey, u64)> = self.recent.drain().collect();
        keys.sort_unstable();
        let file = match &mut self.file {
            Some(file) => file,
            None => self.file.insert(tempfile::tempfile()?),
        };
        let offset = file.stream_position()?;
        let mut out = BufWriter::new(&mut *file);
        for (key, number) in &keys {
            out.write_all(key)?;
            out.write_all(&number.to_le_bytes())?;
        }
        out.flush()?;
        self.runs.push((offset, keys.len() as u64));
        Ok(())
    }

    /// Once every line is read: the earliest line repeating an earlier line's id, if any.
    pub(super) fn finish(mut self) -> io::Result<Option<Repeat>> {
        if self.runs.is_empty() {
            return Ok(None);
        }
        self.write_run()?;
        let Some(file) = &self.file else {
            return Ok(None);
        };
        let mut runs: Vec<Run<'_>> = self
            .runs
            .iter()
            .map(|&(offset, keys)| Run::new(file, offset, keys))
            .collect();
        // The smallest (key, line) first: a key's lines come together, in input order.
        let mut heap = BinaryHeap::new();
        for (index, run) in runs.iter_mut().enumerate() {
            if let Some((key, number)) = run.next()? {
                heap.push(std::cmp::Reverse((key, number, index)));
            }
        }
        let mut group: Option<(IdKey, u64)> = None;
        let mut earliest: Option<Repeat> = None;
        while let Some(std::cmp::Reverse((key, number, index))) = heap.pop() {
            match group {
                Some((group_key, first)) if group_key == key => {
                    if earliest.is_none_or(|repeat| number < repeat.line) {
                        earliest = Some(Repeat {
                            first,
                            line: number,
                        });
                    }
                }
                _ => group = Some((key, number)),
            }
            if let Some((key, number)) = runs[index].next()? {
                heap.push(std::cmp::Reverse((key, number, index)));
            }
        }
        Ok(earliest)
    }
}

/// One sorted run of [`Ids`], read a few records at a time (one file for all runs: no file
/// descriptor per run).
struct Run<'a> {
    file: &'a File,
    offset: u64,
    left: u64,
    buffer: Vec<u8>,
    at: usize,
}

impl<'a> Run<'a> {
    fn new(file: &'a File, offset: u64, keys: u64) -> Self {
        Run {
            file,
            offset,
            left: keys,
            buffer: Vec::new(),
            at: 0,
        }
    }

    fn next(&mut self) -> io::Result<Option<(IdKey, u64)>> {
        if self.at == self.buffer.len() {
            if self.left == 0 {
                return Ok(None);
            }
            let records =
                usize::try_from(self.left).map_or(MERGE_BUFFER, |left| left.min(MERGE_BUFFER));
            self.buffer.resize(records * RECORD, 0);
            self.file.read_exact_at(&mut self.buffer, self.offset)?;
            self.offset += self.buffer.len() as u64;
            self.left -= records as u64;
            self.at = 0;
        }
        let record = &self.buffer[self.at..self.at + RECORD];
        self.at += RECORD;
        let mut key = [0; 12];
        key.copy_from_slice(&record[..12]);
        let mut number = [0; 8];
        number.copy_from_slice(&record[12..]);
        Ok(Some((key, u64::from_le_bytes(number))))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The earliest repeat, the plain way: every id in one table.
    fn earliest_repeat(ids: &[u8]) -> Option<Repeat> {
        let mut first_lines = HashMap::new();
        ids.iter().zip(1..).find_map(|(id, line)| {
            let first = *first_lines.entry(id).or_insert(line);
            (first != line).then_some(Repeat { first, line })
        })
    }

    /// What [`Ids`] holding `in_memory` keys says of `ids`: a repeat found while reading ends the
    /// reading, as it ends `read_lines`.
    fn found(ids: &[u8], in_memory: usize) -> Option<Repeat> {
        let mut seen = Ids::new(in_memory);
        for (id, line) in ids.iter().zip(1..) {
            if let Some(repeat) = seen.insert(id_key(&id.to_string()), line).unwrap() {
                return Some(repeat);
            }
        }
        seen.finish().unwrap()
    }

    proptest! {
        #[test]
        fn every_repeat_is_found_in_any_table_size(
            ids in proptest::collection::vec(any::<u8>(), 0..400),
            in_memory in 1_usize..40,
        ) {
            let expected = earliest_repeat(&ids);
            let got = found(&ids, in_memory);
            // Found while reading, a repeat within one table's lines ends the reading at once,
            // possibly before an earlier line's repeat across tables is seen, and names the
            // table's first line with the id: any repeat is then a true one, and the same input
            // always gives the same one. Within one table, it is the earliest.
            match (expected, got) {
                (None, got) => prop_assert_eq!(got, None),
                (Some(_), None) => prop_assert!(false, "a repeat was missed"),
                (Some(expected), Some(repeat)) => {
                    let id = |line: u64| ids[usize::try_from(line).unwrap() - 1];
                    prop_assert!(repeat.first < repeat.line);
                    prop_assert_eq!(id(repeat.first), id(repeat.line));
                    prop_assert_eq!(found(&ids, in_memory), Some(repeat));
                    if ids.len() <= in_memory {
                        prop_assert_eq!(repeat, expected);
                    }
                }
            }
        }
    }

    #[test]
    fn done_holds_exactly_the_keys_it_was_given_in_any_order_with_repeats() {
        let keys: Vec<IdKey> = ["c", "a", "b", "a"].iter().map(|id| id_key(id)).collect();
        let done = Done::new(keys);
        for id in ["a", "b", "c"] {
            assert!(done.contains(&id_key(id)), "{id}");
        }
        assert!(!done.contains(&id_key("d")));
        assert!(!Done::default().contains(&id_key("a")));
        assert!(!Done::new(Vec::new()).contains(&id_key("a")));
    }

    proptest! {
        #[test]
        fn done_finds_every_key_it_holds_and_no_other_at_any_size(
            held in proptest::collection::vec(any::<u32>(), 0..3000),
            other in proptest::collection::vec(any::<u32>(), 0..200),
        ) {
            let key = |n: &u32| id_key(&n.to_string());
            let done = Done::new(held.iter().map(key).collect());
            for n in &held {
                prop_assert!(done.contains(&key(n)));
            }
            for n in other.iter().filter(|n| !held.contains(n)) {
                prop_assert!(!done.contains(&key(n)));
            }
        }
    }

    #[test]
    fn the_key_hasher_takes_a_keys_first_eight_bytes() {
        use std::hash::{BuildHasher as _, Hash as _};
        let key = id_key("a");
        let mut hasher = KeyHasher::default();
        key.hash(&mut hasher);
        let expected = u64::from_be_bytes(key[..8].try_into().unwrap());
        assert_eq!(hasher.finish(), expected);
        assert_eq!(
            BuildHasherDefault::<KeyHasher>::default().hash_one(key),
            expected
        );
    }

    #[test]
    fn a_repeat_across_tables_is_the_earliest_line_repeating_an_earlier_id() {
        // Tables of 2: [a b] [c d] [e b] [a]: line 6 repeats line 2, line 7 line 1.
        let ids = [b'a', b'b', b'c', b'd', b'e', b'b', b'a'];
        assert_eq!(found(&ids, 2), Some(Repeat { first: 2, line: 6 }));
        assert_eq!(found(&ids, 100), Some(Repeat { first: 2, line: 6 }));
        assert_eq!(found(&ids[..5], 2), None);
    }

    #[test]
    fn lines_come_back_in_order_from_memory_and_from_the_temporary_file() {
        for in_memory in [1 << 20, 64] {
            let mut pending = Pending::new(in_memory);
            let mut expected = Vec::new();
            for number in 1..=50 {
                let id = format!("id \"{number}\"\n");
                if number % 3 == 0 {
                    pending.skip(number, &id).unwrap();
                } else {
                    let text = serde_json::json!({"id": id, "prompt": "p\tq"}).to_string();
                    pending.push(number, &format!("  {text} ")).unwrap();
                    expected.push(id);
                }
            }
            assert_eq!(pending.len(), expected.len());
            let got: Vec<String> = pending.lines().map(|line| line.unwrap().id).collect();
            assert_eq!(got, expected, "in memory up to {in_memory} bytes");
        }
    }

    #[test]
    fn the_id_of_a_line_is_found_whether_it_runs_or_not() {
        let id_of = |number| {
            let mut pending = Pending::new(16);
            let named = serde_json::json!({"id": "one", "prompt": "p"}).to_string();
            pending.push(1, &named).unwrap();
            pending.skip(2, "two\t2").unwrap();
            pending.push(3, r#"{"prompt":"p"}"#).unwrap();
            pending.id_of(number)
        };
        assert_eq!(id_of(1).as_deref(), Some("one"));
        assert_eq!(id_of(2).as_deref(), Some("two\t2"));
        assert_eq!(id_of(3).as_deref(), Some("3"));
        assert_eq!(id_of(4), None);
    }
}
